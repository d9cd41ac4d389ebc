"""A stateful (streaming) LSTM: the output and cell states persist from one inference to the next,
as TFLite's variable tensors do in LiteRT and TensorFlow Lite Micro. ``nn.LSTM(stateful=True)``
exports as one UNIDIRECTIONAL_SEQUENCE_LSTM whose variable tensors carry the state; over a stream
of invocations (no reset) Kiln's reference equals LiteRT (float, within 1e-6) and TensorFlow Lite
Micro's interpreter (int8 and 16x8, bit for bit), and so do the re-imported file and the host C
package; ``reset_state`` starts over. A graph whose LSTM state is a plain constant keeps
starting every inference from it."""
import numpy as np
import pytest

import kiln.frontend as kf
from kiln.autodiff import check_grads
from kiln.backends import compile as compile_pkg
from kiln.frontend import Graph, TensorType
from kiln.frontend import functional as F
from kiln.frontend.errors import KilnError
from kiln.frontend.executor import run_stateful
from kiln.frontend.lstm_state import carry_state, cell_twins, is_cell_twin, state_nodes
from kiln.frontend.ops.recurrent import LSTM_INPUTS
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize import ptq
from kiln.quantize.tflite_export import export_tflite
from tests.frontend.svdf_util import litert_stream
from tests.quantize.litert_util import assert_same


@pytest.fixture(autouse=True, scope="module")
def _keep_layer_rng():
    from kiln.frontend import module
    saved = module._rng
    yield
    module._rng = saved


def lstm_model(N=1, T=1, I=3, H=5, head=False, seed=0):
    kf.manual_seed(seed)
    rnn = kf.LSTM(I, H, stateful=True)
    lin = kf.Linear(H, 2)
    fwd = (lambda x: lin(F.reshape(rnn(x), [N * T, H]))) if head else rnn
    return kf.trace(fwd, (N, T, I))


def stream(shape, n, seed, dtype="float32"):
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
    info = np.iinfo(dtype)
    return [rng.integers(info.min, info.max + 1, shape).astype(dtype) for _ in range(n)]


def tflm_stream(model: bytes, xs):
    """TensorFlow Lite Micro's interpreter invoked once per input, never reset (the variable
    tensors carried, as on a device)."""
    runtime = pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
    it = runtime.Interpreter.from_bytes(model)
    out = []
    for x in xs:
        it.set_input(x, 0)
        it.invoke()
        out.append(it.get_output(0).copy())
    return out


def kiln_stream(g, xs):
    state = {}
    return [run_stateful(g, state, x)[0] for x in xs]


@pytest.mark.parametrize("N,T", [(1, 1), (2, 3)])
def test_float_stateful_lstm_matches_litert_over_a_stream(N, T):
    g = lstm_model(N, T)
    assert len(g.states) == 2 and [n.op for n in g.nodes] == ["lstm", "lstm", "slice", "reshape"]
    xs = stream((N, T, 3), 6, 1)
    lite = litert_stream(export_tflite(g), xs)
    ys = kiln_stream(g, xs)
    for k, (y, want) in enumerate(zip(ys, lite)):
        np.testing.assert_allclose(y, want[0], rtol=0, atol=1e-6, err_msg=f"run {k}")
    # the stream is not a string of independent inferences: later runs differ from a fresh start
    assert np.abs(kf.run(g, xs[-1])[0] - ys[-1]).max() > 1e-3
    # the re-imported file carries its state the same way
    back = load_tflite(export_tflite(g))
    assert len(back.states) == 2
    for k, (y, want) in enumerate(zip(kiln_stream(back, xs), ys)):
        np.testing.assert_allclose(y, want, rtol=0, atol=1e-6, err_msg=f"re-imported, run {k}")


def test_one_window_equals_the_same_steps_streamed():
    """T steps in one run equal the same steps fed one per run (the state carried between)."""
    g3, g1 = lstm_model(1, 4), lstm_model(1, 1)
    x = stream((1, 4, 3), 1, 2)[0]
    whole = kf.run(g3, x)[0]
    steps = kiln_stream(g1, [x[:, t:t + 1] for t in range(4)])
    np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, rtol=0, atol=1e-6)


