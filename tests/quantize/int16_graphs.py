"""Two 16x8 graphs that exercise every int16 kernel (every intermediate is an output): linear and
window ops (conv, depthwise, pools, dense, int64 biases incl. ones beyond int32), and element-wise,
softmax, mean, data movement and (de)quantisation."""
import numpy as np

from kiln.frontend import Graph, QParams, TensorType
from kiln.frontend.ops.nn import conv_geometry


def q(s, z=0):
    return QParams((float(np.float32(s)),), (int(z),))


def linear_graph(rng):
    g = Graph("linear16")
    g.add_input("x", TensorType((1, 6, 5, 4), "int16", q(1e-3)))

    def conv(name, src, O, KH, KW, I, act, groups=1, big_bias=False, **a):
        w = rng.integers(-127, 128, (O, KH, KW, I)).astype(np.int8)
        ws = tuple(float(np.float32(s)) for s in rng.uniform(0.002, 0.02, O))
        g.add_const(name + "_w", w, QParams(ws, (0,) * O, 0))
        lim = 1 << 33 if big_bias else 1 << 20
        g.add_const(name + "_b", rng.integers(-lim, lim, O).astype(np.int64),
                    QParams(tuple(float(np.float32(1e-3 * s)) for s in ws), (0,) * O, 0))
        aa = dict(a, groups=groups, activation=act)
        G = conv_geometry(g.types[src].shape, (O, KH, KW, I), {"stride": [1, 1], "padding": "valid",
                                                               "dilation": [1, 1], **aa})
        g.add_node("conv2d", [src, name + "_w", name + "_b"], aa, name=name,
                   out_type=TensorType((1, G["oh"], G["ow"], O), "int16", q(rng.uniform(0.02, 0.2))))
        g.outputs.append(name)
        return name
    c1 = conv("c1", "x", 8, 3, 3, 4, "relu", padding="same")
    conv("c2", "x", 6, 3, 3, 4, "none", padding="same", stride=[2, 2], big_bias=True)
    dw = conv("dw", c1, 8, 3, 3, 1, "relu6", groups=8, padding="same")
    dq = g.types[dw].quant
    g.add_node("avg_pool2d", [dw], {"pool": [2, 2], "padding": "same"}, name="ap",
               out_type=TensorType((1, 3, 3, 8), "int16", dq))
    g.add_node("max_pool2d", [dw], {"pool": [2, 2], "padding": "valid"}, name="mp",
               out_type=TensorType((1, 3, 2, 8), "int16", dq))
    g.add_node("reshape", ["ap"], {"shape": [1, 72]}, name="fl", out_type=TensorType((1, 72), "int16", dq))
    g.add_const("fw", rng.integers(-127, 128, (10, 72)).astype(np.int8), q(0.01))
    g.add_const("fb", rng.integers(-5000, 5000, 10).astype(np.int64), q(0.01 * dq.scale[0]))
    g.add_node("dense", ["fl", "fw", "fb"], {"activation": "none"}, name="fc",
               out_type=TensorType((1, 10), "int16", q(0.05)))
    g.outputs += ["ap", "mp", "fc"]
    # an accumulator beyond int32: 64 channels saturated at 32767, then a 3x3 conv of +127 weights
    # (576 * 127 * 32767 > 2^31): the C kernel accumulates in int64 there
    g.add_const("sat_w", np.full((64, 1, 1, 4), 127, np.int8), q(0.01))
    g.add_const("sat_b", np.full(64, 1 << 40, np.int64), q(1e-5))
    g.add_node("conv2d", ["x", "sat_w", "sat_b"], {"activation": "none"}, name="sat",
               out_type=TensorType((1, 6, 5, 64), "int16", q(1e-3)))
    g.add_const("wide_w", np.full((2, 3, 3, 64), 127, np.int8), q(0.01))
    g.add_node("conv2d", ["sat", "wide_w"], {"activation": "none", "padding": "same"}, name="wide",
               out_type=TensorType((1, 6, 5, 2), "int16", q(1e-3 * 0.01 * 3e6)))
    g.outputs += ["sat", "wide"]
    return g


def elementwise_graph():
    g = Graph("elementwise16")
    g.add_input("x", TensorType((2, 3, 20), "int16", q(2.0 ** -11)))
    g.add_input("y", TensorType((2, 1, 20), "int16", q(7e-4)))

    def add(op, ins, out_q, name, attrs=None, shape=(2, 3, 20), dt="int16"):
        g.add_node(op, ins, attrs or {}, name=name, out_type=TensorType(shape, dt, out_q))
        g.outputs.append(name)
    add("add", ["x", "y"], q(1.1e-3), "a")
    add("mul", ["x", "y"], q(2.0 ** -11 * 7e-4 * 3000), "m")
    add("relu", ["x"], q(2.0 ** -11), "r")
    add("relu6", ["x"], q(3e-4), "r6")
    add("sigmoid", ["x"], q(1 / 32768), "sg")       # power-of-two input scale
    add("sigmoid", ["a"], q(1 / 32768), "sg2")      # general input scale
    add("tanh", ["x"], q(1 / 32768), "th")
    add("tanh", ["a"], q(1 / 32768), "th2")
    add("softmax", ["a"], q(1 / 32768), "sm", {"axis": -1})
    add("mean", ["a"], q(5e-4), "mn", {"axes": [2], "keepdims": False}, shape=(2, 3))
    aq = g.types["a"].quant
    add("pad", ["a"], aq, "pd", {"pads": [0, 0, 1, 1, 2, 0], "value": 0.0}, shape=(2, 5, 22))
    add("concat", ["a", "a"], aq, "cc", {"axis": 1}, shape=(2, 6, 20))
    add("quantize", ["a"], q(0.02, 3), "q8", {"scale": [0.02], "zero_point": [3], "dtype": "int8"}, dt="int8")
    add("quantize", ["q8"], q(4e-4), "q16", {"scale": [4e-4], "zero_point": [0], "dtype": "int16"})
    add("dequantize", ["a"], None, "dq", {"dtype": "float32"}, dt="float32")
    return g


def i16(rng, shape):
    return rng.integers(-32768, 32768, shape).astype(np.int16)
