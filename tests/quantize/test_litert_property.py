"""Property tests: Kiln's int8 reference equals LiteRT (BUILTIN_REF) bit for bit on randomly
generated single-op int8 models (shapes, strides, paddings, channels, zero points, scales)."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.frontend import TensorType

from .litert_util import assert_same, compare, q, single_op

SETTINGS = dict(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 40)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
zp = st.integers(-128, 127)
log_scale = st.floats(-9.0, 1.0)


def i8(rng, shape):
    return rng.integers(-128, 128, size=shape, dtype=np.int64).astype(np.int8)


def _out_scale(in_s, w_s, k, factor):
    return float(np.float32(in_s * float(np.mean(w_s)) * np.sqrt(k) * 40.0 / 128 * factor))


@settings(**SETTINGS)
@given(data=st.data(), n=st.integers(1, 2), h=st.integers(1, 9), w=st.integers(1, 9), cin=st.integers(1, 5),
       cout=st.integers(1, 6), kh=st.integers(1, 4), kw=st.integers(1, 4), sh=st.integers(1, 3), sw=st.integers(1, 3),
       dil=st.integers(1, 2), padding=st.sampled_from(["same", "valid"]), zin=zp, zout=zp, ls=log_scale,
       act=st.sampled_from(["none", "relu", "relu6"]), per_channel=st.booleans(), bias=st.booleans(),
       depthwise=st.booleans(), seed=st.integers(0, 2 ** 31))
def test_conv2d_and_depthwise(data, n, h, w, cin, cout, kh, kw, sh, sw, dil, padding, zin, zout, ls, act,
                              per_channel, bias, depthwise, seed):
    rng = np.random.default_rng(seed)
    if padding == "valid" and (h < (kh - 1) * dil + 1 or w < (kw - 1) * dil + 1):
        kh = kw = 1
    mult = data.draw(st.integers(1, 3)) if depthwise else 1
    cout = cin * mult if depthwise else cout
    in_s = 2.0 ** ls
    w_s = 2.0 ** rng.uniform(-9, -5, cout if per_channel else 1)
    k = kh * kw * (1 if depthwise else cin)
    out_s = _out_scale(in_s, w_s, k, 2.0 ** rng.uniform(-2, 2))
    wshape = (cout, kh, kw, 1 if depthwise else cin)
    wq = q(w_s, [0] * len(w_s), 0) if per_channel else q(w_s[0], 0)
    inputs = [("x", TensorType((n, h, w, cin), "int8", q(in_s, zin)), None),
              ("w", TensorType(wshape, "int8", wq), rng.integers(-127, 128, wshape))]
    if bias:
        bs = np.float32(in_s) * np.asarray(w_s, np.float32)
        inputs.append(("b", TensorType((cout,), "int32", q(np.broadcast_to(bs, (cout,)), [0] * cout, 0)
                                       if per_channel else q(bs[0], 0)), rng.integers(-5000, 5000, cout)))
    attrs = dict(stride=[sh, sw], padding=padding, dilation=[dil, dil], groups=cin if depthwise else 1, activation=act)
    g = single_op("conv2d", inputs, attrs, q(out_s, zout))
    got, want = compare(g, [i8(rng, (n, h, w, cin))])
    assert_same(got, want, f"conv2d {attrs}")


def _dense_layer(rng, name, x_name, k, nout, in_s, scales_kind, log_eff, zout, act):
    """One int8 dense layer's constants and output quantisation: per-tensor weights, or per
    channel with identical or different scales; the output scale set so that the effective
    multiplier s_in * s_w / s_out is about 2**log_eff."""
    if scales_kind == "tensor":
        w_s = 2.0 ** rng.uniform(-9, -5, 1)
    elif scales_kind == "same":
        w_s = np.full(nout, 2.0 ** rng.uniform(-9, -5))
    else:
        w_s = 2.0 ** rng.uniform(-9, -5, nout)
    out_s = float(np.float32(in_s * float(np.mean(w_s)) / 2.0 ** log_eff))
    per_channel = scales_kind != "tensor"
    wq = q(w_s, [0] * nout, 0) if per_channel else q(w_s[0], 0)
    bs = np.float32(in_s) * np.asarray(w_s, np.float32)
    bq = q(np.broadcast_to(bs, (nout,)), [0] * nout, 0) if per_channel else q(bs[0], 0)
    # biases spread the outputs over the int8 range whatever the multiplier (~128 / eff)
    spread = int(min(2 ** 30, 160 * 2.0 ** -log_eff))
    consts = [(f"{name}_w", TensorType((nout, k), "int8", wq), rng.integers(-127, 128, (nout, k))),
              (f"{name}_b", TensorType((nout,), "int32", bq), rng.integers(-spread, spread + 1, nout))]
    return consts, q(out_s, zout)


@settings(**SETTINGS)
@given(b=st.integers(1, 3), k=st.integers(1, 200), nout=st.integers(1, 12), zin=zp, zout=zp,
       ls=log_scale, log_eff=st.floats(-20.0, 1.0), scales=st.sampled_from(["tensor", "same", "different"]),
       act=st.sampled_from(["none", "relu", "relu6"]), seed=st.integers(0, 2 ** 31))
def test_dense(b, k, nout, zin, zout, ls, log_eff, scales, act, seed):
    """FULLY_CONNECTED with per-tensor and per-channel weights (identical or different channel
    scales), input zero points across the int8 range and effective multipliers from ~1e-6 to
    above 1: element for element equal to LiteRT's reference kernel."""
    rng = np.random.default_rng(seed)
    in_s = 2.0 ** ls
    consts, out_q = _dense_layer(rng, "l", "x", k, nout, in_s, scales, log_eff, zout, act)
    g = single_op("dense", [("x", TensorType((b, k), "int8", q(in_s, zin)), None)] +
                  [(n, t, v) for n, t, v in consts], {"activation": act}, out_q)
    got, want = compare(g, [i8(rng, (b, k))])
    assert_same(got, want, f"dense {scales} log2(eff)={log_eff:.2f}")


