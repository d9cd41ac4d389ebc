"""int8 BATCH_MATMUL and TRANSPOSE_CONV in C (backends/ops_linalg.py): LiteRT's reference kernels,
Kiln's int8 reference, the host C package and (slow) the mps2-an386 firmware agree bit for bit,
across strides, paddings, per-tensor and per-channel filters, bias, fused activations, zero points
and broadcast batch dimensions."""
import numpy as np
import pytest

import kiln
from kiln.backends import compile as compile_pkg
from kiln.frontend.ops.nn import conv_geometry
from kiln.frontend.tflite_import import load_tflite
from tests.frontend.tflite_builder import Builder
from tests.quantize.litert_util import litert_run

# (oh, ow, cin, cout, k, stride, padding, bias, activation (TFLite enum), per-channel, z_x, z_out)
TCONV = [
    (6, 6, 4, 3, 3, 2, "same", True, 1, True, 5, -3),
    (7, 5, 2, 5, 3, 2, "valid", False, 0, False, -128, 127),
    (8, 8, 3, 2, 2, 2, "same", True, 3, True, 0, 10),
    (5, 7, 1, 4, 3, 1, "same", True, 0, False, 100, -100),
    (9, 9, 5, 2, 3, 3, "valid", True, 1, True, -7, 0),
]
# (a batch, b batch, m, k, n, z_a, z_b, z_out)
MATMUL = [
    ((2,), (2,), 3, 5, 4, 3, -2, 1),
    ((3, 2), (1, 1), 4, 17, 3, -128, 127, -5),
    ((), (), 1, 40, 6, 0, 0, 0),
    ((2,), (1,), 5, 8, 7, 20, -20, 64),
]


def _model(rng, tconv, mm) -> tuple[bytes, list]:
    """One .tflite with a TRANSPOSE_CONV (input x) and a BATCH_MATMUL of two activations (a, b)."""
    oh, ow, cin, cout, k, s, pad, bias, act, per_channel, zx, zo = tconv
    G = conv_geometry((1, oh, ow, cout), (cin, k, k, cout), dict(stride=[s, s], padding=pad, dilation=[1, 1], groups=1))
    b = Builder("linalg")
    sx, sw = 2.0 ** -4, 2.0 ** rng.uniform(-8, -5, cout if per_channel else 1)
    osh = b.tensor("output_shape", (4,), "int32", data=[1, oh, ow, cout])
    w = b.tensor("w", (cout, k, k, cin), "int8", data=rng.integers(-127, 128, (cout, k, k, cin)), scale=sw,
                 zero_point=[0] * len(sw), axis=0 if per_channel else None)
    x = b.tensor("x", (1, G["oh"], G["ow"], cin), "int8", scale=sx, zero_point=zx)
    ins = [osh, w, x]
    if bias:
        bs = np.float32(sx) * np.asarray(sw, np.float32)
        ins.append(b.tensor("bias", (cout,), "int32", data=rng.integers(-5000, 5000, cout), scale=bs,
                            zero_point=[0] * len(bs), axis=0 if per_channel else None))
    y = b.tensor("y", (1, oh, ow, cout), "int8", scale=float(np.float32(sx * float(np.mean(sw)) * 4)), zero_point=zo)
    b.op("TRANSPOSE_CONV", ins, [y], "TransposeConvOptions", int8=True, Padding=0 if pad == "same" else 1,
         StrideW=s, StrideH=s, FusedActivationFunction=act)
    ba, bb, m, kk, n, za, zb, zmo = mm
    ta = b.tensor("a", ba + (m, kk), "int8", scale=0.05, zero_point=za)
    tb = b.tensor("b", bb + (kk, n), "int8", scale=0.02, zero_point=zb)
    batch = tuple(np.broadcast_shapes(ba, bb))
    mo = b.tensor("mm", batch + (m, n), "int8", scale=float(np.float32(0.001 * np.sqrt(kk) * 4)), zero_point=zmo)
    b.op("BATCH_MATMUL", [ta, tb], [mo], "BatchMatMulOptions", int8=True, AdjX=False, AdjY=False)
    shapes = [(1, G["oh"], G["ow"], cin), ba + (m, kk), bb + (kk, n)]
    return b.build([x, ta, tb], [y, mo]), shapes


def _feeds(rng, shapes):
    return [rng.integers(-128, 128, s).astype(np.int8) for s in shapes]


@pytest.mark.parametrize("case", range(len(TCONV)))
def test_transpose_conv_and_batch_matmul_int8_on_host_c(tmp_path, case):
    rng = np.random.default_rng(case)
    buf, shapes = _model(rng, TCONV[case], MATMUL[case % len(MATMUL)])
    g = load_tflite(buf)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    for _ in range(3):
        feeds = _feeds(rng, shapes)
        want = litert_run(buf, feeds)
        ref = kiln.run(g, *feeds)
        got = pkg.run(*feeds)
        for w, r, c in zip(want, ref, got):
            np.testing.assert_array_equal(r, w)
            np.testing.assert_array_equal(c, w)


@pytest.mark.slow
@pytest.mark.qemu
def test_transpose_conv_and_batch_matmul_int8_on_board(tmp_path):
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    rng = np.random.default_rng(7)
    buf, shapes = _model(rng, TCONV[0], MATMUL[1])
    p = tmp_path / "linalg.tflite"
    p.write_bytes(buf)
    gold = str(tmp_path / "g.npz")
    assert golden(str(p), gold, [tuple(_feeds(rng, shapes)) for _ in range(3)]) == "litert"
    rep = verify(str(p), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 3, rep["results"]
