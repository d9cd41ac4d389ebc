"""DYNAMIC_UPDATE_SLICE (run-time start indices, clamped; float, int8, int16), REDUCE_ALL and
BROADCAST_ARGS against LiteRT's reference kernels; host C for the update; gradients against float64
finite differences; bad input named."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln
from kiln import F
from kiln.autodiff import check_grads
from kiln.frontend.errors import KilnError
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite
from tests.frontend.tflite_builder import Builder
from tests.quantize.litert_util import litert_run


def dus_model(xshape, ushape, dtype="float32", start_dtype="int32"):
    b = Builder("dus")
    q = dict(scale=0.1, zero_point=3) if dtype == "int8" else dict(scale=0.001, zero_point=0) if dtype == "int16" else {}
    x = b.tensor("x", xshape, dtype, **q)
    u = b.tensor("u", ushape, dtype, **q)
    s = b.tensor("start", (len(xshape),), start_dtype)
    y = b.tensor("y", xshape, dtype, **q)
    b.op("DYNAMIC_UPDATE_SLICE", [x, u, s], [y], None, dtype != "float32")
    return b.build([x, u, s], [y])


def _arr(rng, shape, dtype):
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


@settings(max_examples=40, deadline=None)
@given(rank=st.integers(1, 4), dtype=st.sampled_from(["float32", "int8", "int16"]), seed=st.integers(0, 2 ** 31))
def test_dynamic_update_slice_matches_litert(rank, dtype, seed):
    rng = np.random.default_rng(seed)
    xshape = tuple(int(v) for v in rng.integers(1, 6, rank))
    ushape = tuple(int(rng.integers(1, d + 1)) for d in xshape)
    buf = dus_model(xshape, ushape, dtype)
    g = load_tflite(buf)
    for _ in range(3):
        start = rng.integers(-3, 8, rank).astype(np.int32)          # out of range: clamped
        feeds = [_arr(rng, xshape, dtype), _arr(rng, ushape, dtype), start]
        want = litert_run(buf, feeds)[0]
        np.testing.assert_array_equal(kiln.run(g, *feeds)[0], want)
    np.testing.assert_array_equal(litert_run(export_tflite(g), feeds)[0], want)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_dynamic_update_slice_on_host_c(tmp_path, dtype):
    from kiln.backends import compile as compile_pkg
    rng = np.random.default_rng(1)
    buf = dus_model((2, 5, 6, 3), (1, 2, 4, 3), dtype)
    g = load_tflite(buf)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    for start in ([0, 0, 0, 0], [1, 3, 2, 0], [5, -2, 9, 1], [1, 4, 3, 0]):
        feeds = [_arr(rng, (2, 5, 6, 3), dtype), _arr(rng, (1, 2, 4, 3), dtype), np.asarray(start, np.int32)]
        want = litert_run(buf, feeds)[0]
        np.testing.assert_array_equal(pkg.run(*feeds)[0], want)


def test_dynamic_update_slice_gradients():
    rng = np.random.default_rng(2)
    w = np.arange(20.0, dtype=np.float32).reshape(4, 5)

    def f(x, u):
        y = F.dynamic_update_slice(x, u, [1, 3])                 # column start clamped to 2
        return F.sum(y * y * w)
    g = kiln.trace(f, (4, 5), (2, 3))
    assert check_grads(g, [rng.standard_normal((4, 5)), rng.standard_normal((2, 3))]).ok
    h = kiln.trace(lambda x: F.sum(F.dynamic_slice(x, [3, -1], [2, 2]) ** 2), (4, 5))
    assert check_grads(h, [rng.standard_normal((4, 5))]).ok


def test_reduce_all_and_broadcast_args_match_litert():
    rng = np.random.default_rng(3)
    b = Builder("all")
    x = b.tensor("x", (3, 4, 5))
    t = b.tensor("t", (3, 4, 5))
    m = b.tensor("m", (3, 4, 5), "bool")
    b.op("GREATER", [x, t], [m])
    ax = b.tensor("ax", (2,), "int32", data=np.asarray([0, 2], np.int32))
    y = b.tensor("y", (1, 4, 1), "bool")
    b.op("REDUCE_ALL", [m, ax], [y], "ReducerOptions", KeepDims=True)
    s0 = b.tensor("s0", (3,), "int32", data=np.asarray([1, 4, 1], np.int32))
    s1 = b.tensor("s1", (2,), "int32", data=np.asarray([4, 2], np.int32))
    bs = b.tensor("bs", (3,), "int32")
    b.op("BROADCAST_ARGS", [s0, s1], [bs])
    v = b.tensor("v", (4, 1))
    z = b.tensor("z", (1, 4, 2))
    b.op("BROADCAST_TO", [v, bs], [z], "BroadcastToOptions", True)   # version 2 (LiteRT has no v1)
    buf = b.build([x, t, v], [y, z])
    g = load_tflite(buf)
    for _ in range(4):
        feeds = [rng.standard_normal((3, 4, 5)).astype(np.float32), np.full((3, 4, 5), -1.5, np.float32),
                 rng.standard_normal((4, 1)).astype(np.float32)]
        for got, want in zip(kiln.run(g, *feeds), litert_run(buf, feeds)):
            np.testing.assert_array_equal(got, want)


def test_bad_start_and_shapes_are_named():
    with pytest.raises(KilnError, match="start indices must be int32 or int64 of shape \\(2,\\)"):
        load_tflite(dus_model((3, 4), (2, 2), start_dtype="float32"))
    b = Builder("ba")
    s0 = b.tensor("s0", (2,), "int32", data=np.asarray([3, 4], np.int32))
    s1 = b.tensor("s1", (1,), "int32", data=np.asarray([5], np.int32))
    bs = b.tensor("bs", (2,), "int32")
    b.op("BROADCAST_ARGS", [s0, s1], [bs])
    x = b.tensor("x", (3, 4))
    y = b.tensor("y", (3, 4))
    b.op("BROADCAST_TO", [x, bs], [y])
    with pytest.raises(KilnError, match=r"BROADCAST_ARGS\): shapes \[3, 4\] and \[5\] do not broadcast"):
        load_tflite(b.build([x], [y]))


@pytest.mark.slow
@pytest.mark.qemu
def test_dynamic_update_slice_int8_on_board(tmp_path):
    """An int8 operand and an int32 start-index graph input on mps2-an386, bit-exact with LiteRT."""
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    rng = np.random.default_rng(0)
    p = tmp_path / "dus.tflite"
    p.write_bytes(dus_model((2, 5, 6, 3), (1, 2, 4, 3), "int8"))
    samples = [(_arr(rng, (2, 5, 6, 3), "int8"), _arr(rng, (1, 2, 4, 3), "int8"), np.asarray(s, np.int32))
               for s in ([0, 0, 0, 0], [1, 4, 3, 0], [9, -3, 2, 1])]
    gold = str(tmp_path / "g.npz")
    assert golden(str(p), gold, samples) == "litert"
    rep = verify(str(p), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 3, rep["results"]
