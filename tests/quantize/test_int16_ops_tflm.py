"""16x8 kernels added for TensorFlow Lite Micro's int16 models (SUB, LEAKY_RELU, TRANSPOSE_CONV,
QUANTIZE with an int32 side): Kiln's int16 reference against LiteRT (BUILTIN_REF) bit for bit on
random single-op models exported with Kiln's writer, the exported files imported back, and the C
kernels against the reference on the host.

SUB is the one op where TFLite Micro (which Kiln follows) and LiteRT form the multipliers
differently (float32 and double, docs/int8_ir.md): LiteRT is checked against Kiln's arithmetic
with LiteRT's multipliers, and the two formations are compared directly."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.backends import compile as compile_pkg
from kiln.frontend import TensorType, run
from kiln.frontend.ops import elementwise_int16
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite

from .litert_util import assert_same, compare, q, single_op

SETTINGS = dict(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 30)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
log_scale = st.floats(-14.0, -2.0)


def i16(rng, shape):
    return rng.integers(-32768, 32768, size=shape, dtype=np.int64).astype(np.int16)


def t16(shape, scale, zp=0):
    return TensorType(tuple(shape), "int16", q(scale, zp))


def _check(g, feeds, what, oracle="litert"):
    got, want = compare(g, feeds, oracle)
    assert_same(got, want, what)
    back = load_tflite(export_tflite(g))
    assert [n.op for n in back.nodes][-1] == g.nodes[-1].op
    return got


def _host(g, feeds, tmp_path):
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    got = pkg.run(*feeds)
    got = got[0] if isinstance(got, (list, tuple)) else got
    want = run(g, *feeds)[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


# ---- SUB ------------------------------------------------------------------------------------------
def _sub_graph(shape, s2, l1, l2, lo, zps=(0, 0, 0)):
    return single_op("sub", [("a", t16(shape, 2.0 ** l1, zps[0]), None), ("b", t16(s2, 2.0 ** l2, zps[1]), None)],
                     {}, q(2.0 ** lo, zps[2]), out_dtype="int16", out_shape=tuple(shape))


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), bcast=st.booleans(), l1=log_scale, l2=log_scale,
       lo=log_scale, seed=st.integers(0, 2 ** 31))
def test_sub_16x8_against_litert(shape, bcast, l1, l2, lo, seed):
    rng = np.random.default_rng(seed)
    s2 = list(shape)
    if bcast:
        s2[-1] = 1
    g = _sub_graph(shape, s2, l1, l2, lo)
    feeds = [i16(rng, shape), i16(rng, s2)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(elementwise_int16, "sub16_params", elementwise_int16.sub16_params_litert)
        _check(g, feeds, "sub 16x8 (LiteRT's multipliers)")


def test_sub_16x8_multipliers_tflm_and_litert():
    """TFLite Micro divides in float32 (``input->params.scale / twice_max_input_scale``), LiteRT
    in double: equal for equal scales, apart in the low bits of the multiplier otherwise."""
    same = elementwise_int16.sub16_params(1e-3, 1e-3, 2e-3)
    assert same == elementwise_int16.sub16_params_litert(1e-3, 1e-3, 2e-3)
    (m1, _), (m2, e2), _ = elementwise_int16.sub16_params(0.013618394, 8.116981e-06, 0.01061698)
    (l1, _), (l2, f2), _ = elementwise_int16.sub16_params_litert(0.013618394, 8.116981e-06, 0.01061698)
    f = np.float32
    want = float(f(8.116981e-06) / (f(2) * f(0.013618394)))
    assert (m2, e2) == elementwise_int16.fp.quantize_multiplier(want) and m1 == l1 == 1 << 30
    assert e2 == f2 and m2 != l2


def test_sub_16x8_zero_points(tmp_path):
    """TFLite Micro's SUB takes any int16 zero points (LiteRT needs 0): within 1 of the real
    difference, and host C equals the reference."""
    rng = np.random.default_rng(1)
    g = _sub_graph((2, 3, 7), (2, 1, 7), -9.5, -11.2, -9.0, zps=(5, -7, 3))
    x = [i16(rng, (2, 3, 7)), i16(rng, (2, 1, 7))]
    y = run(g, *x)[0]
    s1, s2, so = (float(np.float32(s)) for s in (2.0 ** -9.5, 2.0 ** -11.2, 2.0 ** -9.0))
    real = (s1 * (x[0].astype(np.float64) - 5) - s2 * (x[1].astype(np.float64) + 7)) / so + 3
    assert np.abs(y - np.clip(np.round(real), -32768, 32767)).max() <= 1
    _host(g, x, tmp_path)


# ---- LEAKY_RELU -----------------------------------------------------------------------------------
@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), li=log_scale, ratio=st.floats(-3.0, 3.0),
       alpha=st.floats(0.0, 2.0), seed=st.integers(0, 2 ** 31))
def test_leaky_relu_16x8(shape, li, ratio, alpha, seed):
    rng = np.random.default_rng(seed)
    g = single_op("leaky_relu", [("x", t16(shape, 2.0 ** li), None)], {"alpha": alpha}, q(2.0 ** (li + ratio)),
                  out_dtype="int16")
    _check(g, [i16(rng, shape)], f"leaky_relu 16x8 alpha={alpha}")


def _gemmlowp_mbqm(x, m, shift):
    """MultiplyByQuantizedMultiplier(int32, int32, int) of TFLite Micro, one value, Python ints."""
    ab = (x << max(shift, 0)) * m
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    high = abs(ab + nudge) >> 31
    high = -high if ab + nudge < 0 else high
    e = max(-shift, 0)
    mask, rem = (1 << e) - 1, high & ((1 << e) - 1)
    return (high >> e) + (rem > (mask >> 1) + (1 if high < 0 else 0))


def test_leaky_relu_16x8_negative_alpha_follows_tflm(tmp_path):
    """A negative alpha gives a negative multiplier; TensorFlow Lite Micro applies its magnitude and
    negates the result (LiteRT multiplies by the negative multiplier, which rounds ties the other
    way: docs/int8_ir.md). Against TFLite Micro's interpreter, and one value by hand."""
    x = np.arange(-40, 1, dtype=np.int16).reshape(1, -1)
    for alpha in (-0.25, -0.5, -1.5):
        g = single_op("leaky_relu", [("x", t16(x.shape, 0.01), None)], {"alpha": alpha}, q(0.01), out_dtype="int16")
        got, want = compare(g, [x], "tflm")
        assert_same(got, want, f"leaky_relu alpha {alpha}")
        _host(g, [x], tmp_path / str(alpha))
    # -39 * -1.5: the magnitude's product -58.5 rounds to -58 (SRDHM), negated 58 (LiteRT: 59)
    assert got.ravel().tolist()[:4] == [60, 58, 57, 55]


