"""Builtins imported as compositions of data-movement ops, against LiteRT's reference kernels
(int8 bit for bit, float32): REVERSE_V2, BROADCAST_TO, DEPTH_TO_SPACE, SPACE_TO_DEPTH,
SPACE_TO_BATCH_ND, BATCH_TO_SPACE_ND, MIRROR_PAD, PADV2, GATHER_ND, CAST, EMBEDDING_LOOKUP, and
SHAPE/FILL/ZEROS_LIKE folded into constants."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.frontend.tflite_builder import Builder

from .util import check, feed, one_op

SETTINGS = dict(max_examples=int(os.environ.get("KILN_PROPERTY_EXAMPLES", 40)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
DT = st.sampled_from(["int8", "float32"])
QP = st.tuples(st.floats(1e-3, 2.0), st.integers(-128, 127))
shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4)


@settings(**SETTINGS)
@given(shape=shapes, dtype=DT, qp=QP, data=st.data(), seed=st.integers(0, 2 ** 31))
def test_reverse_v2(shape, dtype, qp, data, seed):
    lo = data.draw(st.integers(0, len(shape) - 1))
    axes = list(range(lo, data.draw(st.integers(lo, len(shape) - 1)) + 1))
    if data.draw(st.booleans()):
        axes = [a - len(shape) for a in reversed(axes)]
    buf = one_op("REVERSE_V2", shape, dtype, qp, [("axis", np.asarray(axes, np.int32))], [shape], "ReverseV2Options")
    check(buf, [feed(np.random.default_rng(seed), shape, dtype)], f"REVERSE_V2 {shape} {axes}")


@settings(**SETTINGS)
@given(shape=shapes, dtype=DT, qp=QP, data=st.data(), seed=st.integers(0, 2 ** 31))
def test_broadcast_to(shape, dtype, qp, data, seed):
    src = [data.draw(st.sampled_from([1, n])) for n in shape][data.draw(st.integers(0, len(shape) - 1)):]
    buf = one_op("BROADCAST_TO", src, dtype, qp, [("shape", np.asarray(shape, np.int32))], [shape],
                 "BroadcastToOptions", version_of_int8=True)
    check(buf, [feed(np.random.default_rng(seed), src, dtype)], f"BROADCAST_TO {src} -> {shape}")


@settings(**SETTINGS)
@given(n=st.integers(1, 2), h=st.integers(1, 3), w=st.integers(1, 3), c=st.integers(1, 3), bs=st.integers(1, 3),
       dtype=DT, qp=QP, seed=st.integers(0, 2 ** 31))
def test_depth_to_space_and_back(n, h, w, c, bs, dtype, qp, seed):
    rng = np.random.default_rng(seed)
    check(one_op("DEPTH_TO_SPACE", [n, h, w, c * bs * bs], dtype, qp, [], [[n, h * bs, w * bs, c]],
                 "DepthToSpaceOptions", BlockSize=bs), [feed(rng, [n, h, w, c * bs * bs], dtype)], "DEPTH_TO_SPACE")
    check(one_op("SPACE_TO_DEPTH", [n, h * bs, w * bs, c], dtype, qp, [], [[n, h, w, c * bs * bs]],
                 "SpaceToDepthOptions", BlockSize=bs), [feed(rng, [n, h * bs, w * bs, c], dtype)], "SPACE_TO_DEPTH")


@settings(**SETTINGS)
@given(n=st.integers(1, 2), sp=st.lists(st.integers(1, 4), min_size=1, max_size=2), c=st.integers(1, 3),
       dtype=DT, qp=QP, data=st.data(), seed=st.integers(0, 2 ** 31))
def test_space_to_batch_and_batch_to_space(n, sp, c, dtype, qp, data, seed):
    rng = np.random.default_rng(seed)
    m = len(sp)
    block = [data.draw(st.integers(1, 3)) for _ in range(m)]
    pads = []
    for s, b in zip(sp, block):
        lo = data.draw(st.integers(0, 2))
        hi = (-(s + lo)) % b + b * data.draw(st.integers(0, 1))
        pads.append([lo, hi])
    outsp = [(s + p[0] + p[1]) // b for s, p, b in zip(sp, pads, block)]
    nb = int(np.prod(block))
    shape = [n] + sp + [c]
    check(one_op("SPACE_TO_BATCH_ND", shape, dtype, qp, [("block", np.asarray(block, np.int32)),
                                                         ("pads", np.asarray(pads, np.int32))],
                 [[n * nb] + outsp + [c]], "SpaceToBatchNDOptions"), [feed(rng, shape, dtype)],
          f"SPACE_TO_BATCH_ND {shape} {block} {pads}")
    crops = [[min(p[0], s * b - 1), 0] for p, s, b in zip(pads, sp, block)]
    bshape = [n * nb] + sp + [c]
    check(one_op("BATCH_TO_SPACE_ND", bshape, dtype, qp, [("block", np.asarray(block, np.int32)),
                                                          ("crops", np.asarray(crops, np.int32))],
                 [[n] + [s * b - cr[0] for s, b, cr in zip(sp, block, crops)] + [c]], "BatchToSpaceNDOptions"),
          [feed(rng, bshape, dtype)], f"BATCH_TO_SPACE_ND {bshape} {block} {crops}")


@settings(**SETTINGS)
@given(shape=shapes, dtype=DT, qp=QP, mode=st.sampled_from([0, 1]), data=st.data(), seed=st.integers(0, 2 ** 31))
def test_mirror_pad(shape, dtype, qp, mode, data, seed):
    lim = 1 if mode == 0 else 0
    pads = [[data.draw(st.integers(0, n - lim)), data.draw(st.integers(0, n - lim))] for n in shape]
    out = [n + a + b for n, (a, b) in zip(shape, pads)]
    buf = one_op("MIRROR_PAD", shape, dtype, qp, [("pads", np.asarray(pads, np.int32))], [out], "MirrorPadOptions",
                 Mode=mode)
    check(buf, [feed(np.random.default_rng(seed), shape, dtype)], f"MIRROR_PAD {shape} {pads} mode {mode}")


@settings(**SETTINGS)
@given(shape=shapes, dtype=DT, qp=QP, v=st.integers(-128, 127), data=st.data(), seed=st.integers(0, 2 ** 31))
def test_padv2(shape, dtype, qp, v, data, seed):
    pads = [[data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))] for _ in shape]
    out = [n + a + b for n, (a, b) in zip(shape, pads)]
    b = Builder("padv2")
    sc, zp = qp if dtype == "int8" else (None, 0)
    x = b.tensor("x", shape, dtype, scale=sc, zero_point=zp)
    p = b.tensor("p", [len(shape), 2], "int32", data=np.asarray(pads, np.int32))
    cv = b.tensor("cv", [], dtype, data=np.asarray(v if dtype == "int8" else v / 7.0, dtype), scale=sc,
                  zero_point=zp)
    y = b.tensor("y", out, dtype, scale=sc, zero_point=zp)
    b.op("PADV2", [x, p, cv], [y], "PadV2Options", dtype == "int8")
    check(b.build([x], [y]), [feed(np.random.default_rng(seed), shape, dtype)], f"PADV2 {pads} {v}")


@settings(**SETTINGS)
@given(shape=shapes, dtype=DT, qp=QP, data=st.data(), seed=st.integers(0, 2 ** 31))
def test_gather_nd(shape, dtype, qp, data, seed):
    rng = np.random.default_rng(seed)
    depth = data.draw(st.integers(1, len(shape)))
    lead = data.draw(st.lists(st.integers(1, 3), max_size=2))
    idx = np.stack([rng.integers(0, shape[d], size=lead) for d in range(depth)], axis=-1).astype(np.int32)
    buf = one_op("GATHER_ND", shape, dtype, qp, [("idx", idx)], [list(lead) + shape[depth:]], "GatherNdOptions")
    check(buf, [feed(rng, shape, dtype)], f"GATHER_ND {shape} {idx.tolist()}")


@pytest.mark.parametrize("out_dtype", ["int32", "float32"])
def test_cast(out_dtype):
    x = np.asarray([[-2.7, -0.5, 0.0, 0.49, 1.5, 300.9]], np.float32)
    b = Builder("cast")
    xi = b.tensor("x", x.shape, "float32")
    yi = b.tensor("y", x.shape, out_dtype)
    b.op("CAST", [xi], [yi])
    check(b.build([xi], [yi]), [x], "CAST")


def test_embedding_lookup_and_folded_shape_ops():
    """EMBEDDING_LOOKUP (float and int8 tables) is a gather on axis 0; SHAPE and FILL feed a
    RESHAPE and an ADD as constants."""
    rng = np.random.default_rng(5)
    for dtype, sc in (("float32", None), ("int8", 0.05)):
        b = Builder("emb")
        ids = b.tensor("ids", [3], "int32", data=np.asarray([2, 0, 2], np.int32))
        x = b.tensor("table", [4, 5], dtype, scale=sc)
        y = b.tensor("y", [3, 5], dtype, scale=sc)
        b.op("EMBEDDING_LOOKUP", [ids, x], [y])
        check(b.build([x], [y]), [feed(rng, [4, 5], dtype)], f"EMBEDDING_LOOKUP {dtype}")
    b = Builder("fold")
    x = b.tensor("x", [2, 6])
    z = b.tensor("z", [6, 2])
    shp = b.tensor("shp", [2], "int32")
    r = b.tensor("r", [6, 2])
    dims = b.tensor("dims", [2], "int32", data=np.asarray([6, 2], np.int32))
    val = b.tensor("val", [], "float32", data=np.asarray(1.5, np.float32))
    ones = b.tensor("ones", [6, 2])
    y = b.tensor("y", [6, 2])
    b.op("SHAPE", [z], [shp], "ShapeOptions", OutType=2)
    b.op("RESHAPE", [x, shp], [r], "ReshapeOptions")
    b.op("FILL", [dims, val], [ones], "FillOptions")
    b.op("ADD", [r, ones], [y], "AddOptions")
    g = check(b.build([x, z], [y]), [feed(rng, [2, 6], "float32"), feed(rng, [6, 2], "float32")], "SHAPE/FILL")
    assert [n.op for n in g.nodes] == ["reshape", "add"]
