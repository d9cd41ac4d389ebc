"""Data-movement builtins against LiteRT's reference kernels, int8 bit for bit and float32:
TRANSPOSE, STRIDED_SLICE (masks, negative strides), SLICE, SQUEEZE, EXPAND_DIMS, SPLIT, SPLIT_V,
PACK, UNPACK, GATHER, RESIZE_NEAREST_NEIGHBOR, RESIZE_BILINEAR."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.frontend import run
from kiln.frontend.ops.movement import strided_slice_plan
from kiln.frontend.tflite_import import TFLiteImportError, load_tflite

from .util import check, feed, one_op

SETTINGS = dict(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 40)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
DT = st.sampled_from(["int8", "float32"])
QP = st.tuples(st.floats(1e-3, 2.0), st.integers(-128, 127))
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@settings(**SETTINGS)
@given(shape=shapes, dtype=DT, qp=QP, data=st.data(), seed=st.integers(0, 2 ** 31))
def test_transpose(shape, dtype, qp, data, seed):
    perm = data.draw(st.permutations(range(len(shape))))
    out = [shape[p] for p in perm]
    buf = one_op("TRANSPOSE", shape, dtype, qp, [("perm", np.asarray(perm, np.int32))], [out],
                 "TransposeOptions")
    check(buf, [feed(np.random.default_rng(seed), shape, dtype)], f"TRANSPOSE {shape} {perm}")


def _entry(draw, n):
    b = draw(st.integers(-n - 2, n + 2))
    e = draw(st.integers(-n - 2, n + 2))
    s = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
    return b, e, s


@settings(**SETTINGS)
@given(shape=shapes, dtype=DT, qp=QP, data=st.data(), seed=st.integers(0, 2 ** 31))
def test_strided_slice(shape, dtype, qp, data, seed):
    """Random begin/end/strides (negative, out of range) with begin, end and shrink masks, and
    specs shorter than the rank."""
    n = data.draw(st.integers(1, len(shape)))
    spec = [_entry(data.draw, shape[i]) for i in range(n)]
    bm, em, sm = (data.draw(st.integers(0, 2 ** n - 1)) for _ in range(3))
    b, e, s = ([t[j] for t in spec] for j in range(3))
    plan, why = strided_slice_plan(shape, b, e, s, bm, em, 0, 0, sm)
    if plan is None:
        return                             # Kiln refuses it with a named reason (tested below)
    consts = [(w, np.asarray(v, np.int32)) for w, v in (("begin", b), ("end", e), ("strides", s))]
    buf = one_op("STRIDED_SLICE", shape, dtype, qp, consts, [plan[3]], "StridedSliceOptions",
                 BeginMask=bm, EndMask=em, EllipsisMask=0, NewAxisMask=0, ShrinkAxisMask=sm)
    check(buf, [feed(np.random.default_rng(seed), shape, dtype)], f"STRIDED_SLICE {shape} {spec} {bm} {em} {sm}")


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_strided_slice_reverse_and_every_other(dtype):
    shape = [2, 6, 5, 3]
    b, e, s = [0, -1, 0, 0], [0, 0, 0, 0], [1, -1, 2, -1]
    plan, _ = strided_slice_plan(shape, b, e, s, 0b1001, 0b1111, 0, 0, 0)
    assert plan[3] == [2, 6, 3, 3]
    consts = [(w, np.asarray(v, np.int32)) for w, v in (("begin", b), ("end", e), ("strides", s))]
    buf = one_op("STRIDED_SLICE", shape, dtype, (0.1, 5), consts, [plan[3]], "StridedSliceOptions",
                 BeginMask=0b1001, EndMask=0b1111)
    x = feed(np.random.default_rng(1), shape, dtype)
    g = check(buf, [x], "reverse")
    np.testing.assert_array_equal(run(g, x)[0], x[:, ::-1, ::2, ::-1])


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_strided_slice_new_axis_and_ellipsis(dtype):
    """x[..., None, 1] (ellipsis, new axis, shrink) as Kiln's plan reads it: LiteRT agrees where
    its kernel implements the masks, and Kiln's result equals NumPy's indexing either way."""
    shape = [2, 3, 4]
    plan, why = strided_slice_plan(shape, [0, 0, 1], [0, 0, 2], [1, 1, 1], 0, 0, 0b001, 0b010, 0b100)
    assert why is None and plan[3] == [2, 3, 1]
    consts = [(w, np.asarray(v, np.int32)) for w, v in (("begin", [0, 0, 1]), ("end", [0, 0, 2]),
                                                        ("strides", [1, 1, 1]))]
    buf = one_op("STRIDED_SLICE", shape, dtype, (0.1, 5), consts, [plan[3]], "StridedSliceOptions",
                 EllipsisMask=1, NewAxisMask=2, ShrinkAxisMask=4)
    x = feed(np.random.default_rng(2), shape, dtype)
    g = check(buf, [x], "ellipsis")
    np.testing.assert_array_equal(run(g, x)[0], x[..., None, 1])


def test_strided_slice_refusals_name_the_reason():
    shape = [4, 4]
    for args, msg in [(([0, 0], [1, 1], [1, 0]), "contain 0"),
                      (([5, 0], [6, 1], [1, 1], 0, 0, 0, 0, 1), "shrink index 5 is out of range"),
                      (([0, 0], [1, 1], [-1, 1], 0, 0, 0, 0, 1), "negative stride")]:
        b, e, s, *m = args
        m = (m + [0] * 5)[:5]
        plan, why = strided_slice_plan(shape, b, e, s, *m)
        assert plan is None and msg in why
    buf = one_op("STRIDED_SLICE", shape, "float32", None, [("b", np.asarray([0, 0], np.int32)),
                 ("e", np.asarray([1, 1], np.int32)), ("s", np.asarray([1, 0], np.int32))], [[1, 1]],
                 "StridedSliceOptions")
    with pytest.raises(TFLiteImportError, match=r"operator 0 \(STRIDED_SLICE\): strides \[1, 0\] contain 0"):
        load_tflite(buf)


@settings(**SETTINGS)
@given(shape=shapes, dtype=DT, qp=QP, data=st.data(), seed=st.integers(0, 2 ** 31))
def test_slice(shape, dtype, qp, data, seed):
    b = [data.draw(st.integers(0, n - 1)) for n in shape]
    size = [data.draw(st.sampled_from([-1, n - bb, max(1, (n - bb) // 2)])) for bb, n in zip(b, shape)]
    out = [n - bb if sz == -1 else sz for bb, sz, n in zip(b, size, shape)]
    buf = one_op("SLICE", shape, dtype, qp, [("begin", np.asarray(b, np.int32)), ("size", np.asarray(size, np.int32))],
                 [out], "SliceOptions")
    check(buf, [feed(np.random.default_rng(seed), shape, dtype)], f"SLICE {shape} {b} {size}")


@settings(**SETTINGS)
@given(shape=st.lists(st.sampled_from([1, 1, 2, 3]), min_size=1, max_size=5), dtype=DT, qp=QP, data=st.data(),
       seed=st.integers(0, 2 ** 31))
def test_squeeze_and_expand_dims(shape, dtype, qp, data, seed):
    ones = [i for i, n in enumerate(shape) if n == 1]
    dims = data.draw(st.lists(st.sampled_from(ones), unique=True)) if ones else []
    drop = set(dims) if dims else set(ones)
    out = [n for i, n in enumerate(shape) if i not in drop]
    x = feed(np.random.default_rng(seed), shape, dtype)
    check(one_op("SQUEEZE", shape, dtype, qp, [], [out], "SqueezeOptions", SqueezeDims=dims), [x], f"SQUEEZE {dims}")
    if len(shape) < 5:
        ax = data.draw(st.integers(-len(shape) - 1, len(shape)))
        a = ax % (len(shape) + 1)
        check(one_op("EXPAND_DIMS", shape, dtype, qp, [("axis", np.asarray([ax], np.int32))],
                     [shape[:a] + [1] + shape[a:]], "ExpandDimsOptions"), [x], f"EXPAND_DIMS {ax}")


@settings(**SETTINGS)
@given(shape=shapes, dtype=DT, qp=QP, data=st.data(), seed=st.integers(0, 2 ** 31))
def test_split_split_v_unpack(shape, dtype, qp, data, seed):
    ax = data.draw(st.integers(0, len(shape) - 1))
    x = feed(np.random.default_rng(seed), shape, dtype)
    n = shape[ax]
    num = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    outs = [shape[:ax] + [n // num] + shape[ax + 1:]] * num
    check(one_op("SPLIT", shape, dtype, qp, [("axis", np.asarray(ax - len(shape), np.int32))], outs, "SplitOptions",
                 inputs_first=False, NumSplits=num), [x], f"SPLIT {num} on {ax}")
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [n])]
    infer = data.draw(st.integers(-1, len(sizes) - 1))
    given_sizes = [-1 if j == infer else v for j, v in enumerate(sizes)]
    check(one_op("SPLIT_V", shape, dtype, qp, [("sizes", np.asarray(given_sizes, np.int32)),
                                                ("axis", np.asarray([ax], np.int32))],
                 [shape[:ax] + [v] + shape[ax + 1:] for v in sizes], "SplitVOptions", NumSplits=len(sizes)),
          [x], f"SPLIT_V {given_sizes} on {ax}")
    check(one_op("UNPACK", shape, dtype, qp, [], [shape[:ax] + shape[ax + 1:]] * n, "UnpackOptions", Num=n, Axis=ax),
          [x], f"UNPACK on {ax}")


@settings(**SETTINGS)
@given(shape=shapes, dtype=DT, qp=QP, count=st.integers(1, 4), data=st.data(), seed=st.integers(0, 2 ** 31))
def test_pack(shape, dtype, qp, count, data, seed):
    ax = data.draw(st.integers(-len(shape) - 1, len(shape)))
    a = ax % (len(shape) + 1)
    rng = np.random.default_rng(seed)
    buf = one_op("PACK", shape, dtype, qp, [], [shape[:a] + [count] + shape[a:]], "PackOptions", n_inputs=count,
                 ValuesCount=count, Axis=ax)
    check(buf, [feed(rng, shape, dtype) for _ in range(count)], f"PACK {count} on {ax}")


@settings(**SETTINGS)
@given(shape=shapes, dtype=DT, qp=QP, ishape=st.lists(st.integers(1, 3), max_size=2), data=st.data(),
       seed=st.integers(0, 2 ** 31))
def test_gather(shape, dtype, qp, ishape, data, seed):
    ax = data.draw(st.integers(-len(shape), len(shape) - 1))
    a = ax % len(shape)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, shape[a], size=ishape).astype(np.int32)
    out = shape[:a] + list(ishape) + shape[a + 1:]
    check(one_op("GATHER", shape, dtype, qp, [("idx", idx)], [out], "GatherOptions", Axis=ax, BatchDims=0),
          [feed(rng, shape, dtype)], f"GATHER axis {ax} {idx.tolist()}")


def test_gather_out_of_range_index_is_refused():
    buf = one_op("GATHER", [3, 2], "float32", None, [("idx", np.asarray([0, 3], np.int32))], [[2, 2]],
                 "GatherOptions", Axis=0)
    with pytest.raises(TFLiteImportError, match=r"operator 0 \(GATHER\): index 3 .* out of range: allowed 0..2"):
        load_tflite(buf)


@settings(**SETTINGS)
@given(n=st.integers(1, 2), h=st.integers(1, 7), w=st.integers(1, 7), c=st.integers(1, 3), oh=st.integers(1, 12),
       ow=st.integers(1, 12), mode=st.sampled_from(["nearest", "bilinear"]),
       flags=st.sampled_from([(False, False), (True, False), (False, True)]), dtype=DT, qp=QP,
       seed=st.integers(0, 2 ** 31))
def test_resize(n, h, w, c, oh, ow, mode, flags, dtype, qp, seed):
    name, opts = {"nearest": ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions"),
                  "bilinear": ("RESIZE_BILINEAR", "ResizeBilinearOptions")}[mode]
    buf = one_op(name, [n, h, w, c], dtype, qp, [("size", np.asarray([oh, ow], np.int32))], [[n, oh, ow, c]], opts,
                 AlignCorners=flags[0], HalfPixelCenters=flags[1])
    check(buf, [feed(np.random.default_rng(seed), [n, h, w, c], dtype)], f"{name} {h}x{w}->{oh}x{ow} {flags}",
          exact=dtype == "int8" or mode == "nearest")


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), dtype=DT, data=st.data(),
       seed=st.integers(0, 2 ** 31))
def test_strided_slice_ellipsis_and_new_axis(shape, dtype, data, seed):
    """Random specs with an ellipsis and new axes besides begin/end/shrink masks (TensorFlow's
    dense spec, which LiteRT's kernel implements)."""
    n = data.draw(st.integers(1, len(shape) + 2))
    ell = data.draw(st.integers(-1, n - 1))
    elm = 0 if ell < 0 else 1 << ell
    nam = data.draw(st.integers(0, 2 ** n - 1)) & ~elm
    real = [i for i in range(n) if not (elm >> i & 1) and not (nam >> i & 1)]
    if len(real) > len(shape) or (len(shape) + (n - len(real)) - (1 if elm else 0) - 0) > 5 + 3:
        return
    dims = {}
    ax = 0
    for i in range(n):                       # the input axis each real entry reads (for its ranges)
        if elm >> i & 1:
            ax += len(shape) - len(real)
        elif i in real:
            dims[i] = shape[ax]
            ax += 1
    spec = [_entry(data.draw, dims.get(i, 1)) for i in range(n)]
    bm, em, sm = (data.draw(st.integers(0, 2 ** n - 1)) for _ in range(3))
    b, e, s = ([t[j] for t in spec] for j in range(3))
    plan, why = strided_slice_plan(shape, b, e, s, bm, em, elm, nam, sm)
    if plan is None or len(plan[3]) > 5:
        return
    consts = [(w, np.asarray(v, np.int32)) for w, v in (("begin", b), ("end", e), ("strides", s))]
    buf = one_op("STRIDED_SLICE", shape, dtype, (0.1, 3), consts, [plan[3]], "StridedSliceOptions",
                 BeginMask=bm, EndMask=em, EllipsisMask=elm, NewAxisMask=nam, ShrinkAxisMask=sm)
    check(buf, [feed(np.random.default_rng(seed), shape, dtype)],
          f"STRIDED_SLICE {shape} {spec} masks b{bm} e{em} ell{elm} new{nam} shrink{sm}")