# ---- TRANSPOSE_CONV -------------------------------------------------------------------------------
def _tc_graph(rng, n, h, w, cin, cout, kh, kw, sh, sw, padding, per_channel, bias, act, big_bias=False):
    oh = h * sh if padding == "same" else (h - 1) * sh + kh
    ow = w * sw if padding == "same" else (w - 1) * sw + kw
    in_s = float(2.0 ** rng.uniform(-14, -8))
    w_s = 2.0 ** rng.uniform(-9, -5, cout if per_channel else 1)
    out_s = float(np.float32(in_s * float(np.mean(w_s)) * np.sqrt(kh * kw * cin) * 128 * 2.0 ** rng.uniform(-2, 2) / 4))
    wq = q(w_s, [0] * len(w_s), 0) if per_channel else q(w_s[0], 0)
    inputs = [("x", t16((n, h, w, cin), in_s), None),
              ("w", TensorType((cout, kh, kw, cin), "int8", wq), rng.integers(-127, 128, (cout, kh, kw, cin)))]
    if bias:
        bs = np.broadcast_to(np.float32(in_s) * np.asarray(w_s, np.float32), (cout,))
        lim = 1 << 34 if big_bias else 1 << 24
        inputs.append(("b", TensorType((cout,), "int64", q(bs, [0] * cout, 0) if per_channel else q(bs[0], 0)),
                       rng.integers(-lim, lim, cout)))
    attrs = dict(stride=[sh, sw], padding=padding, output_shape=[n, oh, ow, cout], activation=act)
    return single_op("transpose_conv2d", inputs, attrs, q(out_s), out_dtype="int16")


