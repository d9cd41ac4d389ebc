"""TFLite WHILE imported by static unrolling: counter loops, accumulating loops, RNN-style loops
that GATHER the time step with the counter (float and int8), nested loops, against LiteRT's
reference kernels (which run the loop); the unrolled graph on the host C backend and (slow) on the
mps2-an386 board; data-dependent and over-long loops refused with the WHILE named."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln
from kiln.backends import compile as compile_pkg
from kiln.frontend.errors import KilnError
from kiln.frontend.ops.while_loop import MAX_ITERATIONS
from kiln.frontend.tflite_import import load_tflite, supported
from kiln.quantize import ptq
from kiln.quantize.tflite_export import export_tflite
from tests.frontend import while_models as M
from tests.quantize.litert_util import assert_same, litert_run


def _feeds(shape, int8, n=3, seed=1):
    rng = np.random.default_rng(seed)
    if int8:
        return [rng.integers(-128, 128, shape).astype(np.int8) for _ in range(n)]
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def _check(buf, shape, int8=False, host_dir=None):
    g = load_tflite(buf)
    pkg = None
    if host_dir is not None:
        pkg = compile_pkg(g, target="host", out_dir=host_dir, plot=False, measure_size=False)
    for x in _feeds(shape, int8):
        want = litert_run(buf, [x])[0]
        got = kiln.run(g, x)[0]
        if int8:
            assert_same(got, want, "reference")
            if pkg is not None:
                assert_same(pkg.run(x)[0], want, "host C")
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            if pkg is not None:
                np.testing.assert_allclose(pkg.run(x)[0], want, rtol=1e-5, atol=1e-5)
    return g


def test_while_is_supported():
    assert "WHILE" in supported()


@pytest.mark.parametrize("trips,start", [(5, 0), (1, 0), (7, 3), (0, 3)])
def test_counter_loop(trips, start):
    g = _check(M.counter_model(trips, start), (1, 4))
    n = max(trips - start, 0)
    assert g.meta["while_trip_counts"] == [n]
    assert [node.op for node in g.nodes] == ["mul"] * n
    assert not any(g.types[c].dtype in ("int32", "bool") for c in g.consts)     # the counter chain folded away


def test_counter_chain_with_cast_gather_squeeze(tmp_path):
    """A counter chain of CAST (int32 -> float32, in the cond and the body), an int32 table
    GATHERed with the counter and SQUEEZE folds at import: only the run-time GATHER, MUL and ADD
    of each step remain; equal to LiteRT (which runs the loop) on the reference and host C."""
    g = _check(M.counter_chain_model(), (5, 1, 3), host_dir=tmp_path)
    assert g.meta["while_trip_counts"] == [5]
    assert [node.op for node in g.nodes] == ["gather", "mul", "add"] * 5
    assert not any(g.types[c].dtype in ("int32", "bool") for c in g.consts if g.types[c].shape != ())


def test_counter_chain_gather_out_of_range_is_named():
    with pytest.raises(KilnError, match=r"subgraph 2\): operator 0 \(GATHER\): a loop counter's index 4 is out "
                                        r"of range 0\.\.3"):
        load_tflite(M.counter_chain_model(t=5, bad_index=True))


def test_accumulating_loop_keeps_one_copy_of_the_weights():
    g = _check(M.accumulate_model(trips=3), (1, 4))
    assert [node.op for node in g.nodes] == ["dense", "add"] * 3
    assert sum(1 for c in g.consts if g.types[c].shape == (4, 4)) == 1


@pytest.mark.parametrize("int8", [False, True])
def test_rnn_loop_gathers_each_time_step(int8, tmp_path):
    g = _check(M.rnn_model(t=5, int8=int8), (5, 1, 3), int8, tmp_path)
    ops = [node.op for node in g.nodes]
    assert ops.count("gather") == 5 and ops.count("tanh") == 5
    assert ops.count("dense") == 9          # the first step's recurrent product (of the zero state) is folded
    assert sum(1 for c in g.consts if g.types[c].shape == (4, 4)) <= 2


@pytest.mark.parametrize("int8", [False, True])
def test_nested_while(int8, tmp_path):
    g = _check(M.rnn_model(t=4, int8=int8, nested=3), (4, 1, 3), int8, tmp_path)
    assert g.meta["while_trip_counts"] == [3, 3, 3, 3, 4]
    assert [node.op for node in g.nodes].count("tanh") == 12


def test_data_dependent_trip_count_is_refused():
    with pytest.raises(KilnError, match=r"operator 0 \(WHILE\): the loop condition .* depends on values computed "
                                        r"at run time .*loop variables 0 .*data-dependent.*unroll=True"):
        load_tflite(M.data_dependent_model())


def test_too_many_iterations_are_refused():
    with pytest.raises(KilnError, match=rf"operator 0 \(WHILE\): the loop runs more than {MAX_ITERATIONS} iterations"):
        load_tflite(M.counter_model(MAX_ITERATIONS + 1))
    g = load_tflite(M.counter_model(300))
    assert len(g.nodes) == 300


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 5), st.booleans(), st.integers(0, 2))
def test_rnn_loops_match_litert(t, i, h, int8, nested):
    """RNN-style loops of any length and size, float and int8, nested or not: Kiln's unrolled
    graph against LiteRT running the WHILE (int8 exactly)."""
    g = _check(M.rnn_model(t=t, i=i, h=h, int8=int8, nested=nested), (t, 1, i), int8)
    assert g.meta["while_trip_counts"][-1] == t


@pytest.mark.slow
@pytest.mark.qemu
def test_int8_rnn_while_on_board(tmp_path):
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    path = tmp_path / "while_rnn_int8.tflite"
    path.write_bytes(M.rnn_model(t=4, int8=True, nested=2))
    gold = str(tmp_path / "g.npz")
    golden(str(path), gold, [[x] for x in _feeds((4, 1, 3), True, n=2)])
    rep = verify(str(path), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 2, rep["results"]


KERAS = Path(__file__).resolve().parents[1] / "data" / "converter_rnn"


def test_converters_while_loop_for_a_keras_gru(tmp_path):
    """The TFLite converter's WHILE for a Keras GRU(unroll=False) (tests/data/converter_rnn): counters
    compared with LOGICAL_AND, a time step GATHERed with the counter, the outputs written to a
    lowered tensor list (SLICE bounds computed from the counter, CONCATENATION). Unrolled, it
    matches LiteRT (float), Kiln's own GRU with the layer's weights, the host C package, and after
    PTQ the int8 file in LiteRT bit-exact."""
    buf = (KERAS / "keras_gru_while.tflite").read_bytes()
    g = load_tflite(buf)
    assert g.meta["while_trip_counts"] == [5]
    assert not any(g.types[v].size == 0 for v in g.types)            # the list's empty head/tail slices are gone
    ops = [n.op for n in g.nodes]
    assert ops.count("tanh") == 5
    assert ops.count("concat") == 1      # the list's per-step concat chain collapses to one concat of the steps
    w = np.load(KERAS / "keras_gru_while_weights.npz")
    own = kiln.trace(kiln.nn.GRU(3, 4).load_keras([w["kernel"], w["recurrent_kernel"], w["bias"]]), (1, 5, 3))
    pkg = compile_pkg(g, target="host", out_dir=tmp_path / "f", plot=False, measure_size=False)
    for x in _feeds((1, 5, 3), False):
        want = litert_run(buf, [x])[0]
        for got in (kiln.run(g, x)[0], kiln.run(own, x)[0], pkg.run(x)[0]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    back = export_tflite(g)                               # the unrolled graph exports as plain builtins
    for x in _feeds((1, 5, 3), False):
        np.testing.assert_allclose(litert_run(back, [x])[0], litert_run(buf, [x])[0], rtol=1e-5, atol=1e-6)
    cal = np.random.default_rng(1).standard_normal((16, 5, 3)).astype(np.float32)
    q = ptq(g, cal, int8_io=True, batch_size=1)          # the converter's reshapes fix batch 1
    model = export_tflite(q)
    qpkg = compile_pkg(q, target="host", out_dir=tmp_path / "q", plot=False, measure_size=False)
    for x in _feeds((1, 5, 3), True):
        want = litert_run(model, [x])[0]
        assert_same(kiln.run(q, x)[0], want, "reference")
        assert_same(qpkg.run(x)[0], want, "host C")


@pytest.mark.parametrize("name,trips", [("simplernn_batch2_while", [6]), ("stacked_rnn_while", [6, 6]),
                                        ("tf_while_loop", [4]), ("bigru_while", [6, 6]), ("lstm_states_while", [6]),
                                        ("gru_batch3_relu_while", [7])])
def test_more_converter_loops(name, trips, tmp_path):
    """As the TFLite converter writes them: a SimpleRNN over a batch of 2, two stacked loops (GRU
    then SimpleRNN), a tf.while_loop with maximum_iterations and a counter stepping by 2, a
    bidirectional GRU, an LSTM returning its states (three outputs), a GRU over a batch of 3 with
    relu and hard_sigmoid. Every output against LiteRT, on the reference and the host C package."""
    buf = (KERAS / f"{name}.tflite").read_bytes()
    g = load_tflite(buf)
    assert g.meta["while_trip_counts"] == trips
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    for x in _feeds(g.types[g.inputs[0]].shape, False):
        want = litert_run(buf, [x])
        for got in (kiln.run(g, x), pkg.run(x)):
            assert len(got) == len(want)
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.qemu
def test_converters_keras_gru_while_quantised_on_board(tmp_path):
    """The converter's WHILE GRU, unrolled at import and quantised by ptq, on mps2-an386 against
    LiteRT running the int8 file."""
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    g = load_tflite((KERAS / "keras_gru_while.tflite").read_bytes())
    q = ptq(g, np.random.default_rng(1).standard_normal((16, 5, 3)).astype(np.float32), int8_io=True, batch_size=1)
    path = tmp_path / "keras_gru_while_int8.tflite"
    path.write_bytes(export_tflite(q))
    gold = str(tmp_path / "g.npz")
    golden(str(path), gold, [[x] for x in _feeds((1, 5, 3), True, n=2)])
    rep = verify(str(path), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 2, rep["results"]


def test_nested_loops_share_one_iteration_budget(monkeypatch):
    """Nested loops multiply: a file of loops within loops cannot make the importer run forever."""
    from kiln.frontend.ops import while_loop
    monkeypatch.setattr(while_loop, "MAX_TOTAL_ITERATIONS", 20)
    load_tflite(M.rnn_model(t=3, nested=4))                      # 3 + 3 * 4 = 15 iterations
    with pytest.raises(KilnError, match=r"WHILE\): the model's WHILE loops \(nested ones multiply\) unroll into "
                                        r"more than 20 iterations"):
        load_tflite(M.rnn_model(t=5, nested=4))                  # 5 + 5 * 4 = 25


@pytest.mark.parametrize("kind,match", [
    ("cond_index", r"operator 0 \(WHILE\) cond: subgraph index 7 is out of range: allowed 1..2"),
    ("body_outputs", r"operator 0 \(WHILE\): the body subgraph 2 has 1 outputs for 2 loop variables"),
    ("cond_type", r"operator 0 \(WHILE\): the cond subgraph 1 returns|depends on values computed at run time"),
    ("var_type", r"operator 0 \(WHILE\): loop variable 1 is float32\[1\] but WHILE's input .* is float32\[1,4\]"),
])
def test_malformed_loops_are_named(kind, match):
    with pytest.raises(KilnError, match=match):
        load_tflite(M.malformed_model(kind))
