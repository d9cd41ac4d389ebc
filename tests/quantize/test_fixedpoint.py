"""Fixed-point primitives: hand-checkable cases and a scalar model of the C semantics."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.frontend import fixedpoint as fp

I32 = st.integers(-(1 << 31), (1 << 31) - 1)


@pytest.mark.parametrize("real, want", [
    (0.0, (0, 0)),
    (0.5, (1 << 30, 0)),
    (1.0, (1 << 30, 1)),
    (0.75, (1610612736, 0)),
    (2.0 ** -40, (0, 0)),                 # below 2**-31: flushed to zero
    (1.0 - 2.0 ** -40, (1 << 30, 1)),     # rounds up to 1 << 31: carried into the shift
    (3.0, (1610612736, 2)),
    (2.0 ** 30 - 2.0 ** 5, (2147483584, 30)),   # the largest shift that needs no saturation
    (2.0 ** 30, ((1 << 31) - 1, 30)),           # shift 31: saturated, as TFLite's QuantizeMultiplier
    (1e12, ((1 << 31) - 1, 30)),
    (3.4e38, ((1 << 31) - 1, 30)),
])
def test_quantize_multiplier_cases(real, want):
    assert fp.quantize_multiplier(real) == want


@given(st.floats(1e-12, 1e30))
def test_quantize_multiplier_shift_never_exceeds_30(real):
    m, s = fp.quantize_multiplier(real)
    assert s <= 30 and (m == 0 or (1 << 30) <= m < (1 << 31))


def test_huge_multipliers_reference_matches_generated_c(tmp_path):
    """Effective scales of 1e12 and more: the reference used a left shift of 31+ (wrapping to 0)
    while the generated C computed other bits; with TFLite's saturation both use (2^31 - 1, 30)."""
    from kiln.backends import compile as compile_pkg
    from kiln.backends.host import HostModel
    from kiln.frontend import Graph, QParams, TensorType, run
    rng = np.random.default_rng(0)
    g = Graph("huge")
    g.add_input("x", TensorType((1, 4, 4, 3), "int8", QParams((1.0,), (2,))))
    g.add_const("w", rng.integers(-127, 128, (5, 1, 1, 3)).astype(np.int8),
                QParams((1.0, 0.5, 1e-3, 2.0, 1e-9), (0,) * 5, 0))
    g.add_const("b", rng.integers(-50, 50, 5).astype(np.int32))
    g.add_node("conv2d", ["x", "w", "b"], {"activation": "none"}, name="y",
               out_type=TensorType((1, 4, 4, 5), "int8", QParams((1e-12,), (-3,))))
    g.add_node("mul", ["x", "x"], {}, name="m", out_type=TensorType((1, 4, 4, 3), "int8", QParams((1e-15,), (0,))))
    g.outputs = ["y", "m"]
    x = rng.integers(-128, 128, (1, 4, 4, 3)).astype(np.int8)
    pkg = compile_pkg(g, target="host", out_dir=str(tmp_path), plot=False)
    for got, want in zip(HostModel(pkg.path).run(x), run(g, x)):
        np.testing.assert_array_equal(got, want)


@given(st.floats(1e-9, 1e6))
def test_quantize_multiplier_represents_the_real(real):
    m, s = fp.quantize_multiplier(real)
    assert (1 << 30) <= m < (1 << 31)
    assert abs(m * 2.0 ** (s - 31) - real) <= real * 2.0 ** -30


def test_srdhm_and_rdbpot_cases():
    assert fp.saturating_rounding_doubling_high_mul(-(1 << 31), -(1 << 31)) == (1 << 31) - 1
    assert fp.saturating_rounding_doubling_high_mul(1 << 30, 1 << 30) == 1 << 29
    assert fp.saturating_rounding_doubling_high_mul(-1, 1 << 30) == 0     # -0.5: the nudge truncates toward 0
    # rounding divide: ties away from zero
    assert list(fp.rounding_divide_by_pot(np.array([5, -5, 4, -4, 6, -6]), 1)) == [3, -3, 2, -2, 3, -3]