@settings(**SETTINGS)
@given(n=st.integers(1, 2), h=st.integers(1, 5), w=st.integers(1, 5), cin=st.integers(1, 4), cout=st.integers(1, 5),
       kh=st.integers(1, 4), kw=st.integers(1, 4), sh=st.integers(1, 3), sw=st.integers(1, 3),
       padding=st.sampled_from(["same", "valid"]), per_channel=st.booleans(), bias=st.booleans(),
       act=st.sampled_from(["none", "relu"]), seed=st.integers(0, 2 ** 31))
def test_transpose_conv_16x8(n, h, w, cin, cout, kh, kw, sh, sw, padding, per_channel, bias, act, seed):
    rng = np.random.default_rng(seed)
    g = _tc_graph(rng, n, h, w, cin, cout, kh, kw, sh, sw, padding, per_channel, bias, act)
    _check(g, [i16(rng, (n, h, w, cin))], f"transpose_conv 16x8 {g.nodes[-1].attrs}")


@pytest.mark.parametrize("case", [
    dict(n=1, h=3, w=4, cin=5, cout=6, kh=3, kw=4, sh=1, sw=2, padding="same", per_channel=True, bias=True, act="none"),
    dict(n=2, h=2, w=3, cin=3, cout=4, kh=2, kw=3, sh=2, sw=1, padding="valid", per_channel=False, bias=True,
         act="relu", big_bias=True),
    dict(n=1, h=3, w=3, cin=200, cout=3, kh=3, kw=3, sh=2, sw=2, padding="same", per_channel=True, bias=False,
         act="none"),
])
def test_transpose_conv_16x8_host_c(case, tmp_path):
    """C kernel = reference: int32 and int64 accumulators (the last case's taps can pass 2^31),
    biases beyond int32, both paddings."""
    rng = np.random.default_rng(7)
    g = _tc_graph(rng, **case)
    x = i16(rng, g.types["x"].shape)
    got, want = compare(g, [x])
    assert_same(got, want, "transpose_conv 16x8")
    _host(g, [x], tmp_path)


# ---- QUANTIZE with an int32 side --------------------------------------------------------------------
@pytest.mark.parametrize("src,dst", [("int16", "int32"), ("int32", "int16"), ("int8", "int32"), ("int32", "int8")])
def test_quantize_int32(src, dst, tmp_path):
    """TFLite Micro's Requantize to and from int32 (the seanet QUANTIZE models): reference = LiteRT
    = host C."""
    rng = np.random.default_rng(3)
    shape = (2, 40)
    scales = {"int16": 4.9e-4, "int8": 3.1e-2, "int32": 1.49e-7}
    zps = {"int16": 0, "int8": -3, "int32": 0}
    if src == "int32":
        x = rng.integers(-(1 << 28), 1 << 28, shape).astype(np.int32)
    else:
        info = np.iinfo(src)
        x = rng.integers(info.min, info.max + 1, shape).astype(src)
    g = single_op("quantize", [("x", TensorType(shape, src, q(scales[src], zps[src])), None)],
                  {"scale": [scales[dst]], "zero_point": [zps[dst]], "dtype": dst}, q(scales[dst], zps[dst]),
                  out_dtype=dst)
    if "int8" in (src, dst):     # TFLite Micro only (LiteRT 2.3 has no int8 <-> int32 QUANTIZE)
        m, e = elementwise_int16.fp.quantize_multiplier(float(np.float32(scales[src])) / float(np.float32(scales[dst])))
        info = np.iinfo(dst)
        want = [min(max(_gemmlowp_mbqm(int(v) - zps[src], m, e) + zps[dst], info.min), info.max) for v in x.ravel()]
        assert run(g, x)[0].ravel().tolist() == want
    else:
        got, want = compare(g, [x])
        assert_same(got, want, f"quantize {src}->{dst}")
    if src != "int32":           # an int32 graph input exports and imports back (TFLite Micro's test models)
        assert [n.op for n in load_tflite(export_tflite(g)).nodes] == ["quantize"]
    _host(g, [x], tmp_path)


