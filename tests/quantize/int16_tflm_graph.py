"""A 16x8 graph with every int16 kernel added for TensorFlow Lite Micro's models (every
intermediate is an output): SUB, LEAKY_RELU (positive and negative alpha), MAXIMUM, MINIMUM,
ABS, SQUARED_DIFFERENCE, PRELU (int8 alpha), SUM, BATCH_MATMUL, TRANSPOSE_CONV and QUANTIZE to
and from int32."""
import numpy as np

from kiln.frontend import Graph, QParams, TensorType


def q(s, z=0):
    return QParams((float(np.float32(s)),), (int(z),))


def tflm_graph(rng):
    g = Graph("tflm16")
    g.add_input("x", TensorType((2, 3, 20), "int16", q(2.0 ** -11)))
    g.add_input("y", TensorType((2, 1, 20), "int16", q(7e-4)))
    g.add_input("z", TensorType((2, 3, 20), "int32", q(1.49e-7)))

    def node(op, ins, out_q, name, attrs=None, shape=(2, 3, 20), dt="int16"):
        g.add_node(op, ins, attrs or {}, name=name, out_type=TensorType(shape, dt, out_q))
        g.outputs.append(name)
    node("sub", ["x", "y"], q(1.3e-3), "s")
    node("leaky_relu", ["s"], q(9e-4), "lr", {"alpha": 0.2})
    node("leaky_relu", ["x"], q(2.0 ** -11), "lrn", {"alpha": -0.25})
    node("maximum", ["x", "x"], q(2.0 ** -11), "mx")
    node("minimum", ["s", "lr"], q(1.3e-3), "mn")      # different scales: TFLite compares the codes
    node("abs", ["s"], q(1.7e-3), "ab")
    node("squared_difference", ["x", "y"], q(3e-3), "sd")
    g.add_const("alpha", rng.integers(-128, 128, (20,)).astype(np.int8), q(0.01, -3))
    node("prelu", ["s", "alpha"], q(1.1e-3, 4), "pr")
    node("sum", ["s"], q(2e-2), "sm", {"axes": [2], "keepdims": False}, shape=(2, 3))
    g.add_const("w", rng.integers(-32768, 32768, (20, 4)).astype(np.int16), q(1e-4))
    node("matmul", ["x", "w"], q(2.0 ** -11 * 1e-4 * 4e4), "mm", shape=(2, 3, 4))
    g.add_node("reshape", ["x"], {"shape": [1, 6, 5, 4]}, name="x4", out_type=TensorType((1, 6, 5, 4), "int16",
                                                                                      q(2.0 ** -11)))
    g.add_const("tw", rng.integers(-127, 128, (3, 2, 3, 4)).astype(np.int8), QParams((0.01, 0.02, 0.015), (0, 0, 0), 0))
    g.add_const("tb", rng.integers(-(1 << 34), 1 << 34, (3,)).astype(np.int64), QParams((1e-6, 2e-6, 1.5e-6), (0, 0, 0), 0))
    node("transpose_conv2d", ["x4", "tw", "tb"], q(0.02), "tc",
         {"stride": [2, 2], "padding": "same", "output_shape": [1, 12, 10, 3], "activation": "none"},
         shape=(1, 12, 10, 3))
    node("quantize", ["x"], q(1.49e-7), "q32", {"scale": [1.49e-7], "zero_point": [0], "dtype": "int32"}, dt="int32")
    node("quantize", ["z"], q(9.2e-4), "q16", {"scale": [9.2e-4], "zero_point": [0], "dtype": "int16"})
    return g


def tflm_feeds(rng):
    x = rng.integers(-32768, 32768, (2, 3, 20)).astype(np.int16)
    y = rng.integers(-32768, 32768, (2, 1, 20)).astype(np.int16)
    z = rng.integers(-(1 << 28), 1 << 28, (2, 3, 20)).astype(np.int32)
    return [x, y, z]
