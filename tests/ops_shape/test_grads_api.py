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


def test_upsample_and_embedding_modules():
    """kiln.nn.Upsample follows PyTorch's align_corners convention; Embedding gathers rows."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(2).standard_normal((1, 3, 4, 2)).astype(np.float32)
    for kw in (dict(scale_factor=2, mode="bilinear"), dict(size=(5, 7), mode="bilinear", align_corners=True),
               dict(scale_factor=2, mode="nearest")):
        m = kiln.nn.Upsample(**kw)
        with F.eager():
            got = m(x)
        tkw = {k: v for k, v in kw.items() if k != "mode"}
        want = torch.nn.functional.interpolate(torch.tensor(x).permute(0, 3, 1, 2), mode=kw["mode"], **tkw)
        np.testing.assert_allclose(got, want.permute(0, 2, 3, 1).numpy(), rtol=1e-5, atol=1e-6, err_msg=str(kw))
    emb = kiln.nn.Embedding(6, 3)
    ids = np.asarray([[5, 0], [2, 2]], np.int32)
    with F.eager():
        np.testing.assert_array_equal(emb(ids), emb.weight.data[ids])
    with pytest.raises(kiln.KilnError, match="exactly one of size and scale_factor"):
        kiln.nn.Upsample()
