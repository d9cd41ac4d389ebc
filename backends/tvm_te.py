"""Whole Kiln graphs as Relax modules built from the ops' TE computes (host LLVM and CUDA).

An op's float lowering is its ``te`` rule, defined next to the op in ``frontend/ops`` (one per
op, shared by every backend; the C backend uses it too, under its int8 and DSP overrides). This
module holds only the graph-level machinery: ``to_relax(graph)`` turns a whole graph into a Relax
module (one ``emit_te`` per node) that both server targets compile, ``missing_lowerings`` and
``check_lowerable`` name nodes without a rule, scalar constants are folded in as constant stages,
and the storage policy of half-precision packages (``precision_plan``, ``apply_loss_scale``):
which dtype each value is stored in and which dtype each node computes in.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math

import numpy as np
import tvm
from tvm import te, tirx

from kiln.frontend import ops as _ops  # noqa: F401  (fills the registry)
from kiln.frontend.errors import KilnError
from kiln.frontend.graph import Graph, Node
from kiln.frontend.ops import te_helpers as T
from kiln.frontend.registry import OPS, get_op
from kiln.frontend.types import TensorType


# ---- whole graphs -----------------------------------------------------------------------------
def lowering(op: str):
    """The op's TE rule as ``rule(xs, attrs, out)`` (its helpers ``T`` bound), or None."""
    fn = get_op(op).te
    return None if fn is None else functools.partial(fn, T)


def missing_lowerings(graph: Graph):
    """[(node name, op)] of nodes whose op has no TE rule."""
    return [(n.name, n.op) for n in graph.nodes if lowering(n.op) is None]


def check_lowerable(graph: Graph, target="a server target"):
    """Raise NotImplementedError naming the first node (and op) without a TE definition, or a
    stateful graph (these targets would run every call from the reset state)."""
    if graph.states:
        raise NotImplementedError(
            f"graph {graph.name!r} is stateful (states {', '.join(graph.states)}: an SVDF's memory, carried from "
            f"one run to the next); {target} cannot keep state between runs: use the reference or the C backend")
    for k, n in enumerate(graph.nodes):
        if lowering(n.op) is None:
            have = sorted(o for o in OPS if OPS[o].te is not None)
            raise NotImplementedError(
                f"TE lowering for '{n.op}' not implemented: node {k} {n.name!r} of graph {graph.name!r} "
                f"cannot be compiled for {target} (ops with TE definitions: {', '.join(have)}; "
                f"define it with defrule('{n.op}', 'te') next to the op in frontend/ops)")
        for i in n.inputs:
            t = graph.types[i]
            if t.quant is not None:
                raise NotImplementedError(
                    f"node {n.name!r} ({n.op}) has a quantised operand {i!r} ({t}); {target} compiles float "
                    f"graphs only (int8 graphs go to the C backend)")


def storage_dtype(t, dtype):
    """Storage dtype of a value of type ``t`` when the target stores every float in ``dtype``
    (the "uniform" policy)."""
    return dtype if t.dtype == "float32" and dtype != "float32" else t.dtype


# ---- the storage policy of half-precision packages ---------------------------------------------
# "uniform": every float32 value is stored in the package dtype and every node computes on half
#   operands (reductions accumulate in float32): the smallest packages; inference default.
# "mixed" (automatic mixed precision, as PyTorch AMP / NVIDIA's mixed-precision training): the ops
#   of HALF_OPS (the matmul and convolution family, forward and backward) read their float operands
#   in half and accumulate in float32; every other op (BatchNorm's statistics and arithmetic, which
#   the graph spells out as mean/sub/mul/div/sqrt, and their gradients; softmax, log_softmax and
#   the loss; reductions; element-wise ops) computes in float32. A value is stored in half when its
#   producer is a HALF_OPS node or when every node reading it is one (it is read in half anyway);
#   graph outputs (loss, predictions, float32 master gradients) and buffer updates are float32,
#   and so is everything else. Training-step default; float16 steps also get loss scaling
#   (``apply_loss_scale``).
PRECISIONS = ("uniform", "mixed")
HALF_OPS = frozenset({"conv2d", "conv2d_grad_input", "conv2d_grad_weight", "dense", "matmul",
                      "transpose_conv2d"})
