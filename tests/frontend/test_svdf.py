"""The SVDF ops (svdf_state + svdf, TFLite SVDF) and stateful graphs: int8 bit-exact with LiteRT's
reference kernels over successive invocations (the variable state carried), float against LiteRT,
TFLite Micro's keyword_scrambled models, import -> export -> import, the importer's errors and the
state's semantics (graph.states, run_stateful, the reference package's reset_state)."""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.backends import get_backend
from kiln.frontend import load, run, save
from kiln.frontend.errors import GraphError, KilnError
from kiln.frontend.executor import initial_state, run_stateful
from kiln.frontend.tflite_import import load_tflite
from kiln.litert import OracleError, run_litert
from kiln.quantize.tflite_export import export_tflite
from tests.frontend.svdf_util import KWS, inputs, litert_stream, svdf_graph
from tests.frontend.tflite_builder import Builder
from tests.quantize.litert_util import assert_same

STEPS = 5


def _state_index(model, name):
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    it = interp.Interpreter(model_content=model)
    return next(t["index"] for t in it.get_tensor_details() if t["name"] == name)


dims = st.tuples(st.integers(1, 3), st.integers(1, 8), st.integers(1, 4), st.integers(1, 3), st.integers(1, 6))
scale = st.floats(1e-3, 0.1)


@settings(max_examples=40, deadline=None)
@given(dims, scale, st.integers(-128, 127), scale, st.floats(1e-4, 0.01), st.floats(1e-4, 0.01), st.floats(0.005, 0.5),
       st.integers(-128, 127), st.booleans(), st.integers(0, 10**6))
def test_int8_matches_litert_over_invocations(d, s_x, z_x, s_wf, s_state, s_wt, s_out, z_out, bias, seed):
    """TFLite's integer SVDF (int8 input/output, int16 state and time weights): every output and
    every state after each of 5 successive invocations equal LiteRT's."""
    B, I, U, rank, M = d
    g = svdf_graph(B, I, U * rank, M, rank, s_x=s_x, z_x=z_x, s_wf=s_wf, s_state=s_state, s_wt=s_wt, s_out=s_out,
                   z_out=z_out, bias=bias, seed=seed)
    model = export_tflite(g)
    xs = inputs(g, STEPS, seed)
    want = litert_stream(model, xs, [_state_index(model, "st")])
    state = {}
    for k, (x, (y_lite, st_lite)) in enumerate(zip(xs, want)):
        y = run_stateful(g, state, x)[0]
        assert_same(y, y_lite, f"output of invocation {k}")
        assert_same(state["st"], st_lite, f"state after invocation {k}")


@settings(max_examples=20, deadline=None)
@given(dims, st.sampled_from(["none", "relu"]), st.booleans(), st.integers(0, 10**6))
def test_float_matches_litert_over_invocations(d, act, bias, seed):
    B, I, U, rank, M = d
    g = svdf_graph(B, I, U * rank, M, rank, dtype="float32", act=act, bias=bias, seed=seed)
    xs = inputs(g, STEPS, seed)
    want = litert_stream(export_tflite(g), xs)
    state = {}
    for k, (x, (y_lite,)) in enumerate(zip(xs, want)):
        np.testing.assert_allclose(run_stateful(g, state, x)[0], y_lite, rtol=1e-5, atol=1e-5,
                                   err_msg=f"invocation {k}")


def test_integer_activation_is_not_applied():
    """TFLite and TFLite Micro apply no fused activation in the integer SVDF (RELU lives in the
    output range); LiteRT insists on RELU, TFLite Micro takes NONE too: both give the same bits."""
    a = svdf_graph(2, 4, 6, 3, 2, act="relu", z_out=0)
    b = svdf_graph(2, 4, 6, 3, 2, act="none", z_out=0)
    x = inputs(a, 1, 0)[0]
    assert np.array_equal(run(a, x)[0], run(b, x)[0])
    assert (run(a, x)[0] < 0).any()        # no clamp at the zero point


def test_int8_state_follows_tflite_micro():
    """An int8 state with a zero point (TFLite Micro only): the newest column is the requantised
    dot product clamped to int8, plus the zero point, stored with int8 wrap-around; the time
    product subtracts the zero point."""
    g = svdf_graph(1, 2, 1, 2, 1, state="int8", z_state=-50, s_x=1.0, z_x=0, s_wf=1.0, s_state=1.0, seed=1)
    g.consts["wf"] = np.array([[100, 100]], np.int8)
    state = initial_state(g)
    assert (state["st"] == -50).all()            # reset to the zero point
    run_stateful(g, state, np.array([[-1, -1]], np.int8))
    # dot = -200 -> clamp -128 -> + (-50) = -178 -> wraps to 78
    assert state["st"].tolist() == [[-50, 78]]
    run_stateful(g, state, np.array([[1, 0]], np.int8))
    assert state["st"].tolist() == [[78, 50]]


@pytest.mark.parametrize("seed", range(3))
def test_keyword_scrambled_matches_litert(seed):
    """TFLite Micro's keyword_scrambled (7 int16-state SVDFs): every operator's output and every
    state equal LiteRT's after each of 6 successive invocations (states carried)."""
    path = os.path.join(KWS, "keyword_scrambled.tflite")
    g = load_tflite(path)
    tmap = g.meta["tflite_tensors"]
    names = [n.name for n in g.nodes if n.name in tmap]
    st_names = list(g.states)
    idx = [tmap[n] for n in names] + [tmap[s] for s in st_names]
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-32768, 32768, (1, 96)).astype(np.int16) for _ in range(6)]
    want = litert_stream(path, xs, idx)
    state = {}
    for k, (x, w) in enumerate(zip(xs, want)):
        got = run_stateful(g, state, x, outputs=names)
        for n, a, b in zip(names, got, w[1:]):
            assert_same(a, b, f"invocation {k}: {n} ({g.producer(n).op})")
        for s, b in zip(st_names, w[1 + len(names):]):
            assert_same(state[s], b, f"invocation {k}: state {s}")
    assert len(g.states) == 7 and all(len(np.unique(v)) > 10 for v in state.values())


