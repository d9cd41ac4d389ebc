"""Graph states exported as TFLite resource variables (quantize/tflite_variables.py): a CALL_ONCE
initialisation subgraph assigns the reset values, the main subgraph reads each state with
READ_VARIABLE and assigns its next value. Streams of several invocations without reset agree with
the original file in LiteRT (float within 1e-6, int8 bit-exact) and with Kiln's reference, and the
exported file imports back to the same behaviour."""
import numpy as np
import pytest

from kiln.frontend import executor
from kiln.frontend.graph import Graph
from kiln.frontend.tflite_import import load_tflite
from kiln.frontend.types import QParams, TensorType
from kiln.quantize import ExportError, export_tflite
from tests.frontend.svdf_util import svdf_graph
from tests.frontend.test_variables import _inputs, litert_stream, model


def _same(a, b, dtype):
    for u, v in zip(a, b):
        assert len(u) == len(v)
        for p, q in zip(u, v):
            if dtype == "float32":
                np.testing.assert_allclose(p, q, rtol=0, atol=1e-6)
            else:
                np.testing.assert_array_equal(p, q)


def _stream(g, xs):
    state = {}
    return [executor.run_stateful(g, state, x) for x in xs]


def _ops(buf, sub):
    import tflite
    m = tflite.Model.GetRootAsModel(buf, 0)
    s = m.Subgraphs(sub)
    return [m.OperatorCodes(s.Operators(i).OpcodeIndex()).BuiltinCode() for i in range(s.OperatorsLength())]


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("read_after_assign", [False, True])
def test_imported_variables_round_trip(dtype, read_after_assign):
    import tflite
    buf = model(dtype, read_after_assign=read_after_assign)
    g = load_tflite(buf)
    out = export_tflite(g)
    op = tflite.BuiltinOperator
    assert _ops(out, 0)[:3] == [op.CALL_ONCE, op.VAR_HANDLE, op.READ_VARIABLE]
    assert _ops(out, 0)[-1] == op.ASSIGN_VARIABLE and _ops(out, 1) == [op.VAR_HANDLE, op.ASSIGN_VARIABLE]
    xs = _inputs(dtype, 6)
    want = litert_stream(buf, xs)
    _same(litert_stream(out, xs), want, dtype)
    h = load_tflite(out)
    assert list(h.states) == list(g.states)                             # the variable keeps its name
    _same(_stream(h, xs), want, dtype)
    assert export_tflite(h) == out


def ring_graph():
    """A streaming window: the state keeps the last 3 frames (reset: a fixed pattern); each run
    appends the input frame, outputs a weighted sum over the window and drops the oldest frame."""
    rng = np.random.default_rng(3)
    g = Graph("ring")
    g.add_input("x", TensorType((1, 1, 4), "float32"))
    g.add_const("buf", rng.standard_normal((1, 3, 4)).astype(np.float32))
    g.add_const("w", rng.standard_normal((1, 4, 4)).astype(np.float32))
    g.add_node("concat", ["buf", "x"], {"axis": 1}, name="win")
    g.add_node("slice", ["win"], {"begin": [0, 1, 0], "end": [1, 4, 4], "strides": None}, name="buf_next")
    g.add_node("mul", ["win", "w"], name="prod")
    g.add_node("sum", ["prod"], {"axes": [1], "keepdims": False}, name="y")
    g.states["buf"] = "buf_next"
    g.outputs = ["y"]
    return g.validate()


def _frames(n, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 1, 4)).astype(np.float32) for _ in range(n)]


def ring_graph_int8():
    """ring_graph in int8 as the importer or PTQ writes it: the window keeps the input's
    quantisation; the output adds a constant (TFLite's int8 ADD rescaling)."""
    rng = np.random.default_rng(4)
    qx, qc, qy = QParams(0.04, -5), QParams(0.02, 7), QParams(0.07, 3)
    g = Graph("ring_int8")
    g.add_input("x", TensorType((1, 1, 4), "int8", qx))
    g.add_const("buf", rng.integers(-128, 128, (1, 3, 4)).astype(np.int8), qx)
    g.add_const("c", rng.integers(-128, 128, (1, 4, 4)).astype(np.int8), qc)
    g.add_node("concat", ["buf", "x"], {"axis": 1}, name="win", out_type=TensorType((1, 4, 4), "int8", qx))
    g.add_node("slice", ["win"], {"begin": [0, 1, 0], "end": [1, 4, 4], "strides": None}, name="buf_next",
               out_type=TensorType((1, 3, 4), "int8", qx))
    g.add_node("add", ["win", "c"], name="y", out_type=TensorType((1, 4, 4), "int8", qy))
    g.states["buf"] = "buf_next"
    g.outputs = ["y"]
    return g.validate()


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_kiln_state(dtype):
    """A state built in Kiln: exported, LiteRT over 7 invocations and the re-import agree."""
    if dtype == "float32":
        g, xs, close = ring_graph(), _frames(7), np.allclose
    else:
        rng = np.random.default_rng(5)
        g, close = ring_graph_int8(), np.array_equal
        xs = [rng.integers(-128, 128, (1, 1, 4)).astype(np.int8) for _ in range(7)]
    want = _stream(g, xs)
    assert not close(want[3][0], executor.run(g, xs[3])[0])          # the state matters
    out = export_tflite(g)
    _same(litert_stream(out, xs), want, dtype)
    _same(_stream(load_tflite(out), xs), want, dtype)