@pytest.mark.parametrize("scales", ["tensor", "same", "different"])
@pytest.mark.parametrize("log_eff", [-1.4, -3.3, -6.1, -19.9, 0.7])
def test_dense_many_outputs(scales, log_eff):
    """64 x 96 outputs spread over the int8 range: at these multipliers gemmlowp's fixed-point
    requantisation (two roundings) differs from LiteRT's reference FULLY_CONNECTED on a few
    hundredths of the outputs, so any drift from LiteRT's formula shows here."""
    rng = np.random.default_rng(abs(int(log_eff * 10)) + len(scales))
    k, nout, b = 48, 96, 64
    in_s = 2.0 ** -3
    consts, out_q = _dense_layer(rng, "l", "x", k, nout, in_s, scales, log_eff, int(rng.integers(-128, 128)), "none")
    g = single_op("dense", [("x", TensorType((b, k), "int8", q(in_s, 17)), None)] + consts,
                  {"activation": "none"}, out_q)
    got, want = compare(g, [i8(rng, (b, k))])
    assert_same(got, want, f"dense {scales} log2(eff)={log_eff}")


@settings(**dict(SETTINGS, max_examples=max(SETTINGS["max_examples"] // 4, 5)))
@given(depth=st.integers(2, 10), width=st.integers(4, 64), zin=zp, scales=st.sampled_from(["tensor", "same", "different"]),
       seed=st.integers(0, 2 ** 31))
def test_dense_stack(depth, width, zin, scales, seed):
    """A deep stack of int8 dense layers (the anomaly-detection autoencoder's shape): any 1-LSB
    difference in one layer would propagate, so every layer must match LiteRT exactly."""
    from kiln.frontend import Graph
    rng = np.random.default_rng(seed)
    g = Graph("stack")
    in_s = 2.0 ** rng.uniform(-4, 0)
    g.add_input("x", TensorType((1, width), "int8", q(in_s, zin)))
    prev, prev_s = "x", in_s
    for d in range(depth):
        act = "relu" if d < depth - 1 else "none"
        zout = -128 if act == "relu" else int(rng.integers(-128, 128))
        consts, out_q = _dense_layer(rng, f"l{d}", prev, width, width, prev_s, scales, rng.uniform(-9, -2), zout, act)
        for n, t, v in consts:
            g.add_const(n, np.asarray(v, t.dtype), t.quant)
        g.add_node("dense", [prev, f"l{d}_w", f"l{d}_b"], {"activation": act}, name=f"y{d}",
                   out_type=TensorType((1, width), "int8", out_q))
        prev, prev_s = f"y{d}", out_q.scale[0]
    g.outputs = [prev]
    got, want = compare(g, [i8(rng, (1, width))])
    assert_same(got, want, f"{depth} dense layers, {scales} scales")


@settings(**SETTINGS)
@given(h=st.integers(1, 9), w=st.integers(1, 9), c=st.integers(1, 4), ph=st.integers(1, 4), pw=st.integers(1, 4),
       sh=st.integers(1, 3), sw=st.integers(1, 3), padding=st.sampled_from(["same", "valid"]),
       kind=st.sampled_from(["avg_pool2d", "max_pool2d"]), z=zp, ls=log_scale, seed=st.integers(0, 2 ** 31))
def test_pooling(h, w, c, ph, pw, sh, sw, padding, kind, z, ls, seed):
    rng = np.random.default_rng(seed)
    if padding == "valid":
        ph, pw = min(ph, h), min(pw, w)
    g = single_op(kind, [("x", TensorType((1, h, w, c), "int8", q(2.0 ** ls, z)), None)],
                  dict(pool=[ph, pw], stride=[sh, sw], padding=padding), q(2.0 ** ls, z))
    got, want = compare(g, [i8(rng, (1, h, w, c))])
    assert_same(got, want, kind)


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), bcast=st.booleans(),
       op=st.sampled_from(["add", "mul"]), z1=zp, z2=zp, zo=zp, l1=log_scale, l2=log_scale, lo=log_scale,
       seed=st.integers(0, 2 ** 31))
def test_add_mul(shape, bcast, op, z1, z2, zo, l1, l2, lo, seed):
    rng = np.random.default_rng(seed)
    shape2 = tuple(1 if (bcast and i % 2 == 0) else s for i, s in enumerate(shape))
    if op == "mul":
        lo = l1 + l2 + rng.uniform(3, 7)
    else:
        lo = max(l1, l2) + rng.uniform(-1, 2)
    g = single_op(op, [("a", TensorType(tuple(shape), "int8", q(2.0 ** l1, z1)), None),
                       ("b", TensorType(shape2, "int8", q(2.0 ** l2, z2)), None)], {}, q(2.0 ** lo, zo))
    got, want = compare(g, [i8(rng, tuple(shape)), i8(rng, shape2)])
    assert_same(got, want, op)


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 12), min_size=1, max_size=3), z=zp, ls=st.floats(-8.0, 0.0),
       op=st.sampled_from(["softmax", "sigmoid", "tanh", "relu", "relu6"]), zo=zp, lo=st.floats(-8.0, 0.0),
       seed=st.integers(0, 2 ** 31))
