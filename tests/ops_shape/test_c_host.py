"""The data-movement and reduction ops compiled by the C backend (-Wall -Wextra -Werror) and run
on the host: int8 bit-exact with Kiln's int8 reference (which the LiteRT tests tie to TFLite),
float within 1e-5 of the NumPy reference."""
import numpy as np
import pytest

import kiln.quantize  # noqa: F401  (int8 references)
from kiln.backends import compile as compile_pkg
from kiln.frontend import Graph, QParams, TensorType, run

RNG = np.random.default_rng(11)


def q(scale, zp):
    return QParams((float(np.float32(scale)),), (zp,))


X = (1, 5, 6, 4)
_RESIZE = [dict(size=[9, 11], mode="bilinear", half_pixel_centers=True),
           dict(size=[3, 4], mode="bilinear"), dict(size=[8, 13], mode="bilinear", align_corners=True),
           dict(size=[10, 7], mode="nearest"), dict(size=[4, 9], mode="nearest", align_corners=True),
           dict(size=[7, 7], mode="nearest", half_pixel_centers=True)]


def _nodes(idx):
    return [("transpose", ["x"], {"perm": [0, 3, 1, 2]}),
            ("slice", ["x"], {"begin": [0, 4, 0, 3], "end": [1, -1, 6, 0], "strides": [1, -2, 2, -1]}),
            ("gather", ["x", idx], {"axis": 2}), ("gather", ["x", idx], {"axis": -1}),
            ("max", ["x"], {"axes": [1, 2], "keepdims": True}), ("min", ["x"], {"axes": [3]})] + \
        [("resize", ["x"], a) for a in _RESIZE]


def _graph(dtype):
    g = Graph(f"shape_{dtype}")
    xq = q(0.05, 3) if dtype == "int8" else None
    g.add_input("x", TensorType(X, dtype, xq))
    g.add_const("idx", np.asarray([[5, 0], [2, 2], [3, 1]], np.int32))
    g.add_const("idx1", np.asarray([3, 0, 1], np.int32))
    outs = []
    from kiln.frontend.registry import get_op
    for k, (op, ins, attrs) in enumerate(_nodes("idx")):
        if op == "gather" and attrs["axis"] == -1:
            ins = ["x", "idx1"]
        a = get_op(op).normalize_attrs(attrs)
        t = get_op(op).infer([g.types[v] for v in ins], a)
        outs.append(g.add_node(op, ins, a, name=f"{op}_{k}", out_type=TensorType(t.shape, dtype, xq)))
    for k, (op, axis) in enumerate([("argmax", 1), ("argmin", -1), ("argmax", 3)]):
        shape = tuple(n for i, n in enumerate(X) if i != axis % 4)
        outs.append(g.add_node(op, ["x"], {"axis": axis}, name=f"{op}_a{k}", out_type=TensorType(shape, "int32")))
    lq = q(1.0 / 128, 0) if dtype == "int8" else None
    outs.append(g.add_node("l2_normalize", ["x"], {}, name="l2", out_type=TensorType(X, dtype, lq)))
    g.add_const("zeros", np.zeros((2, 4), dtype), xq)
    outs.append(g.add_node("l2_normalize", ["zeros"], {}, name="l2_zero", out_type=TensorType((2, 4), dtype, lq)))
    if dtype == "float32":
        outs.append(g.add_node("cumsum", ["x"], {"axis": 2, "reverse": True}, name="cumsum"))
        outs.append(g.add_node("cumsum", ["x"], {"axis": 0, "exclusive": True}, name="cumsum_x"))
    for k, (axes, keep, oq) in enumerate([([1, 2], False, q(0.3, -7)), ([3], True, q(0.05, 3)),
                                          ([0, 1, 2, 3], False, q(1.7, 20)), ([2], False, q(0.01, 0))]):
        shape = tuple(1 if i in axes else n for i, n in enumerate(X) if keep or i not in axes)
        outs.append(g.add_node("sum", ["x"], {"axes": axes, "keepdims": keep}, name=f"sum_{k}",
                               out_type=TensorType(shape, dtype, oq if dtype == "int8" else None)))
    g.outputs = outs
    return g


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_shape_ops_on_the_host(dtype, tmp_path):
    g = _graph(dtype)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    for _ in range(3):
        x = RNG.integers(-128, 128, X).astype(np.int8) if dtype == "int8" else RNG.standard_normal(X).astype(np.float32)
        for name, w, gt in zip(g.outputs, run(g, x), pkg.run(x)):
            assert gt.shape == w.shape and gt.dtype == w.dtype, name
            if gt.dtype != np.float32:
                np.testing.assert_array_equal(gt, w, err_msg=name)
            else:
                np.testing.assert_allclose(gt, w, rtol=1e-5, atol=1e-5, err_msg=name)


def test_int8_l2_normalize_rows_on_the_host(tmp_path):
    """Rows from all-zero (sum <= 1) and one-hot to long full-range rows (sums near 2^24, or
    past 2^29 with 9000 elements, where the kernel divides by 4 first)."""
    g = Graph("l2")
    for name, shape, zp in (("a", (8, 5), 0), ("b", (3, 300), -128), ("c", (1, 9000), -128)):
        g.add_input(name, TensorType(shape, "int8", q(0.02, zp)))
        g.add_node("l2_normalize", [name], {}, name=f"y_{name}", out_type=TensorType(shape, "int8", q(1 / 128, 0)))
    g.outputs = ["y_a", "y_b", "y_c"]
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    a = np.zeros((8, 5), np.int8)
    a[1, 2], a[2, :] = 1, -1
    a[3:] = RNG.integers(-128, 128, (5, 5))
    b = RNG.integers(-128, 128, (3, 300)).astype(np.int8)
    b[0] = 127
    c = np.full((1, 9000), 127, np.int8)
    feeds = [a, b, c]
    assert int(((c.astype(np.int64) + 128) ** 2).sum()) >= 1 << 29
    for name, w, gt in zip(g.outputs, run(g, *feeds), pkg.run(*feeds)):
        np.testing.assert_array_equal(gt, w, err_msg=name)
