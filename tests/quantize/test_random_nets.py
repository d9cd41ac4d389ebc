"""Random small float networks (conv, depthwise, pooling, residual add, mul, concat, pad, mean,
dense, softmax/sigmoid/tanh), quantised by PTQ and exported: LiteRT's reference kernels give the
same bits as Kiln's int8 reference."""
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.frontend import Graph, TensorType, run
from kiln.quantize import export_tflite, ptq

from .litert_util import assert_same, litert_run

EXAMPLES = int(os.environ.get("KILN_PROPERTY_EXAMPLES", 25))


class Builder:
    def __init__(self, rng, shape):
        self.g = Graph("random_net")
        self.rng = rng
        self.x = self.g.add_input("x", TensorType(shape))

    def w(self, shape, scale=None):
        fan = int(np.prod(shape[1:]))
        return self.g.add_param(self.g.fresh("w"), (self.rng.normal(0, scale or 1.0 / np.sqrt(fan), shape)).astype(np.float32))

    def node(self, op, inputs, **attrs):
        return self.g.add_node(op, inputs, attrs)

    def shape(self, v):
        return self.g.types[v].shape

    def conv(self, v, cout, k, stride=1, act="relu", depthwise=False, padding="same"):
        c = self.shape(v)[-1]
        if depthwise:
            w = self.w((c * cout, k, k, 1))
            b = self.w((c * cout,), 0.1)
            return self.node("conv2d", [v, w, b], stride=[stride, stride], padding=padding, groups=c, activation=act)
        w, b = self.w((cout, k, k, c)), self.w((cout,), 0.1)
        return self.node("conv2d", [v, w, b], stride=[stride, stride], padding=padding, activation=act)


@st.composite
def nets(draw):
    seed = draw(st.integers(0, 2 ** 31))
    rng = np.random.default_rng(seed)
    h, w, c = draw(st.integers(4, 9)), draw(st.integers(4, 9)), draw(st.integers(1, 4))
    b = Builder(rng, (1, h, w, c))
    v = b.x
    per_channel = draw(st.booleans())
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["conv", "dw", "avg", "max", "res", "mul", "concat", "pad"]))
        H, W, C = b.shape(v)[1:]
        if kind == "conv":
            v = b.conv(v, draw(st.integers(1, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 2)),
                       draw(st.sampled_from(["none", "relu", "relu6"])))
        elif kind == "dw":
            v = b.conv(v, draw(st.integers(1, 2)), 3, 1, draw(st.sampled_from(["none", "relu"])), depthwise=True)
        elif kind in ("avg", "max") and min(H, W) >= 2:
            v = b.node("avg_pool2d" if kind == "avg" else "max_pool2d", [v], pool=[2, 2], stride=[2, 2],
                       padding=draw(st.sampled_from(["same", "valid"])))
        elif kind == "res":
            y = b.conv(v, C, 3, 1, "none")
            v = b.node("relu", [b.node("add", [v, y])])
        elif kind == "mul":
            y = b.conv(v, C, 1, 1, "none")
            v = b.node("mul", [v, y])
        elif kind == "concat":
            v = b.node("concat", [b.conv(v, 2, 1, 1, "relu"), b.conv(v, 3, 3, 1, "none")], axis=3)
        elif kind == "pad":
            v = b.node("pad", [v], pads=[0, 0, 1, 0, 0, 1, 0, 0])
    head = draw(st.sampled_from(["mean", "dense"] if per_channel else ["mean"]))
    if head == "mean":
        v = b.node("mean", [v], axes=[1, 2], keepdims=False)
    else:
        n = int(np.prod(b.shape(v)[1:]))
        v = b.node("reshape", [v], shape=[1, n])
        v = b.node("dense", [v, b.w((5, n)), b.w((5,), 0.1)], activation="none")
    final = draw(st.sampled_from(["none", "softmax", "sigmoid", "tanh"]))
    if final == "softmax":
        v = b.node("softmax", [v], axis=-1)
    elif final != "none":
        v = b.node(final, [v])
    b.g.outputs = [v]
    method = draw(st.sampled_from(["minmax", "percentile", "mse"]))
    return b.g, per_channel, method, draw(st.booleans()), rng


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nets())
def test_random_quantised_nets_match_litert(case):
    g, per_channel, method, int8_io, rng = case
    shape = g.types["x"].shape
    calib = rng.normal(0, 1, (24,) + shape[1:]).astype(np.float32)
    q = ptq(g, calib, per_channel=per_channel, method=method, int8_io=int8_io)
    data = export_tflite(q)
    for _ in range(3):
        x = rng.normal(0, 1, shape).astype(np.float32)
        if int8_io:
            qq = q.types[q.inputs[0]].quant
            x = np.clip(np.round(x / qq.scale[0]) + qq.zero_point[0], -128, 127).astype(np.int8)
        assert_same(run(q, x)[0], litert_run(data, [x])[0], f"net {[n.op for n in q.nodes]}")
