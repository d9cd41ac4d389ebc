"""Imported models on Kiln's targets: the float imports of the five required models match torch
(.pt2) and onnxruntime (.onnx) within 1e-4 through `kiln verify --target reference` and `host`, with
golden pairs the frameworks made; their PTQ int8 versions run bit-exact against Kiln's int8
reference on mps2-an386."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from kiln.commands.verify import verify  # noqa: E402
from kiln.frontend import load_model, save  # noqa: E402
from kiln.oracles import run_oracle  # noqa: E402
from kiln.samples import golden_arrays  # noqa: E402
from tests.frontend.import_models import REQUIRED, inputs, make  # noqa: E402


def model_file(tmp_path, name, fmt):
    m, shape = make(name)
    p = str(tmp_path / f"{name}.{fmt}")
    x = torch.randn(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if fmt == "pt2":
            torch.export.save(torch.export.export(m, (x,)), p)
        else:
            torch.onnx.export(m, (x,), p, dynamo=False, opset_version=17)
    return p, shape


def framework_golden(path, shape, out, n=3):
    """Golden pairs computed by torch / onnxruntime, not by Kiln."""
    samples = [(x.numpy(),) for x in inputs(shape, n, seed=7)]
    outs = run_oracle(path, load_model(path), samples)
    np.savez(out, **golden_arrays(list(zip(samples, outs))))
    return out


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
@pytest.mark.parametrize("name", REQUIRED)
def test_float_import_verifies_on_reference(tmp_path, name, fmt):
    p, shape = model_file(tmp_path, name, fmt)
    gold = framework_golden(p, shape, str(tmp_path / "golden.npz"))
    rep = verify(p, gold, "reference", atol=1e-4)
    assert rep["ok"] and rep["matched"] == 3, rep["results"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
@pytest.mark.parametrize("name", REQUIRED)
def test_float_import_verifies_on_host(tmp_path, name, fmt):
    p, shape = model_file(tmp_path, name, fmt)
    gold = framework_golden(p, shape, str(tmp_path / "golden.npz"))
    rep = verify(p, gold, "host", atol=1e-4, options={"out": str(tmp_path / "build")})
    assert rep["ok"] and rep["matched"] == 3, rep["results"]


@pytest.mark.slow
@pytest.mark.qemu
@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
@pytest.mark.parametrize("name", REQUIRED)
def test_int8_import_bit_exact_on_board(tmp_path, name, fmt):
    from kiln.commands.golden import golden
    from kiln.quantize import ptq
    from kiln.samples import random_inputs
    p, shape = model_file(tmp_path, name, fmt)
    g = load_model(p)
    calib = np.concatenate([x.numpy() for x in inputs(shape, 16, seed=1)])
    q = ptq(g, calib, int8_io=True)
    qp = str(tmp_path / "int8.json")
    save(q, qp)
    gold = str(tmp_path / "int8_golden.npz")
    golden(qp, gold, random_inputs(q, 3, seed=3))                       # Kiln's int8 reference
    rep = verify(qp, gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 3 and rep["comparison"].startswith("bit-exact"), rep["results"]