def test_activations(shape, z, ls, op, zo, lo, seed):
    rng = np.random.default_rng(seed)
    if op in ("softmax", "sigmoid"):
        out = q(1.0 / 256, -128)
    elif op == "tanh":
        out = q(1.0 / 128, 0)
    else:
        out = q(2.0 ** lo, zo)
    attrs = {"axis": -1} if op == "softmax" else {}
    g = single_op(op, [("x", TensorType(tuple(shape), "int8", q(2.0 ** ls, z)), None)], attrs, out)
    got, want = compare(g, [i8(rng, tuple(shape))])
    assert_same(got, want, op)


@settings(**SETTINGS)
@given(h=st.integers(1, 8), w=st.integers(1, 8), c=st.integers(1, 5), keep=st.booleans(),
       axes=st.sampled_from([[1, 2], [1], [2], [3], [1, 2, 3]]), z=zp, zo=zp, ls=log_scale, dl=st.floats(-1, 1),
       seed=st.integers(0, 2 ** 31))
def test_mean(h, w, c, keep, axes, z, zo, ls, dl, seed):
    rng = np.random.default_rng(seed)
    g = single_op("mean", [("x", TensorType((1, h, w, c), "int8", q(2.0 ** ls, z)), None)],
                  {"axes": axes, "keepdims": keep}, q(2.0 ** (ls + dl), zo))
    got, want = compare(g, [i8(rng, (1, h, w, c))])
    assert_same(got, want, f"mean {axes}")


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(), z=zp, ls=log_scale,
       seed=st.integers(0, 2 ** 31))
def test_pad_concat_reshape(shape, data, z, ls, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    t = TensorType(shape, "int8", q(2.0 ** ls, z))
    pads = data.draw(st.lists(st.integers(0, 3), min_size=2 * len(shape), max_size=2 * len(shape)))
    g = single_op("pad", [("x", t, None)], {"pads": pads}, t.quant)
    got, want = compare(g, [i8(rng, shape)])
    assert_same(got, want, "pad")
    axis = data.draw(st.integers(0, len(shape) - 1))
    shape2 = tuple(s + 1 if i == axis else s for i, s in enumerate(shape))
    g = single_op("concat", [("a", t, None), ("b", TensorType(shape2, "int8", t.quant), None)], {"axis": axis}, t.quant)
    got, want = compare(g, [i8(rng, shape), i8(rng, shape2)])
    assert_same(got, want, "concat")
    g = single_op("reshape", [("x", t, None)], {"shape": [-1]}, t.quant)
    got, want = compare(g, [i8(rng, shape)])
    assert_same(got, want, "reshape")


@settings(**SETTINGS)
@given(n=st.integers(1, 50), ls=st.floats(-10.0, 3.0), z=zp, lo=st.floats(-10.0, 3.0), zo=zp,
       seed=st.integers(0, 2 ** 31))
def test_quantize_requantize_dequantize(n, ls, z, lo, zo, seed):
    rng = np.random.default_rng(seed)
    s = 2.0 ** ls
    x = (rng.normal(0, 100 * s, n)).astype(np.float32)
    x[: n // 3] = (np.round(x[: n // 3] / np.float32(s)) + 0.5) * np.float32(s)   # exact ties
    g = single_op("quantize", [("x", TensorType((n,), "float32"), None)],
                  {"scale": [float(np.float32(s))], "zero_point": [z]}, q(s, z))
    got, want = compare(g, [x])
    assert_same(got, want, "quantize")
    g = single_op("quantize", [("x", TensorType((n,), "int8", q(s, z)), None)],
                  {"scale": [float(np.float32(2.0 ** lo))], "zero_point": [zo]}, q(2.0 ** lo, zo))
    got, want = compare(g, [i8(rng, (n,))])
    assert_same(got, want, "requantize")
    g = single_op("dequantize", [("x", TensorType((n,), "int8", q(s, z)), None)], {}, None, out_dtype="float32")
    got, want = compare(g, [i8(rng, (n,))])
    assert_same(got, want, "dequantize")
