""".tflite import: structure, layouts and named errors."""
import os

import numpy as np
import pytest

from kiln.frontend import KilnError
from kiln.frontend.tflite_import import TFLiteImportError, load_tflite


def test_imports_kws_layouts(shared_models):
    g = load_tflite(os.path.join(shared_models, "kws_ref_model.tflite"))
    ops = [n.op for n in g.nodes]
    assert ops.count("conv2d") == 9 and ops.count("dense") == 1 and ops[-1] == "softmax"
    dw = [n for n in g.nodes if n.op == "conv2d" and n.attrs["groups"] > 1]
    assert len(dw) == 4
    w = g.types[dw[0].inputs[1]]
    assert w.shape == (64, 3, 3, 1) and w.quant.axis == 0 and len(w.quant.scale) == 64
    assert g.types[g.inputs[0]].quant.zero_point == (83,)
    assert g.types[g.outputs[0]].quant.scale == (0.00390625,)


def test_rejects_non_tflite_and_truncated(tmp_path):
    with pytest.raises(TFLiteImportError, match="not a TFLite model"):
        load_tflite(b"\x10\x00\x00\x00XXXX" + b"\x00" * 64)
    with pytest.raises(TFLiteImportError, match="too short"):
        load_tflite(b"\x10\x00")
    with pytest.raises(KilnError, match="cannot read"):
        load_tflite(tmp_path / "missing.tflite")


def test_float_model_round_trip():
    """A float32 Kiln graph exported to .tflite runs in LiteRT like Kiln and imports back."""
    import kiln.frontend.module as M
    from kiln.frontend import TensorType, manual_seed, run, trace
    from kiln.quantize import export_tflite
    from tests.quantize.litert_util import litert_run
    manual_seed(0)
    net = M.Sequential(M.Conv2d(1, 4, 3, padding="same", activation="relu"), M.MaxPool2d(2),
                       M.Conv2d(4, 4, 3, padding="same", groups=4), M.Flatten(), M.Linear(4 * 4 * 4, 3))
    net.eval()
    g = trace(net, TensorType((1, 8, 8, 1)))
    data = export_tflite(g)
    x = np.random.default_rng(0).normal(size=(1, 8, 8, 1)).astype(np.float32)
    np.testing.assert_allclose(litert_run(data, [x])[0], run(g, x)[0], rtol=1e-5, atol=1e-5)
    g2 = load_tflite(data)
    assert [n.op for n in g2.nodes] == [n.op for n in g.nodes]
    np.testing.assert_allclose(run(g2, x)[0], run(g, x)[0], rtol=1e-6, atol=1e-6)


def test_zero_size_model_compiles_with_werror(tmp_path):
    """TFLite allows zero-size tensors; the generated kernel then reads none of its parameters,
    which -Wall -Wextra -Werror refused (unused parameter) in `kiln compile` for a Cortex-M."""
    import shutil

    from kiln import hil
    from kiln.backends.host import HostModel
    from kiln.frontend import run
    from tests.frontend.tflite_builder import Builder
    b = Builder("empty_batch")
    x = b.tensor("x", (0, 4), "int8", scale=0.1, zero_point=0)
    y = b.tensor("y", (0, 4), "int8", scale=0.1, zero_point=-128)
    b.op("RELU", [x], [y], None, True)
    g = load_tflite(b.build([x], [y]))
    x0 = np.zeros((0, 4), np.int8)
    if shutil.which("arm-none-eabi-gcc"):
        hil.compile_model(g, "cortex-m4", str(tmp_path / "m4"), plot=False)
    pkg = hil.compile_model(g, "host", str(tmp_path / "host"), plot=False)
    assert HostModel(pkg.path).run(x0)[0].shape == run(g, x0)[0].shape == (0, 4)