@pytest.mark.parametrize("acts", ["int8", "int16"])
def test_ptq_stateful_lstm_is_tflite_micros_bit_exact_over_a_stream(acts, tmp_path):
    N, T = (1, 2) if acts == "int8" else (2, 1)
    g = lstm_model(N, T, head=True)
    cal = np.random.default_rng(2).standard_normal((96, T, 3)).astype(np.float32)
    q = ptq(g, cal, int8_io=True, activations=acts)
    assert len(q.states) == 2
    sdt = {q.types[s].dtype for s in q.states}
    assert sdt == ({"int8", "int16"} if acts == "int8" else {"int16"})
    model = export_tflite(q)
    back = load_tflite(model)
    pkg = compile_pkg(q, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    xs = stream((N, T, 3), 7, 3, acts)
    want = tflm_stream(model, xs)
    ref, imp = kiln_stream(q, xs), kiln_stream(back, xs)
    for k, x in enumerate(xs):
        assert_same(ref[k], want[k], f"reference, run {k}")
        assert_same(imp[k], want[k], f"re-imported, run {k}")
        assert_same(pkg.run(x)[0], want[k], f"host C, run {k}")
    assert not all(np.array_equal(ref[0], y) for y in ref[1:])
    pkg.reset_state()
    assert_same(pkg.run(xs[0])[0], want[0], "host C after reset_state")
    if acts == "int8":          # LiteRT's int8 LSTM (EvalInteger8x8_16) carries the same state
        lite = litert_stream(model, xs)
        worst = max(int(np.abs(a.astype(np.int32) - b[0].astype(np.int32)).max()) for a, b in zip(ref, lite))
        assert worst <= 1, worst


def test_calibration_sees_the_carried_state():
    """The cell state's range is calibrated over the running stream (from the carried state, not
    every sample from zero): the quantised stream tracks the float one."""
    g = lstm_model(1, 1, H=4, seed=3)
    rng = np.random.default_rng(4)
    cal = np.repeat(rng.standard_normal((1, 1, 3)).astype(np.float32), 64, axis=0)  # a steady input: c grows
    q = ptq(g, cal, int8_io=True)
    xs = [cal[:1]] * 30
    yf = kiln_stream(g, xs)[-1]
    iq, oq = q.types[q.inputs[0]].quant, q.types[q.outputs[0]].quant
    xq = np.clip(np.round(cal[:1] / iq.scale[0]) + iq.zero_point[0], -128, 127).astype(np.int8)
    yq = (kiln_stream(q, [xq] * 30)[-1].astype(np.float64) - oq.zero_point[0]) * oq.scale[0]
    assert np.abs(yq - yf).max() < 0.05 * max(np.abs(yf).max(), 0.1), (yq, yf)


def _lstm_graph(variable_like=True):
    rng = np.random.default_rng(7)
    g = Graph("plain")
    g.add_input("x", TensorType((1, 2, 3), "float32"))
    for k, name in enumerate(LSTM_INPUTS[1:13]):
        shape = (4, 3) if k < 4 else (4, 4) if k < 8 else (4,)
        g.add_const(name, (rng.standard_normal(shape) * 0.5).astype(np.float32))
    g.add_const("h0", np.zeros((1, 4), np.float32))
    g.add_const("c0", np.zeros((1, 4), np.float32))
    g.add_node("lstm", list(LSTM_INPUTS), name="y")
    g.outputs = ["y"]
    if variable_like:
        carry_state(g, "y")
    return g.validate()


def test_cell_twins():
    """carry_state's final-cell node is the sequence node's cell twin (same inputs and attributes
    but the output); another cell node, or one with other attributes, is not."""
    g = _lstm_graph()
    seq, twin = g.nodes[0], g.nodes[1]
    assert is_cell_twin(seq, twin) and not is_cell_twin(twin, seq) and not is_cell_twin(seq, seq)
    assert cell_twins(g.nodes) == {"y": twin} and state_nodes(g, seq)[1] is twin
    other = g.add_node("lstm", list(LSTM_INPUTS), {"output": "cell", "cell_clip": 3.0}, name="c_clip")
    assert not is_cell_twin(seq, g.producer(other))
    g.add_node("lstm", list(LSTM_INPUTS), {"output": "cell"}, name="c_again")
    assert cell_twins(g.nodes) == {"y": twin}           # the first twin only
    assert cell_twins([twin]) == {}


def test_a_constant_state_keeps_every_run_from_it():
    g = _lstm_graph(variable_like=False)
    assert not g.states
    xs = stream((1, 2, 3), 3, 5)
    model = export_tflite(g)
    # LiteRT carries the exported variable tensors; Kiln's graph restarts: compare with resets
    for x in xs:
        np.testing.assert_allclose(kf.run(g, x)[0], litert_stream(model, [x])[0][0], atol=1e-6)
    back = load_tflite(model)        # what TFLite would do with the file: a stateful LSTM
    assert len(back.states) == 2


def test_cell_output_gradients():
    """The final-cell node (output='cell') differentiates like the sequence node."""
    g = _lstm_graph(variable_like=False)
    cell = g.add_node("lstm", list(LSTM_INPUTS), {"output": "cell"}, name="c_T")
    g.outputs = [cell]
    x = np.random.default_rng(8).standard_normal((1, 2, 3))
    res = check_grads(g, [x])
    assert res.ok, res


def test_errors():
    g = _lstm_graph(variable_like=False)
    h = g.add_node("relu", ["y"], name="r")
    with pytest.raises(KilnError, match="is not the output of an lstm node"):
        carry_state(g, h)
    g2 = _lstm_graph()
    g2.outputs.append(g2.states["c0"])       # the final cell state read outside the state update
    with pytest.raises(KilnError, match="a stateful LSTM exports as one operator"):
        export_tflite(g2)
    g3 = _lstm_graph(variable_like=False)
    g3.add_node("lstm", list(LSTM_INPUTS), {"output": "cell"}, name="c_T")
    g3.outputs.append("c_T")
    with pytest.raises(KilnError, match="output='cell' exports only as the cell-state update"):
        export_tflite(g3)
    with pytest.raises(KilnError, match="stateful op"):
        F.lstm(np.zeros((1, 1, 3), np.float32), [np.zeros((2, 3), np.float32)] * 4,
               [np.zeros((2, 2), np.float32)] * 4, [np.zeros(2, np.float32)] * 4, np.zeros((1, 2), np.float32),
               np.zeros((1, 2), np.float32), stateful=True)


def test_tflm_mnist_lstm_streams_like_tflite_micro():
    """TFLM's int8 mnist_lstm (converted by TensorFlow: its states are variable tensors) imports
    stateful; cut after the LSTM (its state update kept) and exported, five invocations in a row
    equal TensorFlow Lite Micro's, every LSTM output."""
    g = load_tflite("tests/data/tflm_mnist_lstm/trained_lstm_int8.tflite")
    lstm = next(n for n in g.nodes if n.op == "lstm" and n.attrs["output"] == "sequence")
    assert set(g.states) == set(lstm.inputs[13:15])
    g.outputs = [lstm.name]
    live = set(g.outputs) | set(g.states.values())
    for n in reversed(g.nodes):
        if n.name in live:
            live |= set(n.inputs)
    g.nodes = [n for n in g.nodes if n.name in live]
    xs = stream((1, 28, 28), 5, 9, "int8")
    want = tflm_stream(export_tflite(g.validate()), xs)
    for k, (got, w) in enumerate(zip(kiln_stream(g, xs), want)):
        assert_same(got, w, f"run {k}")
    assert not np.array_equal(kf.run(g, xs[-1])[0], want[-1])      # not what a fresh start gives
