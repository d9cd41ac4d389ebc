"""The NumPy reference runs a stateful LSTM's recurrence once per inference: the sequence node and
its cell twin (``output="cell"``, the next c0) share one run, float, int8 and 16x8, as the C
backend's kernel writes both outputs. The results are those of running each node on its own."""
import numpy as np
import pytest

from kiln.frontend import executor
from kiln.frontend.executor import RunStats, run_stateful
from kiln.frontend.ops import recurrent, recurrent_16x8
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize import ptq
from tests.frontend.test_lstm_state import lstm_model, stream
from tests.kiln.test_tflm_oracle import DATA


def _counting(monkeypatch, module, name):
    calls = []
    fn = getattr(module, name)

    def wrapper(*a, **kw):
        calls.append(1)
        return fn(*a, **kw)
    monkeypatch.setattr(module, name, wrapper)
    return calls


def _check_stream(monkeypatch, g, xs):
    """Over a stream, the outputs and carried states equal those of a run that evaluates every
    node by its own op rule (no shared recurrence)."""
    shared, alone = {}, {}
    for x in xs:
        ys = run_stateful(g, shared, x)
        with monkeypatch.context() as m:
            m.setattr(executor, "_shared_runs", lambda graph: {})
            zs = run_stateful(g, alone, x)
        for a, b in zip(ys, zs):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        assert shared.keys() == alone.keys()
        for s in shared:
            assert shared[s].dtype == alone[s].dtype and np.array_equal(shared[s], alone[s]), s


def test_int8_mnist_lstm_runs_its_recurrence_once(monkeypatch):
    g = load_tflite(f"{DATA}/trained_lstm_int8.tflite")
    assert [n.op for n in g.nodes].count("lstm") == 2 and len(g.states) == 2
    T = g.types[g.inputs[0]].shape[1]
    xs = stream(g.types[g.inputs[0]].shape, 3, 0, "int8")
    steps = _counting(monkeypatch, recurrent_16x8, "step_16x8")
    run_stateful(g, {}, xs[0])
    assert len(steps) == T                      # was 2 T: the cell twin ran the recurrence again
    _check_stream(monkeypatch, g, xs)


@pytest.mark.parametrize("acts", [None, "int16"])
def test_float_and_16x8_stateful_lstm_run_the_recurrence_once(monkeypatch, acts):
    N, T = 2, 5
    g = lstm_model(N, T, head=True)
    if acts:
        cal = np.random.default_rng(2).standard_normal((32, T, 3)).astype(np.float32)
        g = ptq(g, cal, int8_io=True, activations=acts)
        xs = stream((N, T, 3), 3, 3, g.types[g.inputs[0]].dtype)
        calls, per_step = _counting(monkeypatch, recurrent_16x8, "step_16x8"), 1
    else:
        xs = stream((N, T, 3), 3, 3)
        calls, per_step = _counting(monkeypatch, recurrent, "_sigmoid"), 3     # the i, f and o gates
    stats = RunStats()
    run_stateful(g, {}, xs[0], stats=stats)
    assert len(calls) == per_step * T
    assert stats.nodes_run == len(g.nodes)
    _check_stream(monkeypatch, g, xs)


def test_the_cell_twin_may_come_first(monkeypatch):
    """Whichever of the two the schedule runs first computes both values."""
    g = lstm_model(2, 4, head=True)
    seq, twin = (n for n in g.nodes if n.op == "lstm")
    k, j = g.nodes.index(seq), g.nodes.index(twin)
    g.nodes[k], g.nodes[j] = twin, seq
    assert [n.op for n in g.nodes[:2]] == ["lstm", "lstm"] and g.nodes[0].attrs["output"] == "cell"
    calls = _counting(monkeypatch, recurrent, "_sigmoid")
    run_stateful(g, {}, stream((2, 4, 3), 1, 5)[0])
    assert len(calls) == 3 * 4
    _check_stream(monkeypatch, g, stream((2, 4, 3), 3, 6))