def test_keyword_scrambled_8bit_runs_and_litert_is_refused():
    """The int8-state model (TFLite Micro only) imports and runs; LiteRT, whose kernel would read
    the int8 state as int16 and abort the process, is refused with a named error."""
    path = os.path.join(KWS, "keyword_scrambled_8bit.tflite")
    g = load_tflite(path)
    assert {g.types[s].dtype for s in g.states} == {"int8"}
    pkg = get_backend("reference").compile(g)
    x = np.zeros((1, 96), np.int16)
    assert [pkg.run(x)[0].shape for _ in range(3)] == [(1, 2)] * 3
    with pytest.raises(OracleError, match="int8 state"):
        run_litert(path, [(x,)])


def test_reference_package_carries_and_resets_state(tmp_path):
    g = svdf_graph(2, 3, 4, 3, 2)
    xs = inputs(g, 3, 1)
    pkg = get_backend("reference").compile(g)
    first = [pkg.run(x)[0] for x in xs]
    assert not all(np.array_equal(run(g, x)[0], y) for x, y in zip(xs[1:], first[1:]))   # state matters
    assert np.array_equal(run(g, xs[0])[0], first[0])          # plain run: one step from the reset state
    pkg.reset_state()
    assert all(np.array_equal(pkg.run(x)[0], y) for x, y in zip(xs, first))
    save(g, tmp_path / "g")
    h = load(tmp_path / "g.json")
    assert h.states == {"st": "st_next"}
    state = {}
    assert all(np.array_equal(run_stateful(h, state, x)[0], y) for x, y in zip(xs, first))


def test_state_validation():
    g = svdf_graph(1, 2, 2, 2, 1)
    g.states["st"] = "x"
    with pytest.raises(GraphError, match="state 'st'"):
        g.validate()
    g.states = {"wt": "st_next"}
    with pytest.raises(GraphError, match="state 'wt'"):
        g.validate()


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_export_import_round_trip(dtype):
    g = svdf_graph(2, 5, 6, 4, 3, dtype=dtype)
    model = export_tflite(g)
    h = load_tflite(model)
    assert len(h.states) == 1 and [n.op for n in h.nodes] == ["svdf_state", "svdf"]
    assert export_tflite(h) == export_tflite(load_tflite(export_tflite(h)))
    xs = inputs(g, 3, 2)
    s1, s2 = {}, {}
    for x in xs:
        assert np.array_equal(run_stateful(g, s1, x)[0], run_stateful(h, s2, x)[0])


def _svdf_model(rank=2, act=0, variable=True, state_shape=(1, 8), bias=True):
    """A float SVDF (input [1, 3], 4 filters, memory 2) written with the flatbuffer builder."""
    b = Builder("svdf")
    x = b.tensor("x", (1, 3))
    wf = b.tensor("wf", (4, 3), data=np.ones((4, 3), np.float32))
    wt = b.tensor("wt", (4, 2), data=np.ones((4, 2), np.float32))
    bi = b.tensor("b", (4 // max(rank, 1),), data=np.zeros(4 // max(rank, 1), np.float32)) if bias else -1
    s = b.tensor("state", state_shape, data=None if variable else np.zeros(state_shape, np.float32))
    b.e.tensors[s]["variable"] = variable
    y = b.tensor("y", (1, 4 // max(rank, 1)))
    b.op("SVDF", [x, wf, wt, bi, s], [y], "SVDFOptions", Rank=rank, FusedActivationFunction=act)
    return b.build([x], [y])


def test_builder_model_without_bias_imports():
    g = load_tflite(_svdf_model(bias=False))
    x = np.ones((1, 3), np.float32)
    state = {}
    assert run_stateful(g, state, x)[0].tolist() == [[6.0, 6.0]]       # 2 filters x 3 per unit, newest column
    assert run_stateful(g, state, x)[0].tolist() == [[12.0, 12.0]]     # both memory columns filled


@pytest.mark.parametrize("kw, match", [
    ({"rank": 0}, "rank = 0"),
    ({"act": 3}, "RELU6"),
    ({"variable": False}, "not a variable tensor"),
    ({"state_shape": (1, 7)}, "state"),
])
def test_import_errors(kw, match):
    with pytest.raises(KilnError, match=match):
        load_tflite(_svdf_model(**kw))


@pytest.mark.parametrize("act, M", [("relu", 3), ("none", 1)])
def test_check_grads(act, M):
    """One step's gradients (input, both weights, bias and the incoming state) against float64
    finite differences."""
    from kiln.autodiff import check_grads
    g = svdf_graph(2, 3, 4, M, 2, dtype="float32", act=act)
    for c in ("wf", "wt", "b", "st"):
        g.params[c] = g.consts.pop(c)
    g.params["st"] = np.random.default_rng(3).normal(size=g.types["st"].shape).astype(np.float32)
    g.states.clear()
    r = check_grads(g, [np.random.default_rng(4).normal(size=(2, 3))])
    assert r.ok, r
