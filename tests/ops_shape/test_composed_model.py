"""One int8 .tflite chaining the builtins Kiln imports as compositions (DEPTH_TO_SPACE,
SPACE_TO_BATCH_ND, BATCH_TO_SPACE_ND, MIRROR_PAD, REVERSE_V2, STRIDED_SLICE with a negative
stride, PADV2, RESIZE_BILINEAR, GATHER_ND, REDUCE_MAX, ARG_MAX): LiteRT's reference kernels,
Kiln's reference, the host C package and (slow) the mps2-an386 firmware in QEMU agree bit for bit."""
import numpy as np
import pytest

import kiln
from kiln.backends import compile as compile_pkg
from kiln.frontend.tflite_import import load_tflite
from tests.frontend.tflite_builder import Builder

from .util import litert_all

SHAPE = (1, 4, 4, 8)
QP = dict(scale=0.05, zero_point=2)


def composed_model(with_argmax=True) -> bytes:
    b = Builder("composed")

    def act(name, shape):
        return b.tensor(name, shape, "int8", **QP)

    def i32(name, v):
        v = np.asarray(v, np.int32)
        return b.tensor(name, v.shape, "int32", data=v)
    x = act("x", SHAPE)
    t1 = act("d2s", (1, 8, 8, 2))
    b.op("DEPTH_TO_SPACE", [x], [t1], "DepthToSpaceOptions", True, BlockSize=2)
    t2 = act("s2b", (4, 5, 5, 2))
    b.op("SPACE_TO_BATCH_ND", [t1, i32("blk", [2, 2]), i32("pads", [[1, 1], [0, 2]])], [t2], "SpaceToBatchNDOptions",
         True)
    t3 = act("b2s", (1, 9, 9, 2))
    b.op("BATCH_TO_SPACE_ND", [t2, i32("blk2", [2, 2]), i32("crops", [[1, 0], [0, 1]])], [t3],
         "BatchToSpaceNDOptions", True)
    t4 = act("mirror", (1, 12, 11, 2))
    b.op("MIRROR_PAD", [t3, i32("mp", [[0, 0], [1, 2], [2, 0], [0, 0]])], [t4], "MirrorPadOptions", True, Mode=0)
    t5 = act("rev", (1, 12, 11, 2))
    b.op("REVERSE_V2", [t4, i32("axes", [1, 2])], [t5], "ReverseV2Options", True)
    t6 = act("ss", (1, 6, 4, 2))
    b.op("STRIDED_SLICE", [t5, i32("b", [0, 1, 0, 0]), i32("e", [1, 12, 0, 2]), i32("s", [1, 2, -3, 1])], [t6],
         "StridedSliceOptions", True, BeginMask=4, EndMask=4)
    t7 = act("padv2", (1, 7, 5, 2))
    cv = b.tensor("cv", (), "int8", data=np.asarray(17, np.int8), **QP)
    b.op("PADV2", [t6, i32("p2", [[0, 0], [1, 0], [0, 1], [0, 0]]), cv], [t7], "PadV2Options", True)
    t8 = act("resize", (1, 9, 6, 2))
    b.op("RESIZE_BILINEAR", [t7, i32("size", [9, 6])], [t8], "ResizeBilinearOptions", True, HalfPixelCenters=True)
    t9 = act("gnd", (2, 6, 2))
    b.op("GATHER_ND", [t8, i32("gi", [[0, 3], [0, 8]])], [t9], "GatherNdOptions", True)
    y = act("y", (2, 6, 1))
    b.op("REDUCE_MAX", [t9, i32("rax", [2])], [y], "ReducerOptions", True, KeepDims=True)
    outs = [t9, y]
    if with_argmax:
        am = b.tensor("am", (2, 2), "int32")
        b.op("ARG_MAX", [t9, i32("aax", [1])], [am], "ArgMaxOptions", True, OutputType=2)
        outs.append(am)
    return b.build([x], outs)


def _inputs(n):
    rng = np.random.default_rng(21)
    return [rng.integers(-128, 128, SHAPE).astype(np.int8) for _ in range(n)]


def test_composed_model_litert_reference_and_host_c(tmp_path):
    buf = composed_model()
    g = load_tflite(buf)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    for x in _inputs(4):
        want = litert_all(buf, [x])
        ref = kiln.run(g, x)
        got = pkg.run(x)
        for w, r, c in zip(want, ref, got):
            np.testing.assert_array_equal(r, w)
            np.testing.assert_array_equal(c, r)


@pytest.mark.slow
@pytest.mark.qemu
def test_composed_model_bit_exact_on_board(tmp_path):
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    p = tmp_path / "composed.tflite"
    p.write_bytes(composed_model(with_argmax=False))
    gold = str(tmp_path / "g.npz")
    assert golden(str(p), gold, [(x,) for x in _inputs(3)]) == "litert"
    rep = verify(str(p), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 3, rep["results"]