# float16 training steps: the backward runs on gradients multiplied by this power of two (see
# docs/server_targets.md "Mixed precision" for how it was chosen); bfloat16 has float32's range
LOSS_SCALE = {"float16": 4096.0, "bfloat16": 1.0, "float32": 1.0}


@dataclasses.dataclass
class PrecisionPlan:
    """Where each value is stored and in which dtype each node computes (``precision_plan``)."""
    dtype: str                   # the package's half dtype (or float32)
    policy: str                  # "uniform" | "mixed"
    storage: dict                # {value: storage dtype} for every value of the graph
    compute: dict                # {node: dtype its float operands are read in and its rule computes in}
    loss_scale: float = 1.0      # the gradient-path scale baked into the graph (apply_loss_scale)

    def summary(self):
        """The manifest's ``precision`` entry: policy, dtypes, loss scale and each float value's
        storage dtype."""
        floats = {v: d for v, d in sorted(self.storage.items()) if d in ("float32", "float16", "bfloat16")}
        count = {d: sum(1 for x in floats.values() if x == d) for d in sorted(set(floats.values()))}
        return {"policy": self.policy, "half_dtype": self.dtype, "loss_scale": self.loss_scale,
                "half_ops": sorted(HALF_OPS) if self.policy == "mixed" else "all", "values_by_dtype": count,
                "storage": floats}


def precision_plan(graph: Graph, dtype="float32", policy="uniform", loss_scale=1.0) -> PrecisionPlan:
    """The one place that decides each value's storage dtype and each node's compute dtype for a
    package of half dtype ``dtype`` under ``policy`` (see PRECISIONS above). Values that are not
    float32 in the graph (int, bool, float64) keep their dtype."""
    if policy not in PRECISIONS:
        raise KilnError(f"precision must be one of {PRECISIONS}, got {policy!r}")
    if dtype == "float32" or policy == "uniform":
        storage = {v: storage_dtype(t, dtype) for v, t in graph.types.items()}
        return PrecisionPlan(dtype, policy, storage, {n.name: dtype for n in graph.nodes}, loss_scale)
    compute = {n.name: dtype if n.op in HALF_OPS else "float32" for n in graph.nodes}
    uses = graph.consumers()
    pinned = set(graph.outputs) | set(graph.updates) | set(graph.updates.values())
    storage = {}
    for v, t in graph.types.items():
        p = graph.producer(v)
        half = (p is not None and p.op in HALF_OPS) or (uses[v] and all(n.op in HALF_OPS for n in uses[v]))
        storage[v] = dtype if t.dtype == "float32" and half and v not in pinned else t.dtype
    return PrecisionPlan(dtype, policy, storage, compute, loss_scale)


def apply_loss_scale(graph: Graph, scale: float):
    """Loss scaling of a training-step graph (kiln.grad): the backward's seed d(loss)/d(loss) = 1
    becomes ``scale``, so every value of the backward pass is ``scale`` times the true gradient
    (the backward is linear in its seed) and gradients that float16 would flush to zero or store
    as subnormals stay normal; each gradient output is then multiplied by 1/``scale`` in float32
    (a new node under the output's name; the scaled value is renamed ``<name>.scaled``). A power
    of two, so scaling and unscaling are exact. Returns the graph unchanged when ``scale`` is 1 or
    the graph has no seed."""
    seeds = [c for c in graph.consts if c.startswith("seed_") and graph.types[c].size == 1]
    if scale == 1 or "grad" not in graph.meta or len(seeds) != 1:
        return graph
    if not (scale > 0 and math.frexp(scale)[0] == 0.5):
        raise KilnError(f"loss scale must be a positive power of two, got {scale}")
    g = graph.copy()
    seed = seeds[0]
    g.consts[seed] = np.asarray(g.consts[seed] * scale, g.consts[seed].dtype)
    grads = [o for o in dict.fromkeys(g.outputs[len(g.outputs) - len(g.meta["grad"]["wrt"]):])
             if g.producer(o) is not None and g.types[o].dtype == "float32"]
    ren = {o: _fresh_name(g, f"{o}.scaled") for o in grads}
    for n in g.nodes:
        n.inputs = [ren.get(i, i) for i in n.inputs]
        if n.name in ren:
            g.types[ren[n.name]] = g.types.pop(n.name)
            n.name = ren[n.name]
    g.updates = {b: ren.get(v, v) for b, v in g.updates.items()}
    inv = g.add_const(g.fresh("const_inv_loss_scale"), np.asarray(1.0 / scale, np.float32))
    for o in grads:
        g.nodes.append(Node(o, "mul", [ren[o], inv], {}))
        g.types[o] = g.types[ren[o]]
    g._producer = {}
    g.meta = dict(g.meta, loss_scale=float(scale))
    return g.validate()