def test_leaky_relu_and_sub_16x8_host_c(tmp_path):
    rng = np.random.default_rng(2)
    g = single_op("leaky_relu", [("x", t16((3, 50), 2.3e-3, 4), None)], {"alpha": 0.2}, q(3.1e-3, -2),
                  out_dtype="int16")
    _host(g, [i16(rng, (3, 50))], tmp_path / "lr")
    g = _sub_graph((2, 4, 9), (1, 4, 1), -8.3, -10.1, -8.8)
    _host(g, [i16(rng, (2, 4, 9)), i16(rng, (1, 4, 1))], tmp_path / "sub")


# ---- MAXIMUM, MINIMUM, ABS, SQUARED_DIFFERENCE, PRELU -------------------------------------------------
@settings(**SETTINGS)
@given(op=st.sampled_from(["maximum", "minimum"]), shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
       bcast=st.booleans(), ls=log_scale, seed=st.integers(0, 2 ** 31))
def test_maximum_minimum_16x8(op, shape, bcast, ls, seed):
    rng = np.random.default_rng(seed)
    s2 = list(shape)
    if bcast:
        s2[-1] = 1
    g = single_op(op, [("a", t16(shape, 2.0 ** ls), None), ("b", t16(s2, 2.0 ** ls), None)], {},
                  q(2.0 ** ls), out_dtype="int16", out_shape=tuple(shape))
    _check(g, [i16(rng, shape), i16(rng, s2)], f"{op} 16x8")


def test_squared_difference_16x8_follows_tflm():
    """TFLite Micro's int16 SQUARED_DIFFERENCE (LiteRT 2.3 has none): against its arithmetic
    written out element by element (left_shift 0, double multipliers)."""
    rng = np.random.default_rng(6)
    for l1, l2, lo in ((-12.0, -12.4, -3.5), (-9.7, -8.2, -2.0), (-10.0, -10.0, -6.0)):
        g = single_op("squared_difference", [("a", t16((3, 7), 2.0 ** l1), None), ("b", t16((1, 7), 2.0 ** l2), None)],
                      {}, q(2.0 ** lo), out_dtype="int16", out_shape=(3, 7))
        a, b = i16(rng, (3, 7)), i16(rng, (1, 7))
        (m1, e1), (m2, e2), (mo, eo) = elementwise_int16.sqdiff16_params(2.0 ** l1, 2.0 ** l2, 2.0 ** lo)
        want = [[min(max(_gemmlowp_mbqm((_gemmlowp_mbqm(int(a[i, j]), m1, e1) - _gemmlowp_mbqm(int(b[0, j]), m2, e2)) ** 2,
                                        mo, eo), -32768), 32767) for j in range(7)] for i in range(3)]
        assert run(g, a, b)[0].tolist() == want


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), li=log_scale, ratio=st.sampled_from([0.0, 1.0, -0.7,
       2.3]), seed=st.integers(0, 2 ** 31))
