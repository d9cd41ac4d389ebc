"""TFLite resource variables (VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE, CALL_ONCE) as graph
states: successive invocations carry the variable as LiteRT does, on Kiln's reference and the host
C package, float and int8; reset returns to CALL_ONCE's initial value; misuse is named."""
import numpy as np
import pytest

from kiln.frontend import executor
from kiln.frontend.errors import KilnError
from kiln.frontend.tflite_import import load_tflite
from tests.frontend.tflite_multi import Subgraph, build

INIT = np.asarray([[0.5, -1.0, 2.0, 0.25]], np.float32)


def model(dtype="float32", init=True, read_after_assign=False):
    """y = x + acc; acc <- y (a running sum): CALL_ONCE initialises acc, every run reads it,
    adds the input and assigns the sum back."""
    q = dict(scale=0.05, zero_point=-3) if dtype == "int8" else {}
    main = Subgraph("main")
    x = main.tensor("x", (1, 4), dtype, **q)
    h = main.tensor("h", (), "resource")
    acc, y = main.tensor("acc", (1, 4), dtype, **q), main.tensor("y", (1, 4), dtype, **q)
    if init:
        main.op("CALL_ONCE", [], [], "CallOnceOptions", InitSubgraphIndex=1)
    main.op("VAR_HANDLE", [], [h], "VarHandleOptions", SharedName="acc")
    main.op("READ_VARIABLE", [h], [acc])
    main.op("ADD", [x, acc], [y])
    main.op("ASSIGN_VARIABLE", [h, y], [])
    outs = [y]
    if read_after_assign:
        z, w = main.tensor("z", (1, 4), dtype, **q), main.tensor("w", (1, 4), dtype, **q)
        main.op("READ_VARIABLE", [h], [z])
        main.op("ADD", [z, z], [w])
        outs.append(w)
    main.inputs, main.outputs = [x], outs
    sg = [main]
    if init:
        ini = Subgraph("init")
        h2 = ini.tensor("h", (), "resource")
        data = INIT if dtype == "float32" else np.clip(np.round(INIT / 0.05) - 3, -128, 127).astype(np.int8)
        c = ini.tensor("c", (1, 4), dtype, data=data, **q)
        ini.op("VAR_HANDLE", [], [h2], "VarHandleOptions", SharedName="acc")
        ini.op("ASSIGN_VARIABLE", [h2, c], [])
        sg.append(ini)
    return build(sg)


def litert_stream(buf, xs):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    it = Interpreter(model_content=buf, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    outs = []
    for x in xs:
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        outs.append([np.array(it.get_tensor(d["index"])) for d in it.get_output_details()])
    return outs


def _inputs(dtype, n=4):
    rng = np.random.default_rng(0)
    if dtype == "int8":
        return [rng.integers(-20, 20, (1, 4)).astype(np.int8) for _ in range(n)]
    return [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("read_after_assign", [False, True])
def test_variables_carry_state_like_litert(dtype, read_after_assign):
    buf = model(dtype, read_after_assign=read_after_assign)
    g = load_tflite(buf)
    assert len(g.states) == 1
    xs = _inputs(dtype)
    want = litert_stream(buf, xs)
    state = {}
    for x, w in zip(xs, want):
        got = executor.run_stateful(g, state, x)
        for a, b in zip(got, w):
            np.testing.assert_array_equal(a, b)
    state.clear()                                   # reset: back to CALL_ONCE's value
    np.testing.assert_array_equal(executor.run_stateful(g, state, xs[0])[0], want[0][0])


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_variables_on_host_c(tmp_path, dtype):
    from kiln.backends import compile as compile_pkg
    buf = model(dtype)
    g = load_tflite(buf)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    xs = _inputs(dtype)
    want = litert_stream(buf, xs)
    for x, w in zip(xs, want):
        np.testing.assert_array_equal(pkg.run(x)[0], w[0])
    pkg.reset_state()
    np.testing.assert_array_equal(pkg.run(xs[0])[0], want[0][0])


def test_uninitialised_variable_is_named():
    with pytest.raises(KilnError, match="variable 'acc' is read before it is initialised"):
        load_tflite(model(init=False))


@pytest.mark.slow
@pytest.mark.qemu
def test_variables_stream_on_board(tmp_path):
    """The int8 running sum streamed on mps2-an386: the state persists across inference requests."""
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    p = tmp_path / "acc.tflite"
    p.write_bytes(model("int8"))
    gold = str(tmp_path / "g.npz")
    assert golden(str(p), gold, [(x,) for x in _inputs("int8", 5)]) == "litert"
    rep = verify(str(p), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 5, rep["results"]
