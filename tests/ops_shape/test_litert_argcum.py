"""ARG_MAX / ARG_MIN (int8 and float, int32 and int64 indices, ties), CUMSUM and LOG_SOFTMAX
(float), L2_NORMALIZATION (float and int8) against LiteRT's reference kernels."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.frontend.tflite_import import TFLiteImportError, load_tflite

from .util import check, feed, one_op

SETTINGS = dict(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 40)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@settings(**SETTINGS)
@given(shape=shapes, dtype=st.sampled_from(["int8", "float32"]), op=st.sampled_from(["ARG_MAX", "ARG_MIN"]),
       out=st.sampled_from(["int32", "int64"]), data=st.data(), seed=st.integers(0, 2 ** 31))
def test_arg_max_min(shape, dtype, op, out, data, seed):
    ax = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 3, size=shape).astype(dtype)          # many ties: the first index wins
    oshape = [n for i, n in enumerate(shape) if i != ax % len(shape)]
    code = 2 if out == "int32" else 4
    from tests.frontend.tflite_builder import Builder
    b = Builder(op)
    xi = b.tensor("x", shape, dtype, scale=0.1 if dtype == "int8" else None, zero_point=-3)
    ai = b.tensor("axis", [1], "int32", data=np.asarray([ax], np.int32))
    yi = b.tensor("y", oshape, out)
    b.op(op, [xi, ai], [yi], "ArgMaxOptions" if op == "ARG_MAX" else "ArgMinOptions", dtype == "int8",
         OutputType=code)
    check(b.build([xi], [yi]), [x], f"{op} {shape} axis {ax}")


@settings(**SETTINGS)
@given(shape=shapes, exclusive=st.booleans(), reverse=st.booleans(), data=st.data(), seed=st.integers(0, 2 ** 31))
def test_cumsum(shape, exclusive, reverse, data, seed):
    ax = data.draw(st.integers(-len(shape), len(shape) - 1))
    buf = one_op("CUMSUM", shape, "float32", None, [("axis", np.asarray(ax, np.int32))], [shape], "CumsumOptions",
                 Exclusive=exclusive, Reverse=reverse)
    check(buf, [feed(np.random.default_rng(seed), shape, "float32")], f"CUMSUM {shape} {ax} {exclusive} {reverse}",
          exact=False)


@settings(**SETTINGS)
@given(shape=shapes, seed=st.integers(0, 2 ** 31))
def test_log_softmax_and_l2_normalization(shape, seed):
    x = feed(np.random.default_rng(seed), shape, "float32")
    check(one_op("LOG_SOFTMAX", shape, "float32", None, [], [shape], "LogSoftmaxOptions"), [x], "LOG_SOFTMAX",
          exact=False)
    check(one_op("L2_NORMALIZATION", shape, "float32", None, [], [shape], "L2NormOptions"), [x * 1e-7], "L2 tiny",
          exact=False)
    check(one_op("L2_NORMALIZATION", shape, "float32", None, [], [shape], "L2NormOptions"), [x], "L2", exact=False)


def test_int8_log_softmax_is_refused_with_the_reason():
    buf = one_op("LOG_SOFTMAX", [2, 3], "int8", (0.1, 0), [], [[2, 3]], "LogSoftmaxOptions", out_q=(16 / 256, 127))
    with pytest.raises(TFLiteImportError, match=r"operator 0 \(LOG_SOFTMAX\): input .* is int8; Kiln imports the "
                                                r"float32 LOG_SOFTMAX"):
        load_tflite(buf)


@settings(**SETTINGS)
@given(shape=shapes, in_s=st.floats(1e-3, 1.0), zin=st.integers(-128, 127), spread=st.integers(0, 128),
       seed=st.integers(0, 2 ** 31))
def test_l2_normalization_int8(shape, in_s, zin, spread, seed):
    """reference_integer_ops::L2Normalization bit for bit, rows from all-zero (the sum <= 1 case)
    to the full int8 range."""
    rng = np.random.default_rng(seed)
    x = np.clip(zin + rng.integers(-spread, spread + 1, size=shape), -128, 127).astype(np.int8)
    buf = one_op("L2_NORMALIZATION", shape, "int8", (in_s, zin), [], [shape], "L2NormOptions",
                 out_q=(1.0 / 128, 0))
    check(buf, [x], f"L2_NORMALIZATION int8 {shape} zp {zin} spread {spread}")


@pytest.mark.parametrize("shape, zp", [((3, 300), -128), ((1, 9000), -128), ((2, 7), 5)])
def test_l2_normalization_int8_large_sums(shape, zp):
    """Sums of squares near 2^24 and past 2^29 (the kernel's divide-by-4 branch)."""
    rng = np.random.default_rng(len(shape) + shape[-1])
    x = rng.integers(-128, 128, size=shape).astype(np.int8)
    x[0] = 127
    buf = one_op("L2_NORMALIZATION", list(shape), "int8", (0.02, zp), [], [list(shape)], "L2NormOptions",
                 out_q=(1.0 / 128, 0))
    check(buf, [x], f"L2_NORMALIZATION int8 {shape}")
