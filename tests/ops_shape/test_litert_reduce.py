"""SUM (int8 requantised), REDUCE_MAX and REDUCE_MIN (int8 on the raw values) against LiteRT's
reference kernels: int8 bit for bit, float32 within rounding."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.frontend import run
from kiln.frontend.tflite_import import TFLiteImportError, load_tflite

from .util import check, feed, one_op

SETTINGS = dict(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 40)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4)


@settings(**SETTINGS)
@given(shape=shapes, op=st.sampled_from(["REDUCE_MAX", "REDUCE_MIN", "SUM"]), dtype=st.sampled_from(["int8", "float32"]),
       in_s=st.floats(1e-3, 1.0), zin=st.integers(-128, 127), zout=st.integers(-128, 127), log_ratio=st.floats(-4, 4),
       keep=st.booleans(), data=st.data(), seed=st.integers(0, 2 ** 31))
def test_reduce(shape, op, dtype, in_s, zin, zout, log_ratio, keep, data, seed):
    nd = len(shape)
    axes = data.draw(st.lists(st.integers(-nd, nd - 1), min_size=1, max_size=nd, unique_by=lambda a: a % nd))
    red = {a % nd for a in axes}
    out = [1 if i in red else n for i, n in enumerate(shape) if keep or i not in red]
    if op == "SUM" and dtype == "int8":
        return                     # test_sum_int8 (LiteRT's reference SUM kernel is not the oracle)
    out_q = (in_s * 2.0 ** log_ratio, zout) if op == "SUM" else None
    buf = one_op(op, shape, dtype, (in_s, zin), [("axes", np.asarray(axes, np.int32))], [out], "ReducerOptions",
                 out_q=out_q, KeepDims=keep)
    check(buf, [feed(np.random.default_rng(seed), shape, dtype)], f"{op} {shape} axes {axes} keep {keep}",
          exact=dtype == "int8" or op != "SUM")


def test_reduce_max_with_other_output_quantisation_is_refused():
    buf = one_op("REDUCE_MAX", [2, 3], "int8", (0.1, 0), [("axes", np.asarray([1], np.int32))], [[2]],
                 "ReducerOptions", out_q=(0.2, 0))
    with pytest.raises(TFLiteImportError, match=r"operator 0 \(REDUCE_MAX\): the input's scale/zero point"):
        load_tflite(buf)


def _litert_optimized(buf, x):
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    it = interp.Interpreter(model_content=buf, experimental_op_resolver_type=interp.OpResolverType.BUILTIN)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


@settings(**SETTINGS)
@given(shape=shapes, in_s=st.floats(1e-3, 1.0), zin=st.integers(-128, 127), zout=st.integers(-128, 127),
       log_ratio=st.floats(-4, 4), data=st.data(), seed=st.integers(0, 2 ** 31))
def test_sum_int8(shape, in_s, zin, zout, log_ratio, data, seed):
    """int8 SUM is TFLite Micro's reference (float32 ``round(sum * scale + bias) + zo``, then a
    cast). LiteRT 2.3's BUILTIN_REF SUM returns other values for negative sums (-1 where the sum
    is -2, for example), so the oracle here is LiteRT's optimised SUM, equal wherever the result
    lies inside the int8 range (outside it TFLite Micro wraps and the optimised kernel clamps)."""
    nd = len(shape)
    axes = sorted(data.draw(st.sets(st.integers(0, nd - 1), min_size=1)))
    out = [n for i, n in enumerate(shape) if i not in axes]
    out_s = in_s * 2.0 ** log_ratio
    buf = one_op("SUM", shape, "int8", (in_s, zin), [("axes", np.asarray(axes, np.int32))], [out], "ReducerOptions",
                 out_q=(out_s, zout))
    x = np.random.default_rng(seed).integers(-128, 128, size=shape).astype(np.int8)
    got = run(load_tflite(buf), x)[0]
    want = _litert_optimized(buf, x)
    real = (x.astype(np.float64).sum(axis=tuple(axes)) - zin * np.prod([shape[a] for a in axes])) \
        * np.float32(in_s) / np.float32(out_s) + zout
    inside = np.abs(real - np.round(real)) < 0.49
    inside &= (real > -127.5) & (real < 126.5)
    np.testing.assert_array_equal(got[inside], want[inside])


def test_sum_int8_wraps_like_tflite_micro():
    """Hand-computed: 100 + 100 at scale ratio 1 is 200, cast to int8 as TFLite Micro does: -56."""
    buf = one_op("SUM", [2, 1], "int8", (0.5, 0), [("axes", np.asarray([0], np.int32))], [[1]], "ReducerOptions",
                 out_q=(0.5, 0))
    assert run(load_tflite(buf), np.asarray([[100], [100]], np.int8))[0].tolist() == [-56]
    buf = one_op("SUM", [2, 1], "int8", (0.5, 3), [("axes", np.asarray([0], np.int32))], [[1]], "ReducerOptions",
                 out_q=(1.0, -4))
    # (-7 + 1 - 2 * 3) * 0.5 / 1.0 = -6 -> -6 - 4 = -10
    assert run(load_tflite(buf), np.asarray([[-7], [1]], np.int8))[0].tolist() == [-10]
