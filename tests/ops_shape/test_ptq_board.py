"""A float model built from the data-movement and reduction ops, post-training quantised by Kiln,
exported to .tflite: LiteRT's reference kernels, Kiln's int8 reference and (slow) the mps2-an386
firmware in QEMU agree bit for bit."""
import numpy as np
import pytest

import kiln
from kiln.frontend import functional as F
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.ptq import ptq
from kiln.quantize.tflite_export import export_tflite

from .util import litert_all

SHAPE = (1, 6, 8, 4)


def _model(x):
    y = F.resize(x, (9, 12), mode="bilinear", half_pixel_centers=True)
    y = F.transpose(y, [0, 2, 1, 3])                       # (1, 12, 9, 4)
    y = F.slice(y, [0, 11, 0, 3], [1, -1, 9, -1], [1, -2, 2, -1])
    y = F.gather(y, [2, 0, 1, 3], axis=3)
    y = F.resize(y, (4, 4), mode="nearest")
    m = F.max(y, axis=[1], keepdims=True)
    s = F.mean(y, axis=[2], keepdims=True)   # SUM: LiteRT's reference kernel is not the oracle (test_litert_reduce)
    z = F.concat([F.reshape(m, (1, 4, 4)), F.reshape(s, (1, 4, 4))], axis=1)
    return F.l2_normalize(F.min(z, axis=[2], keepdims=True) + F.reshape(z, (1, 8, 4)))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    rng = np.random.default_rng(3)
    g = kiln.trace(_model, np.zeros(SHAPE, np.float32))
    calib = rng.standard_normal((64,) + SHAPE[1:]).astype(np.float32)
    qg = ptq(g, calib, int8_io=True)
    assert {n.op for n in qg.nodes} >= {"resize", "transpose", "slice", "gather", "max", "min", "l2_normalize"}
    p = tmp_path_factory.mktemp("m") / "shape_ops.tflite"
    export_tflite(qg, str(p))
    return p


def test_ptq_model_matches_litert(model_file):
    buf = model_file.read_bytes()
    g = load_tflite(buf)
    rng = np.random.default_rng(4)
    for _ in range(5):
        x = rng.integers(-128, 128, SHAPE).astype(np.int8)
        np.testing.assert_array_equal(kiln.run(g, x)[0], litert_all(buf, [x])[0])


@pytest.mark.slow
@pytest.mark.qemu
def test_ptq_model_bit_exact_on_board(model_file, tmp_path):
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    from kiln.samples import random_inputs
    gold = str(tmp_path / "g.npz")
    golden(str(model_file), gold, random_inputs(kiln.load_model(str(model_file)), 3, seed=2))
    rep = verify(str(model_file), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 3, rep["results"]
