"""16x8 TRANSPOSE_CONV and 16x16 BATCH_MATMUL whose requantised accumulator passes int32. Both
requantise with TFLite's int64 ``MultiplyByQuantizedMultiplier``, whose ``int32_t result`` keeps
the low 32 bits before the int16 clamp (and whose int64 product wraps past 2**63), as the 16x8
CONV_2D / DEPTHWISE_CONV_2D of test_int16_requant_wrap.py: Kiln's reference (``int16util.mbqm64``)
and the C epilogue (``ops_nn.requant16_epilogue``) equal LiteRT's BUILTIN_REF there, on the host
and on mps2-an386, and TensorFlow Lite Micro's interpreter computes the same. Clamping the int64
value instead would differ (the monkeypatched check)."""
import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.frontend import TensorType, run
from kiln.frontend.ops import int16util
from kiln.quantize.tflite_export import export_tflite
from kiln.tflm import available as tflm_available
from kiln.tflm import run_tflm
from tests.firmware.helpers import need_qemu, need_toolchain
from tests.quantize.litert_util import assert_same, litert_run, q, single_op


def tconv16(rng, bias):
    """A stride-2 3x3 transpose conv, 2 -> 3 channels, multiplier 2 (input 2**-8, filter 2**-3,
    output 2**-12), int64 bias of scale 2**-11 up to ``bias``: |bias| near 2**31 passes int32 after
    the multiplier, near 2**62 the int64 product wraps."""
    w = rng.integers(-127, 128, (3, 3, 3, 2))
    inputs = [("x", TensorType((1, 2, 2, 2), "int16", q(2.0 ** -8)), None),
              ("w", TensorType(w.shape, "int8", q(2.0 ** -3)), w),
              ("b", TensorType((3,), "int64", q(2.0 ** -11)), rng.integers(-bias, bias, 3, dtype=np.int64))]
    attrs = dict(stride=[2, 2], padding="same", output_shape=[1, 4, 4, 3], activation="none")
    return single_op("transpose_conv2d", inputs, attrs, q(2.0 ** -12), out_dtype="int16")


def matmul16(rng, kdim):
    """[2, 3, K] x [K, 4] int16 with multiplier 2 (operands 2**-6, output 2**-13): sums of K
    products up to 2**30 pass int32 after the multiplier (K = 40: the int64 sum itself passes
    2**32)."""
    del rng
    return single_op("matmul", [("a", TensorType((2, 3, kdim), "int16", q(2.0 ** -6)), None),
                                ("b", TensorType((kdim, 4), "int16", q(2.0 ** -6)), None)], {}, q(2.0 ** -13),
                     out_dtype="int16")


def _feeds(rng, g):
    """Inputs of one sign along the reduction axis (the last of x and of a
    matmul's a, the one before it of b), so the products of a sum add up."""
    out = []
    for k, name in enumerate(g.inputs):
        shape = tuple(g.types[name].shape)
        axis = len(shape) - (2 if k == 1 else 1)
        mag = rng.integers(0, 32768, shape)
        sign = rng.choice([-1, 1], shape[:axis] + (1,) + shape[axis + 1:])
        out.append((mag * sign).astype(np.int16))
    return out


CASES = [("tconv", 1 << 31), ("tconv", 1 << 62), ("matmul", 6), ("matmul", 40)]


def _graph(rng, kind, arg):
    return tconv16(rng, arg) if kind == "tconv" else matmul16(rng, arg)


@pytest.mark.parametrize("kind,arg", CASES)
def test_16x8_wraps_as_litert(kind, arg, tmp_path, monkeypatch):
    rng = np.random.default_rng(arg % 997 + len(kind))
    g = _graph(rng, kind, arg)
    pkg = compile_pkg(g, target="host", out_dir=str(tmp_path), plot=False, measure_size=False)
    model = export_tflite(g)
    cases = []
    for k in range(6):
        xs = _feeds(rng, g)
        want = litert_run(model, xs)[0]
        assert_same(run(g, *xs)[0], want, f"reference, sample {k}")
        assert_same(pkg.run(*xs)[0], want, f"host C, sample {k}")
        cases.append((xs, want))
    if tflm_available():
        (tmp_path / "m.tflite").write_bytes(model)
        tflm = run_tflm(tmp_path / "m.tflite", [tuple(xs) for xs, _ in cases])
        for k, ((got,), (_, want)) in enumerate(zip(tflm, cases)):
            assert_same(got, want, f"TensorFlow Lite Micro, sample {k}")
    monkeypatch.setattr(int16util, "wrap32", lambda v: v)         # clamping the int64 value instead
    differ = sum(int(np.sum(run(g, *xs)[0] != want)) for xs, want in cases)
    assert differ * 5 >= sum(w.size for _, w in cases), differ      # at least a fifth of the outputs wrapped


@pytest.mark.qemu
@pytest.mark.slow
def test_16x8_tconv_and_matmul_wrap_on_mps2_an386(tmp_path):
    """The wrapping epilogue of both ops on the Cortex-M4 = LiteRT."""
    need_toolchain()
    need_qemu()
    from kiln import hil
    from kiln.frontend import save
    rng = np.random.default_rng(11)
    for k, (kind, arg) in enumerate([("tconv", 1 << 62), ("matmul", 40)]):
        g = _graph(rng, kind, arg)
        img, pkg = hil.build_for_board(save(g, str(tmp_path / f"m{k}.json")), "mps2-an386", str(tmp_path / f"b{k}"))
        samples = [_feeds(rng, g) for _ in range(3)]
        res = hil.run_on_board(img, pkg, [s if len(s) > 1 else s[0] for s in samples])
        model = export_tflite(g)
        want = [litert_run(model, xs)[0] for xs in samples]
        assert all(hil.same_outputs(a, b) for a, b in zip(res.outputs, want)), kind