def test_abs_16x8(shape, li, ratio, seed):
    rng = np.random.default_rng(seed)
    g = single_op("abs", [("x", t16(shape, 2.0 ** li), None)], {}, q(2.0 ** (li + ratio)), out_dtype="int16")
    _check(g, [i16(rng, shape)], f"abs 16x8 ratio={ratio}")


def _prelu_graph(rng, shape, ashape, li, la, lo, zi=0, za=0, zo=0):
    return single_op("prelu", [("x", t16(shape, 2.0 ** li, zi), None),
                               ("alpha", TensorType(ashape, "int8", q(2.0 ** la, za)),
                                rng.integers(-128, 128, ashape))], {}, q(2.0 ** lo, zo), out_dtype="int16",
                     out_shape=tuple(shape))


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), per_channel=st.booleans(), li=log_scale,
       la=st.floats(-9.0, -3.0), lo=log_scale, za=st.integers(-20, 20), seed=st.integers(0, 2 ** 31))
def test_prelu_16x8(shape, per_channel, li, la, lo, za, seed):
    # LiteRT forms the second multiplier in float32 (input.scale * alpha.scale / output.scale on
    # floats), TFLite Micro (and Kiln) in double (docs/int8_ir.md): with power-of-two scales both
    # are exact, so LiteRT is an exact oracle here; test_prelu_16x8_follows_tflm checks the double
    li, la, lo = round(li), round(la), round(lo)
    rng = np.random.default_rng(seed)
    ashape = (shape[-1],) if per_channel else (1,)
    g = _prelu_graph(rng, shape, ashape, li, la, lo, za=za)
    _check(g, [i16(rng, shape)], "prelu 16x8")


def test_prelu_16x8_follows_tflm(tmp_path):
    """TFLite Micro's int16 PRELU (int16 input, int8 alpha): against the arithmetic written out
    element by element, and host C."""
    rng = np.random.default_rng(4)
    g = _prelu_graph(rng, (2, 3, 5), (1, 1, 5), -9.3, -7.1, -8.2, zi=0, za=-3, zo=2)
    x = i16(rng, (2, 3, 5))
    (m1, e1), (m2, e2) = elementwise_int16.prelu16_params(2.0 ** -9.3, 2.0 ** -7.1, 2.0 ** -8.2)
    alpha = np.asarray(g.consts["alpha"], np.int64) + 3
    y = run(g, x)[0]
    for idx in np.ndindex(*x.shape):
        v = int(x[idx])
        want = _gemmlowp_mbqm(v, m1, e1) if v >= 0 else _gemmlowp_mbqm(v * int(alpha[0, 0, idx[2]]), m2, e2)
        assert y[idx] == min(max(want + 2, -32768), 32767), idx
    _host(g, [x], tmp_path)


def test_minmax_abs_sqdiff_16x8_host_c(tmp_path):
    rng = np.random.default_rng(5)
    for op in ("maximum", "minimum", "squared_difference"):
        lo = -12.0 if op != "squared_difference" else -3.5
        g = single_op(op, [("a", t16((2, 3, 8), 2.0 ** -12), None), ("b", t16((1, 3, 1), 2.0 ** (-12.4 if lo > -12
                      else -12)), None)], {}, q(2.0 ** lo), out_dtype="int16", out_shape=(2, 3, 8))
        _host(g, [i16(rng, (2, 3, 8)), i16(rng, (1, 3, 1))], tmp_path / op)
    for ratio in (0.0, 0.6):
        g = single_op("abs", [("x", t16((4, 33), 1e-3), None)], {}, q(1e-3 * 2.0 ** ratio), out_dtype="int16")
        x = i16(rng, (4, 33))
        x[0, 0] = -32768
        _host(g, [x], tmp_path / f"abs{ratio}")


# ---- SUM --------------------------------------------------------------------------------------------
def _sum_graph(shape, axes, keep, li, lo, zi=0, zo=0):
    from kiln.frontend.ops._util import reduced_shape
    return single_op("sum", [("x", t16(shape, 2.0 ** li, zi), None)], {"axes": axes, "keepdims": keep},
                     q(2.0 ** lo, zo), out_dtype="int16", out_shape=reduced_shape(tuple(shape), axes, keep))