def _fresh_name(g: Graph, name):
    base, k = name, 1
    while name in g.types:
        name = f"{base}{k}"
        k += 1
    return name


def folded_consts(graph: Graph):
    """Constants folded into kernels as immediates: single-element literal constants that are not
    buffers (not updated in train mode, not module state). Everything else is a runtime argument,
    so compiled code does not depend on parameter or buffer values."""
    out = {}
    for name, v in graph.consts.items():
        if v.size == 1 and name not in graph.updates and "." not in name and graph.types[name].dtype != "bfloat16":
            out[name] = v
    return out


def graph_signature(graph: Graph, dtype="float32", extra=None):
    """Hash of the graph structure: inputs/param/const types, nodes, outputs, folded scalar
    constants. Parameter and buffer values are not part of it."""
    folded = folded_consts(graph)
    d = {
        "inputs": [(i, graph.types[i].to_json()) for i in graph.inputs],
        "tensors": [(k, graph.types[k].to_json()) for k in list(graph.params) + list(graph.consts) if k not in folded],
        "folded": sorted((k, np.asarray(v).ravel().tolist(), str(np.asarray(v).dtype)) for k, v in folded.items()),
        "nodes": [(n.name, n.op, list(n.inputs), n.attrs) for n in graph.nodes],
        "outputs": list(graph.outputs),
        "updates": sorted(graph.updates.items()),
        "dtype": dtype,
        "extra": extra,
        "tvm": tvm.__version__,
    }
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:24]


def runtime_args(graph: Graph):
    """Names of the compiled function's arguments, in order: graph inputs, then parameters and
    constants that are not folded."""
    folded = folded_consts(graph)
    return list(graph.inputs) + [k for k in list(graph.params) + list(graph.consts) if k not in folded]


def const_stage(shape, value, dtype, name):
    """A TE stage holding ``value`` everywhere (inlined into its consumer by any schedule)."""
    if dtype == "bool":
        value = bool(value)
    return te.compute(tuple(shape), lambda *_: tirx.const(value, dtype), name=name)


def node_te(graph: Graph, node, te_inputs, dtype="float32", plan: PrecisionPlan | None = None):
    """Build the TE of one node from TE tensors of its inputs (folded scalars become constant
    stages). Under ``plan`` (default: every float32 value stored in ``dtype``) float inputs stored
    in another dtype than the node's compute dtype are cast on read, the rule computes in that
    dtype (HALF_OPS nodes: half operands, float32 accumulation, output written in its storage
    dtype), and the result is cast to the output's storage dtype."""
    rule = lowering(node.op)
    if rule is None:
        check_lowerable(graph)
    plan = plan or precision_plan(graph, dtype)
    cdt = plan.compute[node.name]
    folded = folded_consts(graph)
    xs = []
    for i in node.inputs:
        t = graph.types[i]
        want = cdt if t.dtype == "float32" else t.dtype
        if i in te_inputs:
            xs.append(_cast_stage(te_inputs[i], want, f"read_{_safe(i)}"))
        else:
            v = np.asarray(folded[i])
            xs.append(const_stage(t.shape, v.ravel()[0].item(), want, f"const_{_safe(i)}"))
    out = graph.types[node.name]
    store = plan.storage[node.name]
    rule_out = type(out)(out.shape, store if out.dtype != "float32" or node.op in HALF_OPS or cdt == store else cdt)
    try:
        y = rule(xs, node.attrs, rule_out)
    except NotImplementedError:
        raise
    except Exception as e:
        raise RuntimeError(f"TE lowering of node {node.name!r} ({node.op}, attrs {node.attrs}) failed: "
                           f"{type(e).__name__}: {e}") from e
    return _cast_stage(y, store, f"store_{_safe(node.name)}")


