"""Property tests for TFLite's 16x8 quantisation (int16 activations, zero point 0; int8 weights;
int64 bias): Kiln's int16 reference equals LiteRT (BUILTIN_REF) bit for bit on randomly generated
single-op models exported with Kiln's .tflite writer, and the exported files import back."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.frontend import TensorType
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite

from .litert_util import assert_same, compare, q, single_op

SETTINGS = dict(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 30)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
log_scale = st.floats(-14.0, -2.0)


def i16(rng, shape, lo=-32768, hi=32768):
    return rng.integers(lo, hi, size=shape, dtype=np.int64).astype(np.int16)


def t16(shape, scale, zp=0):
    return TensorType(tuple(shape), "int16", q(scale, zp))


def _check(g, feeds, what):
    got, want = compare(g, feeds)
    assert_same(got, want, what)
    back = load_tflite(export_tflite(g))          # the int16 file imports back to the same op
    assert [n.op for n in back.nodes][-1] == g.nodes[-1].op or g.nodes[-1].op in ("relu", "relu6")


@settings(**SETTINGS)
@given(data=st.data(), n=st.integers(1, 2), h=st.integers(1, 8), w=st.integers(1, 8), cin=st.integers(1, 5),
       cout=st.integers(1, 6), kh=st.integers(1, 3), kw=st.integers(1, 3), sh=st.integers(1, 2), sw=st.integers(1, 2),
       dil=st.integers(1, 2), padding=st.sampled_from(["same", "valid"]), ls=log_scale,
       act=st.sampled_from(["none", "relu", "relu6"]), per_channel=st.booleans(), bias=st.booleans(),
       depthwise=st.booleans(), seed=st.integers(0, 2 ** 31))
def test_conv2d_and_depthwise_16x8(data, n, h, w, cin, cout, kh, kw, sh, sw, dil, padding, ls, act, per_channel,
                                   bias, depthwise, seed):
    rng = np.random.default_rng(seed)
    if padding == "valid" and (h < (kh - 1) * dil + 1 or w < (kw - 1) * dil + 1):
        kh = kw = 1
    mult = data.draw(st.integers(1, 2)) if depthwise else 1
    cout = cin * mult if depthwise else cout
    in_s = 2.0 ** ls
    w_s = 2.0 ** rng.uniform(-9, -5, cout if per_channel else 1)
    k = kh * kw * (1 if depthwise else cin)
    out_s = float(np.float32(in_s * float(np.mean(w_s)) * np.sqrt(k) * 128 * 2.0 ** rng.uniform(-2, 2) / 4))
    wshape = (cout, kh, kw, 1 if depthwise else cin)
    wq = q(w_s, [0] * len(w_s), 0) if per_channel else q(w_s[0], 0)
    inputs = [("x", t16((n, h, w, cin), in_s), None),
              ("w", TensorType(wshape, "int8", wq), rng.integers(-127, 128, wshape))]
    if bias:
        bs = np.float32(in_s) * np.asarray(w_s, np.float32)
        inputs.append(("b", TensorType((cout,), "int64", q(np.broadcast_to(bs, (cout,)), [0] * cout, 0)
                                       if per_channel else q(bs[0], 0)), rng.integers(-(1 << 24), 1 << 24, cout)))
    attrs = dict(stride=[sh, sw], padding=padding, dilation=[dil, dil], groups=cin if depthwise else 1, activation=act)
    g = single_op("conv2d", inputs, attrs, q(out_s), out_dtype="int16")
    _check(g, [i16(rng, (n, h, w, cin))], f"conv2d 16x8 {attrs}")


@settings(**SETTINGS)
@given(b=st.integers(1, 3), k=st.integers(1, 40), nout=st.integers(1, 12), ls=log_scale, bias=st.booleans(),
       act=st.sampled_from(["none", "relu", "relu6"]), seed=st.integers(0, 2 ** 31))
def test_dense_16x8(b, k, nout, ls, bias, act, seed):
    rng = np.random.default_rng(seed)
    in_s = 2.0 ** ls
    w_s = float(2.0 ** rng.uniform(-9, -5))
    out_s = float(np.float32(in_s * w_s * np.sqrt(k) * 128 * 2.0 ** rng.uniform(-2, 2) / 4))
    inputs = [("x", t16((b, k), in_s), None),
              ("w", TensorType((nout, k), "int8", q(w_s)), rng.integers(-127, 128, (nout, k)))]
    if bias:
        inputs.append(("b", TensorType((nout,), "int64", q(float(np.float32(in_s) * np.float32(w_s)))),
                       rng.integers(-(1 << 24), 1 << 24, nout)))
    g = single_op("dense", inputs, {"activation": act}, q(out_s), out_dtype="int16")
    _check(g, [i16(rng, (b, k))], "dense 16x8")


@settings(**SETTINGS)
@given(op=st.sampled_from(["add", "mul"]), shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
       bcast=st.booleans(), l1=log_scale, l2=log_scale, lo=log_scale, seed=st.integers(0, 2 ** 31))
def test_add_mul_16x8(op, shape, bcast, l1, l2, lo, seed):
    rng = np.random.default_rng(seed)
    s2 = list(shape)
    if bcast:
        s2[-1] = 1
    if op == "mul":
        lo = l1 + l2 + 15 + float(rng.uniform(-2, 1))
    g = single_op(op, [("a", t16(shape, 2.0 ** l1), None), ("b", t16(s2, 2.0 ** l2), None)], {},
                  q(2.0 ** lo), out_dtype="int16", out_shape=tuple(shape))
    _check(g, [i16(rng, shape), i16(rng, s2)], f"{op} 16x8")


@settings(**SETTINGS)
@given(op=st.sampled_from(["relu", "relu6", "sigmoid", "tanh"]), shape=st.lists(st.integers(1, 6), min_size=1,
       max_size=3), ls=st.floats(-14.0, -5.0), pot=st.booleans(), ratio=st.floats(-1.0, 1.0),
       seed=st.integers(0, 2 ** 31))
def test_activations_16x8(op, shape, ls, pot, ratio, seed):
    rng = np.random.default_rng(seed)
    in_s = 2.0 ** round(ls) if pot else 2.0 ** ls
    out_s = 1.0 / 32768 if op in ("sigmoid", "tanh") else in_s * 2.0 ** ratio
    g = single_op(op, [("x", t16(shape, in_s), None)], {}, q(out_s), out_dtype="int16")
    _check(g, [i16(rng, shape)], f"{op} 16x8 in_s={in_s}")


def test_activation_tables_cover_every_int16():
    """LOGISTIC / TANH over all 65536 inputs, power-of-two and general input scales."""
    x = np.arange(-32768, 32768, dtype=np.int64).astype(np.int16).reshape(1, -1)
    for op in ("sigmoid", "tanh"):
        for in_s in (2.0 ** -12, 2.0 ** -11, 3.1e-4, 1.7e-3):
            g = single_op(op, [("x", t16(x.shape, in_s), None)], {}, q(1.0 / 32768), out_dtype="int16")
            got, want = compare(g, [x])
            assert_same(got, want, f"{op} in_s={in_s}")


@settings(**SETTINGS)
@given(op=st.sampled_from(["avg_pool2d", "max_pool2d"]), n=st.integers(1, 2), h=st.integers(1, 7),
       w=st.integers(1, 7), c=st.integers(1, 4), k=st.integers(1, 3), s=st.integers(1, 2),
       padding=st.sampled_from(["same", "valid"]), seed=st.integers(0, 2 ** 31))
def test_pool_16x8(op, n, h, w, c, k, s, padding, seed):
    rng = np.random.default_rng(seed)
    if padding == "valid" and (h < k or w < k):
        k = 1
    g = single_op(op, [("x", t16((n, h, w, c), 1e-3), None)], {"pool": [k, k], "stride": [s, s], "padding": padding},
                  q(1e-3), out_dtype="int16")
    _check(g, [i16(rng, (n, h, w, c))], f"{op} 16x8")


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=4), data=st.data(), keep=st.booleans(),
       ratio=st.floats(-1.0, 1.0), seed=st.integers(0, 2 ** 31))
def test_mean_16x8(shape, data, keep, ratio, seed):
    rng = np.random.default_rng(seed)
    axes = sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape))))
    g = single_op("mean", [("x", t16(shape, 1e-3), None)], {"axes": axes, "keepdims": keep},
                  q(1e-3 * 2.0 ** ratio), out_dtype="int16")
    _check(g, [i16(rng, shape)], f"mean 16x8 axes={axes}")


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(), seed=st.integers(0, 2 ** 31))
def test_pad_concat_reshape_16x8(shape, data, seed):
    rng = np.random.default_rng(seed)
    nd = len(shape)
    pads = data.draw(st.lists(st.integers(0, 2), min_size=2 * nd, max_size=2 * nd))
    g = single_op("pad", [("x", t16(shape, 1e-3), None)], {"pads": pads, "value": 0.0}, q(1e-3), out_dtype="int16")
    _check(g, [i16(rng, shape)], "pad 16x8")
    axis = data.draw(st.integers(0, nd - 1))
    s2 = list(shape)
    s2[axis] += 1
    out_shape = list(shape)
    out_shape[axis] += s2[axis]
    g = single_op("concat", [("a", t16(shape, 1e-3), None), ("b", t16(s2, 1e-3), None)], {"axis": axis},
                  q(1e-3), out_dtype="int16", out_shape=tuple(out_shape))
    _check(g, [i16(rng, shape), i16(rng, s2)], "concat 16x8")
    g = single_op("reshape", [("x", t16(shape, 1e-3), None)], {"shape": [int(np.prod(shape))]}, q(1e-3),
                  out_dtype="int16")
    _check(g, [i16(rng, shape)], "reshape 16x8")


@pytest.mark.parametrize("src,dst", [("int16", "int16"), ("int16", "int8"), ("int8", "int16"), ("float32", "int16")])
def test_quantize_requantize_16(src, dst):
    rng = np.random.default_rng(0)
    shape = (3, 50)
    s_in, s_out = 3.7e-4, 2.9e-3 if dst == "int8" else 5.1e-4
    z_out = 3 if dst == "int8" else 0
    if src == "float32":
        xt, x = TensorType(shape, "float32"), rng.normal(0, 5, shape).astype(np.float32)
    elif src == "int8":
        xt, x = TensorType(shape, "int8", q(2.1e-2, -4)), rng.integers(-128, 128, shape).astype(np.int8)
    else:
        xt, x = t16(shape, s_in), i16(rng, shape)
    g = single_op("quantize", [("x", xt, None)], {"scale": [s_out], "zero_point": [z_out], "dtype": dst},
                  q(s_out, z_out), out_dtype=dst)
    _check(g, [x], f"quantize {src}->{dst}")
    g = single_op("dequantize", [("x", t16(shape, s_in), None)], {}, None, out_dtype="float32")
    _check(g, [i16(rng, shape)], "dequantize int16")


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3), ls=st.floats(-12.0, -2.0), spread=st.integers(1, 32768),
       seed=st.integers(0, 2 ** 31))
def test_softmax_16(shape, ls, spread, seed):
    rng = np.random.default_rng(seed)
    g = single_op("softmax", [("x", t16(shape, 2.0 ** ls), None)], {"axis": -1}, q(1.0 / 32768), out_dtype="int16")
    _check(g, [i16(rng, shape, -spread, spread)], f"softmax 16 in_s={2.0 ** ls}")


@pytest.mark.parametrize("op", ["conv2d", "dense", "mul", "sigmoid"])
def test_import_refuses_asymmetric_int16(op):
    """TFLite's 16x8 kernels need zero point 0: a file with another is refused on import, by name."""
    from kiln.frontend.tflite_verify import TFLiteImportError
    rng = np.random.default_rng(0)
    if op == "conv2d":
        g = single_op(op, [("x", t16((1, 4, 4, 2), 1e-3, 5), None),
                           ("w", TensorType((3, 1, 1, 2), "int8", q(0.01)), rng.integers(-9, 9, (3, 1, 1, 2)))],
                      {}, q(0.05), out_dtype="int16")
    elif op == "dense":
        g = single_op(op, [("x", t16((1, 4), 1e-3, 5), None),
                           ("w", TensorType((3, 4), "int8", q(0.01)), rng.integers(-9, 9, (3, 4)))],
                      {}, q(0.05), out_dtype="int16")
    elif op == "mul":
        g = single_op(op, [("a", t16((4,), 1e-3, 5), None), ("b", t16((4,), 1e-3), None)], {}, q(1e-3),
                      out_dtype="int16")
    else:
        g = single_op(op, [("x", t16((4,), 1e-3), None)], {}, q(1 / 32768, 7), out_dtype="int16")
    with pytest.raises(TFLiteImportError, match="zero_point (5|7) is out of range: allowed 0"):
        load_tflite(export_tflite(g))


def test_softmax_16_tables_exhaustively():
    """Rows [0, -d] for every d: the exp table over its whole range and the 1/(1+x) table over
    [1, 2] (the row sums), against LiteRT."""
    d = np.arange(0, 32768, dtype=np.int64)
    x = np.stack([np.zeros_like(d), -d], axis=1).astype(np.int16)
    for in_s in (10.0 / 65535, 10.0 / 32767 / 3):
        g = single_op("softmax", [("x", t16(x.shape, in_s), None)], {"axis": -1}, q(1.0 / 32768), out_dtype="int16")
        got, want = compare(g, [x])
        assert_same(got, want, f"softmax rows in_s={in_s}")
