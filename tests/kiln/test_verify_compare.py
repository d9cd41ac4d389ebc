"""kiln verify's float comparison: atol near zero, relative for large values (a float model's
last bits differ between targets: FMA contraction, summation order), and integers bit-exact."""
import numpy as np

from kiln.commands.verify import compare


def test_float_tolerance_scales_with_the_value():
    want = np.asarray([-14.99420166015625, 0.0, 1e-3], np.float32)
    ok = compare(want + np.asarray([1.14e-5, 9e-6, 9e-6], np.float32), want, False, 1e-5)
    assert ok["match"], ok                    # 15 +- 1.1e-5 is float32 rounding of a long sum
    bad = compare(want + np.asarray([2e-4, 0, 0], np.float32), want, False, 1e-5)
    assert not bad["match"] and bad["mismatches"][0]["index"] == [0]
    bad = compare(want + np.asarray([0, 2e-5, 0], np.float32), want, False, 1e-5)
    assert not bad["match"] and bad["mismatches"][0]["index"] == [1]


def test_integers_are_bit_exact():
    want = np.asarray([1, -128, 127], np.int8)
    assert compare(want, want, True, 1e-5)["match"]
    assert not compare(want + np.asarray([0, 1, 0], np.int8), want, True, 1e-5)["match"]
