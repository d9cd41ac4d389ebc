"""The training step compiled with TVM for the host (kiln.step_compiler('host-llvm'), formerly
backend='tvm') or as a CUDA package matches the NumPy step."""
import numpy as np
import pytest

import kiln
from kiln.frontend.errors import KilnError
from kiln.frontend.module import manual_seed
from kiln.training import zoo
from kiln.training.step import StepGraph


@pytest.mark.parametrize("backend", ["host-llvm", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_compiled_step_matches_numpy_step(backend):
    manual_seed(0)
    entry = zoo.get("digits-cnn")
    model = entry.module
    rng = np.random.default_rng(0)
    x = rng.random((16, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, 16)
    params = {n: p.data for n, p in model.named_parameters()}
    buffers = {n: b.data for n, b in model.named_buffers()}
    ref = StepGraph(model, "cross_entropy", (8, 8, 1), 16)
    tvm = StepGraph(model, "cross_entropy", (8, 8, 1), 16, backend=kiln.step_compiler(backend))
    l0, p0, g0, u0 = ref(params, buffers, x, y)
    l1, p1, g1, u1 = tvm(params, buffers, x, y)
    assert abs(l0 - l1) <= 1e-5 * max(1.0, abs(l0))
    np.testing.assert_allclose(p1, p0, rtol=1e-5, atol=1e-5)
    for k in g0:
        np.testing.assert_allclose(g1[k], g0[k], rtol=1e-4, atol=1e-5, err_msg=k)
    for k in u0:
        np.testing.assert_allclose(u1[k], u0[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_unknown_backend_is_named():
    manual_seed(0)
    with pytest.raises(KilnError, match="unknown training backend 'gpu'"):
        StepGraph(zoo.get("digits-cnn").module, "cross_entropy", (8, 8, 1), 4, backend="gpu")


def test_cuda_training_without_a_gpu_names_what_was_found():
    import shutil
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU is present")
    manual_seed(0)
    with pytest.raises(KilnError, match="CuPy|CUDA"):
        StepGraph(zoo.get("digits-cnn").module, "cross_entropy", (8, 8, 1), 4, backend=kiln.step_compiler("cuda"))