def _srdhm_c(a, b):
    if a == b == -(1 << 31):
        return (1 << 31) - 1
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    return int((ab + nudge) / (1 << 31)) if abs(ab + nudge) < 2 ** 52 else \
        (abs(ab + nudge) >> 31) * (1 if ab + nudge >= 0 else -1)


def _rdbpot_c(x, e):
    mask = (1 << e) - 1
    rem = x & mask
    thr = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if rem > thr else 0)


@settings(max_examples=300)
@given(I32, I32, st.integers(0, 31))
def test_primitives_match_a_scalar_model_of_the_c_code(a, b, e):
    assert int(fp.saturating_rounding_doubling_high_mul(a, b)) == _srdhm_c(a, b)
    assert int(fp.rounding_divide_by_pot(a, e)) == _rdbpot_c(a, e)


@settings(max_examples=300)
@given(st.integers(-(1 << 24), 1 << 24), st.floats(1e-6, 100.0))
def test_multiply_by_quantized_multiplier_is_close_to_real_product(x, real):
    m, s = fp.quantize_multiplier(real)
    y = int(fp.multiply_by_quantized_multiplier(x, m, s))
    if abs(x * real) < 2 ** 30:
        assert abs(y - x * real) <= 1.0 + abs(x * real) * 2 ** -29


def test_double_rounding_differs_from_single_rounding():
    # TFLite rounds twice (SRDHM, then RoundingDivideByPOT); one rounding gives other bits.
    rng = np.random.default_rng(0)
    x = rng.integers(-(1 << 20), 1 << 20, 100_000)
    m, s = fp.quantize_multiplier(0.0123456)
    two = fp.multiply_by_quantized_multiplier(x, m, s)
    one = np.floor(x.astype(np.float64) * m * 2.0 ** (s - 31) + 0.5).astype(np.int64)
    assert np.any(two != one)
    assert np.max(np.abs(two - one)) == 1


def test_vectorised_per_channel():
    x = np.arange(-6, 6).reshape(3, 4) * 1000
    ms, ss = fp.quantize_multipliers([0.1, 0.2, 0.3, 0.4])
    y = fp.multiply_by_quantized_multiplier(x, ms, ss)
    for c in range(4):
        for r in range(3):
            assert y[r, c] == fp.multiply_by_quantized_multiplier(int(x[r, c]), int(ms[c]), int(ss[c]))


def test_exp_and_reciprocal():
    # exp_on_negative_values(0) is 1 (saturated); exp(-1) ~ 0.3679 in Q0.31
    ib = 5
    one = 1 << (31 - ib)
    vals = np.array([0, -one, -2 * one, -one // 2])
    e = fp.exp_on_negative_values(vals, ib) / 2.0 ** 31
    assert e[0] == pytest.approx(1.0, abs=1e-9)
    assert np.allclose(e[1:], np.exp([-1.0, -2.0, -0.5]), atol=1e-6)
    r, bits = fp.get_reciprocal(np.array([3 << (31 - 12)]), 12)   # 3.0 in Q12.19
    assert r[0] / 2.0 ** 31 * 2.0 ** -int(bits[0]) == pytest.approx(1 / 3, rel=1e-6)


def test_round_half_away_and_activation_range():
    assert list(fp.round_half_away(np.array([0.5, -0.5, 1.5, -2.5, 2.4999], np.float32))) == [1, -1, 2, -3, 2]
    assert fp.activation_range("relu", 0.05, -10) == (-10, 127)
    assert fp.activation_range("relu6", 0.05, -10) == (-10, 110)
    assert fp.activation_range("none", 0.05, -10) == (-128, 127)


def test_count_leading_zeros():
    v = np.array([0, 1, 2, 3, 1 << 30, (1 << 31) - 1, 0xFFFFFFFF])
    assert list(fp.count_leading_zeros_u32(v)) == [32, 31, 30, 30, 1, 1, 0]
    assert math.isclose(fp.calculate_input_radius(5, 0), 31 * 2 ** 26)