def _cast_stage(x, dtype, name):
    """``x``, or a stage reading it as ``dtype`` (inlined into its consumer by the schedules)."""
    if str(x.dtype) == dtype:
        return x
    return te.compute(x.shape, lambda *i: x(*i).astype(dtype), name=name)


def to_relax(graph: Graph, dtype="float32", with_updates=False, plan: PrecisionPlan | None = None):
    """Relax module whose ``main`` takes ``runtime_args(graph)`` and returns a tuple of the graph
    outputs (then the buffer updates when ``with_updates``). One ``emit_te`` per node: Relax's
    FuseOps/FuseTIR merge element-wise epilogues into their producers afterwards. ``plan``
    (``precision_plan``) gives each value's storage dtype; default: every float32 value in ``dtype``."""
    from tvm import relax
    check_lowerable(graph)
    plan = plan or precision_plan(graph, dtype)
    bb = relax.BlockBuilder()
    names = runtime_args(graph)
    rvars = {}
    for n in names:
        t = graph.types[n]
        rvars[n] = relax.Var(_safe(n), relax.TensorType(t.shape, plan.storage[n]))
    outs = list(graph.outputs) + (list(graph.updates.values()) if with_updates else [])
    with bb.function("main", [rvars[n] for n in names]):
        with bb.dataflow():
            for node in graph.nodes:
                args = [i for i in node.inputs if i in rvars]

                def fte(*tensors, _node=node, _args=args):
                    return node_te(graph, _node, dict(zip(_args, tensors)), dtype, plan)
                rvars[node.name] = bb.emit_te(fte, *[rvars[i] for i in args],
                                              primfunc_name_hint=_safe(node.name))
            res = []
            for o in outs:
                if o not in rvars:   # an output that is a folded constant
                    t = graph.types[o]
                    stage = const_stage(t.shape, np.asarray(graph.consts[o]).ravel()[0].item(),
                                        plan.storage[o], "const")
                    rvars[o] = bb.emit_te(lambda: stage, primfunc_name_hint=_safe(o))
                res.append(rvars[o])
            gv = bb.emit_output(relax.Tuple(res))
        bb.emit_func_output(gv)
    return bb.get()


def _safe(name):
    s = "".join(ch if ch.isalnum() else "_" for ch in name)
    return s if s and not s[0].isdigit() else "v_" + s


# ---- dropout: the mask is made on the host ----------------------------------------------------
def externalize_dropout(graph: Graph):
    """Dropout's mask comes from NumPy's generator seeded by (key, salt) (the reference), which a
    kernel cannot reproduce. Rewrite every ``dropout(x, key)`` into ``mul(x, mask)`` where ``mask``
    is a new graph input that the runner computes on the host with the reference's
    ``dropout_mask`` (so compiled dropout matches the reference exactly). Returns (graph, masks)
    with masks [{name, key, shape, salt, rate, dtype}]; the graph is unchanged when it has no
    dropout."""
    if not any(n.op == "dropout" for n in graph.nodes):
        return graph, []
    g = graph.copy()
    masks, by_spec, nodes = [], {}, []
    for n in g.nodes:
        if n.op != "dropout":
            nodes.append(n)
            continue
        x, key = n.inputs
        t = g.types[x]
        spec = (key, t.shape, n.attrs["salt"], float(n.attrs["rate"]), t.dtype)
        if spec not in by_spec:
            name = f"{key}.mask{len(masks)}"
            g.types[name] = TensorType(t.shape, t.dtype)
            g.inputs.append(name)
            by_spec[spec] = name
            masks.append({"name": name, "key": key, "shape": list(t.shape), "salt": spec[2], "rate": spec[3],
                          "dtype": t.dtype})
        nodes.append(Node(n.name, "mul", [x, by_spec[spec]], {}))
    g.nodes = nodes
    g._producer = {}
    g.meta = dict(g.meta, dropout_masks=masks)
    return g.validate(), masks