def _tflm_sum(x, axes, keep, li, lo, zi, zo):
    m, e = elementwise_int16.fp.quantize_multiplier(float(np.float32(2.0 ** li)) / float(np.float32(2.0 ** lo)))
    count = int(np.prod([x.shape[a] for a in axes]))
    s = x.astype(np.int64).sum(axis=tuple(axes), keepdims=keep) - zi * count
    return np.asarray([min(max(_gemmlowp_mbqm(int(v), m, e) + zo, -32768), 32767) for v in s.ravel()]).reshape(s.shape)


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data(), keep=st.booleans(),
       li=st.floats(-14.0, -6.0), ratio=st.floats(0.0, 6.0), seed=st.integers(0, 2 ** 31))
def test_sum_16x8(shape, data, keep, li, ratio, seed):
    """TFLite Micro's int16 SUM against its arithmetic written out (LiteRT 2.3's int16 SUM is not
    an oracle: [[100, 200, 300], [1000, -2000, 5]] summed over axis 1 at one scale gives
    [11775, 23834] there; docs/int8_ir.md), and the exported file imports back."""
    rng = np.random.default_rng(seed)
    axes = sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape))))
    g = _sum_graph(shape, axes, keep, li, li + ratio)
    x = i16(rng, shape)
    np.testing.assert_array_equal(run(g, x)[0], _tflm_sum(x, axes, keep, li, li + ratio, 0, 0))
    back = load_tflite(export_tflite(g))
    np.testing.assert_array_equal(run(back, x)[0], run(g, x)[0])


def test_sum_16x8_host_c(tmp_path):
    rng = np.random.default_rng(8)
    for k, (shape, axes, keep, zi, zo) in enumerate([((2, 5, 7), [1], False, 0, 0), ((3, 4, 6), [0, 2], True, 11, -5),
                                                     ((9,), [0], False, 0, 0)]):
        g = _sum_graph(shape, axes, keep, -11.0, -8.3, zi, zo)
        x = i16(rng, shape)
        np.testing.assert_array_equal(run(g, x)[0], _tflm_sum(x, axes, keep, -11.0, -8.3, zi, zo))
        _host(g, [x], tmp_path / str(k))


# ---- BATCH_MATMUL ------------------------------------------------------------------------------------
def _matmul_graph(sa_shape, sb_shape, la, lb, lo):
    return single_op("matmul", [("a", t16(sa_shape, 2.0 ** la), None), ("b", t16(sb_shape, 2.0 ** lb), None)], {},
                     q(2.0 ** lo), out_dtype="int16")


@settings(**SETTINGS)
@given(batch=st.lists(st.integers(1, 3), min_size=0, max_size=2), m=st.integers(1, 5), kdim=st.integers(1, 40),
       n=st.integers(1, 5), bcast=st.booleans(), la=st.floats(-14.0, -8.0), lb=st.floats(-14.0, -8.0),
       spread=st.floats(-2.0, 2.0), seed=st.integers(0, 2 ** 31))
def test_batch_matmul_16x16(batch, m, kdim, n, bcast, la, lb, spread, seed):
    """TFLite Micro's int16 BATCH_MATMUL (both operands int16, int64 accumulator)."""
    rng = np.random.default_rng(seed)
    bb = [1] * len(batch) if bcast else batch
    lo = la + lb + 15 + np.log2(np.sqrt(kdim)) + spread
    g = _matmul_graph(tuple(batch) + (m, kdim), tuple(bb) + (kdim, n), la, lb, lo)
    _check(g, [i16(rng, tuple(batch) + (m, kdim)), i16(rng, tuple(bb) + (kdim, n))], "batch_matmul 16x16")


