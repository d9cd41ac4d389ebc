"""Shared by the SVDF tests: random single-SVDF graphs, LiteRT over successive invocations (the
variable state carried), and LiteRT's state layout."""
import numpy as np
import pytest

from kiln.frontend import Graph, TensorType
from tests.quantize.litert_util import q

KWS = "tests/data/tflm_keyword_scrambled"


def svdf_graph(B, I, F, M, rank, *, dtype="int8", state="int16", act="relu", s_x=0.05, z_x=3, s_wf=0.01,
               s_state=0.004, s_wt=0.002, s_out=0.02, z_out=-128, z_state=0, bias=True, seed=0):
    """x -> svdf_state -> svdf, the state a graph state (TFLite's variable tensor)."""
    rng = np.random.default_rng(seed)
    g = Graph("svdf")
    U = F // rank
    if dtype == "int8":
        g.add_input("x", TensorType((B, I), "int8", q(s_x, z_x)))
        g.add_const("wf", rng.integers(-127, 128, (F, I)).astype(np.int8), q(s_wf))
        lim = 127 if state == "int8" else 32767
        g.add_const("wt", rng.integers(-lim, lim + 1, (F, M)).astype(state), q(s_wt))
        g.add_const("b", rng.integers(-20000, 20000, (U,)).astype(np.int32) * int(bias), q(s_state * s_wt))
        g.add_const("st", np.full((B, F * M), z_state, state), q(s_state, z_state))
        out = TensorType((B, U), "int8", q(s_out, z_out))
    else:
        g.add_input("x", TensorType((B, I), "float32"))
        g.add_const("wf", rng.normal(size=(F, I)).astype(np.float32))
        g.add_const("wt", rng.normal(size=(F, M)).astype(np.float32))
        g.add_const("b", rng.normal(size=(U,)).astype(np.float32) * bias)
        g.add_const("st", np.zeros((B, F * M), np.float32))
        out = None
    g.add_node("svdf_state", ["x", "wf", "st"], name="st_next")
    g.add_node("svdf", ["st_next", "wt", "b"], {"rank": rank, "activation": act}, name="y", out_type=out)
    g.states["st"] = "st_next"
    g.outputs = ["y"]
    return g.validate()


def inputs(g, n, seed):
    rng = np.random.default_rng(seed)
    t = g.types[g.inputs[0]]
    if t.dtype == "float32":
        return [rng.normal(size=t.shape).astype(np.float32) for _ in range(n)]
    lo, hi = (-128, 128) if t.dtype == "int8" else (-32768, 32768)
    return [rng.integers(lo, hi, t.shape).astype(t.dtype) for _ in range(n)]


def litert_stream(model, xs, tensors=()):
    """Successive invocations of one interpreter (BUILTIN_REF; the variable tensors carried):
    per input the output and the named tensor indices."""
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    kw = {"model_content": model} if isinstance(model, bytes) else {"model_path": model}
    it = interp.Interpreter(**kw, experimental_op_resolver_type=interp.OpResolverType.BUILTIN_REF,
                            experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    res = []
    for x in xs:
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        res.append([it.get_tensor(it.get_output_details()[0]["index"])] + [it.get_tensor(i) for i in tensors])
    return res



def two_svdf_graph(seed=0):
    """int8 x [1, 6] -> SVDF (int16 state, 8 filters, rank 2, memory 5) -> SVDF (int8 state with a zero
    point, TFLite Micro's 8-bit SVDF, 6 filters, rank 3, memory 3): both state kinds in one model."""
    rng = np.random.default_rng(seed)
    g = Graph("two_svdf")
    g.add_input("x", TensorType((1, 6), "int8", q(0.05, 3)))
    prev = "x"
    for k, (F, rank, M, sdt, zs, s_st) in enumerate([(8, 2, 5, "int16", 0, 0.004), (6, 3, 3, "int8", -20, 0.15)]):
        U = F // rank
        I = g.types[prev].shape[1]
        lim = 127 if sdt == "int8" else 20000
        g.add_const(f"wf{k}", rng.integers(-127, 128, (F, I)).astype(np.int8), q(0.01))
        g.add_const(f"wt{k}", rng.integers(-lim, lim + 1, (F, M)).astype(sdt), q(0.002 if sdt == "int16" else 0.02))
        s_wt = 0.002 if sdt == "int16" else 0.02
        g.add_const(f"b{k}", rng.integers(-2000, 2000, (U,)).astype(np.int32), q(s_st * s_wt))
        g.add_const(f"st{k}", np.full((1, F * M), zs, sdt), q(s_st, zs))
        g.add_node("svdf_state", [prev, f"wf{k}", f"st{k}"], name=f"st{k}_next")
        g.add_node("svdf", [f"st{k}_next", f"wt{k}", f"b{k}"], {"rank": rank, "activation": "relu"}, name=f"y{k}",
                   out_type=TensorType((1, U), "int8", q(0.03 if k == 0 else 0.05, -128 if k == 0 else 5)))
        g.states[f"st{k}"] = f"st{k}_next"
        prev = f"y{k}"
    g.outputs = [prev]
    return g.validate()
