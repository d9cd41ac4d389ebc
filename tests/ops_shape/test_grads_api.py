"""Gradients of resize, gather, min and negative-stride slices against float64 finite
differences, and the functional API (traced and eager)."""
import numpy as np
import pytest

import kiln
from kiln.frontend import Graph, TensorType
from kiln.frontend import functional as F


def _graph(op, attrs, shape, const=None):
    g = Graph(op)
    g.add_input("x", TensorType(shape, "float64"))
    ins = ["x"]
    if const is not None:
        g.add_const("i", const)
        ins.append("i")
    g.add_node(op, ins, attrs, name="y")
    g.outputs = ["y"]
    return g


@pytest.mark.parametrize("op, attrs, shape, const", [
    ("resize", dict(size=[5, 7], mode="bilinear", half_pixel_centers=True), (1, 3, 4, 2), None),
    ("resize", dict(size=[2, 3], mode="bilinear", align_corners=True), (2, 4, 5, 1), None),
    ("resize", dict(size=[6, 5], mode="nearest"), (1, 3, 4, 2), None),
    ("gather", dict(axis=1), (2, 4, 3), np.asarray([[3, 0], [3, 1]], np.int32)),
    ("min", dict(axes=[1], keepdims=False), (3, 4), None),
    ("slice", dict(begin=[2, 3], end=[-1, 0], strides=[-1, -2]), (3, 5), None),
    ("cumsum", dict(axis=1, exclusive=True), (2, 4), None),
    ("l2_normalize", {}, (3, 4), None),
    ("cumsum", dict(axis=0, reverse=True), (3, 2), None),
])
def test_grads(op, attrs, shape, const):
    g = _graph(op, attrs, shape, const)
    x = np.random.default_rng(0).standard_normal(shape)
    kiln.check_grads(g, [x])


def test_functional_api_traced_and_eager():
    x = np.random.default_rng(1).standard_normal((1, 4, 6, 3)).astype(np.float32)

    def f(t):
        y = F.resize(t, (8, 12), mode="bilinear", half_pixel_centers=True)
        y = F.gather(y, [0, 2, 1], axis=3)
        return F.min(y, axis=[1, 2]), F.transpose(y, [0, 3, 1, 2])[:, :, ::2]

    g = kiln.trace(f, x)
    got = kiln.run(g, x)
    with F.eager():
        want = f(x)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert [n.op for n in g.nodes] == ["resize", "gather", "min", "transpose", "slice"]