def test_batch_matmul_16x16_host_c(tmp_path):
    rng = np.random.default_rng(9)
    g = _matmul_graph((2, 3, 70), (1, 70, 4), -12.0, -11.0, -2.5)
    _host(g, [i16(rng, (2, 3, 70)), i16(rng, (1, 70, 4))], tmp_path)


# ---- all of them in one graph: host C and the board ---------------------------------------------------
def test_tflm_int16_graph_host_c(tmp_path):
    from .int16_tflm_graph import tflm_feeds, tflm_graph
    rng = np.random.default_rng(10)
    g = tflm_graph(rng)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    for _ in range(3):
        feeds = tflm_feeds(rng)
        for name, want, got in zip(g.outputs, run(g, *feeds), pkg.run(*feeds)):
            assert got.dtype == want.dtype, name
            np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.qemu
@pytest.mark.slow
def test_tflm_int16_graph_on_mps2_an386(tmp_path):
    """The same graph on QEMU mps2-an386 (Cortex-M4): every output bit for bit."""
    import shutil
    if not shutil.which("arm-none-eabi-gcc") or not shutil.which("qemu-system-arm"):
        pytest.skip("arm-none-eabi-gcc / qemu-system-arm not installed (bash scripts/setup.sh)")
    from kiln import hil
    from kiln.frontend import save

    from .int16_tflm_graph import tflm_feeds, tflm_graph
    rng = np.random.default_rng(11)
    model = save(tflm_graph(rng), str(tmp_path / "tflm16.json"))
    img, pkg = hil.build_for_board(model, "mps2-an386", str(tmp_path / "b"))
    g = hil.package_graph(pkg)
    samples = [tflm_feeds(rng) for _ in range(2)]
    res = hil.run_on_board(img, pkg, samples)
    want = hil.reference_outputs(g, samples)
    assert all(hil.same_outputs(a, b) for a, b in zip(res.outputs, want))


def test_ptq_int16_with_the_tflm_kernels(tmp_path):
    """``ptq(..., activations="int16")`` of a float graph of the new int16 ops: every node int16,
    close to float, host C equal to the reference, and the .tflite imports back to the same
    results."""
    from kiln.frontend import Graph
    from kiln.frontend.graph_passes import with_batch
    from kiln.quantize import ptq
    g = Graph("tflm16_ptq")
    g.add_input("x", TensorType((4, 10), "float32"))
    g.add_input("y", TensorType((4, 10), "float32"))
    for op, ins, name, attrs, shape in [("sub", ["x", "y"], "s", {}, (4, 10)),
                                        ("leaky_relu", ["s"], "lr", {"alpha": 0.1}, (4, 10)),
                                        ("maximum", ["lr", "x"], "mx", {}, (4, 10)),
                                        ("abs", ["mx"], "ab", {}, (4, 10)),
                                        ("squared_difference", ["ab", "y"], "sd", {}, (4, 10)),
                                        ("sum", ["sd"], "sm", {"axes": [1], "keepdims": False}, (4,))]:
        g.add_node(op, ins, attrs, name=name, out_type=TensorType(shape, "float32"))
    g.outputs = ["sm", "ab"]
    rng = np.random.default_rng(12)
    x, y = (rng.normal(0, 2, (64, 10)).astype(np.float32) for _ in range(2))
    q = ptq(g, [x, y], activations="int16")
    assert {q.types[n.name].dtype for n in q.nodes if n.op not in ("dequantize",)} == {"int16"}
    q4 = with_batch(q, 4)
    ref, got = run(with_batch(g, 64), x, y), run(with_batch(q, 64), x, y)
    for r, o in zip(ref, got):
        assert np.max(np.abs(r - o)) <= 2e-4 * np.max(np.abs(r)) + 1e-3
    pkg = compile_pkg(q4, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    back = load_tflite(export_tflite(q4))
    for a, b, c in zip(run(q4, x[:4], y[:4]), pkg.run(x[:4], y[:4]), run(back, x[:4], y[:4])):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