def test_state_shared_with_svdf_is_refused():
    """An SVDF carries its state as its own variable tensor; another reader of that state would
    need a resource variable too, which TFLite cannot tie to the SVDF's tensor."""
    g = svdf_graph(1, 2, 4, 2, 1)
    g.add_node("relu", ["st"], name="st_seen")
    g.outputs.append("st_seen")
    with pytest.raises(ExportError, match="graph state 'st': it is read by a node other than the op that carries"):
        export_tflite(g.validate())


def test_state_shared_with_svdf_read_first_is_refused():
    g = svdf_graph(1, 2, 4, 2, 1)
    g.add_node("relu", ["st"], name="st_seen")
    g.nodes.insert(0, g.nodes.pop())             # the other reader comes before the svdf
    g.outputs.append("st_seen")
    with pytest.raises(ExportError, match="graph state 'st': it is read by a node other than the op that carries"):
        export_tflite(g.validate())


def test_state_update_before_relu_is_not_fused():
    """acc <- x + acc, y = relu(x + acc): the sum is the state's next value, so the relu is not
    folded into the ADD (whose output would then be the clamped value)."""
    g = Graph("relu_acc")
    g.add_input("x", TensorType((1, 4), "float32"))
    g.add_const("acc", np.asarray([[0.5, -1.0, 2.0, -0.25]], np.float32))
    g.add_node("add", ["x", "acc"], name="s")
    g.add_node("relu", ["s"], name="y")
    g.states["acc"] = "s"
    g.outputs = ["y"]
    xs = [x.reshape(1, 4) for x in _frames(5)]
    want = _stream(g.validate(), xs)
    out = export_tflite(g)
    _same(litert_stream(out, xs), want, "float32")
    _same(_stream(load_tflite(out), xs), want, "float32")


def test_svdf_state_beside_a_variable():
    """An SVDF keeps its state as its variable tensor while another state (the previous input)
    becomes a resource variable, in one model."""
    import tflite
    g = svdf_graph(1, 3, 4, 2, 1, dtype="float32")
    g.add_const("prev", np.full((1, 3), 0.5, np.float32))
    g.add_node("reshape", ["x"], {"shape": [1, 3]}, name="prev_next")
    g.add_node("sub", ["x", "prev"], name="dx")
    g.states["prev"] = "prev_next"
    g.outputs.append("dx")
    xs = [np.random.default_rng(k).standard_normal((1, 3)).astype(np.float32) for k in range(5)]
    want = _stream(g.validate(), xs)
    out = export_tflite(g)
    m = tflite.Model.GetRootAsModel(out, 0)
    main = m.Subgraphs(0)
    assert sum(main.Tensors(i).IsVariable() for i in range(main.TensorsLength())) == 1
    assert _ops(out, 1) == [tflite.BuiltinOperator.VAR_HANDLE, tflite.BuiltinOperator.ASSIGN_VARIABLE]
    got = litert_stream(out, xs)
    for u, v in zip(got, want):
        np.testing.assert_allclose(u[0], v[0], rtol=1e-5, atol=1e-6)     # SVDF: LiteRT's float sums
        np.testing.assert_allclose(u[1], v[1], rtol=0, atol=1e-6)
    h = load_tflite(out)
    assert len(h.states) == 2
    _same(_stream(h, xs), want, "float32")


def test_two_states_keep_distinct_variables():
    """States 'acc' and 'var_acc' (the importer's name for a variable 'acc') stay two variables."""
    g = Graph("two")
    g.add_input("x", TensorType((1, 4), "float32"))
    g.add_const("acc", np.ones((1, 4), np.float32))
    g.add_const("var_acc", np.full((1, 4), -2.0, np.float32))
    g.add_node("add", ["x", "acc"], name="a")
    g.add_node("mul", ["x", "var_acc"], name="b")
    g.add_node("sub", ["a", "b"], name="y")
    g.states.update({"acc": "a", "var_acc": "b"})
    g.outputs = ["y"]
    xs = [x.reshape(1, 4) for x in _frames(5)]
    want = _stream(g.validate(), xs)
    out = export_tflite(g)
    _same(litert_stream(out, xs), want, "float32")
    h = load_tflite(out)
    assert len(h.states) == 2
    _same(_stream(h, xs), want, "float32")


def test_ptq_keeps_a_state_and_exports_it(tmp_path):
    """PTQ of a float graph with a state: the int8 graph keeps the state (range: its reset value
    and its calibrated next value; the next value requantised to the state's type where they
    differ), bit-exact over a stream with TensorFlow Lite Micro's interpreter after export, near
    the float stream."""
    tflm = pytest.importorskip("kiln.tflm")
    pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
    from kiln.quantize import ptq
    g = ring_graph()
    xs = _frames(40, seed=2)
    q = ptq(g, np.concatenate(xs[:32]), int8_io=False)
    assert len(q.states) == 1
    (s, nxt), = q.states.items()
    assert q.types[s].quant == q.types[nxt].quant and q.types[s].dtype == "int8"
    test = xs[32:]
    got = _stream(q, test)
    path = tmp_path / "ring_int8.tflite"
    path.write_bytes(export_tflite(q))
    _same(tflm.run_tflm(str(path), [(x,) for x in test], stream=True), got, "int8")
    # near the float stream, the float values clipped to what the output's int8 type holds (a
    # test frame drives one sum past the calibrated range: -4.09 in float, -3.54 the int8 floor)
    qy = q.types["y"].quant
    lo, hi = ((np.asarray([-128, 127]) - qy.zero_point[0]) * qy.scale[0]).tolist()
    want = [np.clip(w[0], lo, hi) for w in _stream(g, test)]
    scale = max(np.abs(w).max() for w in want)
    assert max(np.abs(a[0] - b).max() for a, b in zip(got, want)) < 0.05 * scale
