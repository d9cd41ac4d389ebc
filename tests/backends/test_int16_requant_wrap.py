"""16x8 CONV_2D / DEPTHWISE_CONV_2D whose requantised accumulator passes int32: TFLite's int64
``MultiplyByQuantizedMultiplier`` returns ``int32_t result = x >> total_shift`` (the low 32 bits)
before the int16 clamp, and its int64 product wraps past |acc| * m16 = 2**63. Kiln's reference
(``int16util.mbqm64``) and the C epilogue (``ops_nn.requant16_epilogue``) do the same: equal to
LiteRT's BUILTIN_REF. Before, both clamped the int64 value (8 of 10 such conv models differed)."""
import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.frontend import TensorType, run
from kiln.frontend.ops import int16util
from kiln.quantize.tflite_export import export_tflite
from tests.firmware.helpers import need_qemu
from tests.quantize.litert_util import assert_same, litert_run, q, single_op


def conv16(rng, bias, depthwise):
    """A 1x1 conv (or depthwise) with multiplier 2 (input 2**-8, weights 2**-3, output 2**-12)."""
    C = 3
    w = rng.integers(-127, 128, (C, 1, 1, 1) if depthwise else (C, 1, 1, C))
    inputs = [("x", TensorType((1, 2, 3, C), "int16", q(2.0 ** -8)), None),
              ("w", TensorType(w.shape, "int8", q(2.0 ** -3)), w),
              ("b", TensorType((C,), "int64", q(2.0 ** -11)), rng.integers(-bias, bias, C, dtype=np.int64))]
    attrs = dict(stride=[1, 1], padding="valid", dilation=[1, 1], groups=C if depthwise else 1, activation="none")
    return single_op("conv2d", inputs, attrs, q(2.0 ** -12), out_dtype="int16")


@pytest.mark.parametrize("bias,depthwise", [(1 << 31, False), (1 << 31, True), ((1 << 62), False)])
def test_conv_16x8_wraps_as_litert(bias, depthwise, tmp_path, monkeypatch):
    rng = np.random.default_rng(bias % 997 + depthwise)
    graphs = [conv16(rng, bias, depthwise)]
    pkgs = [compile_pkg(g, target="host", out_dir=tmp_path / str(k), plot=False, measure_size=False)
            for k, g in enumerate(graphs)]
    cases = []
    for g, pkg in zip(graphs, pkgs):
        model = export_tflite(g)
        for _ in range(6):
            x = rng.integers(-32768, 32768, (1, 2, 3, 3)).astype(np.int16)
            want = litert_run(model, [x])[0]
            assert_same(run(g, x)[0], want, "reference")
            assert_same(pkg.run(x)[0], want, "host C")
            cases.append((g, x, want))
    monkeypatch.setattr(int16util, "wrap32", lambda v: v)         # clamping the int64 value instead
    assert sum(not np.array_equal(run(g, x)[0], want) for g, x, want in cases) >= 2


@pytest.mark.qemu
@pytest.mark.slow
def test_conv_16x8_wraps_on_mps2_an386(tmp_path):
    """The wrapping epilogue on the Cortex-M4 (uint64 product, int32 conversion) = LiteRT."""
    need_qemu()
    from kiln import hil
    from kiln.frontend import save
    rng = np.random.default_rng(9)
    for k, (bias, dw) in enumerate([(1 << 31, False), (1 << 62, True)]):
        g = conv16(rng, bias, dw)
        img, pkg = hil.build_for_board(save(g, str(tmp_path / f"c{k}.json")), "mps2-an386", str(tmp_path / f"b{k}"))
        samples = [rng.integers(-32768, 32768, (1, 2, 3, 3)).astype(np.int16) for _ in range(4)]
        res = hil.run_on_board(img, pkg, samples)
        want = [litert_run(export_tflite(g), [x])[0] for x in samples]
        assert all(hil.same_outputs(a, b) for a, b in zip(res.outputs, want))
