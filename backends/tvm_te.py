"""Whole Kiln graphs as Relax modules built from the ops' TE computes (host LLVM and CUDA).

An op's float lowering is its ``te`` rule, defined next to the op in ``frontend/ops`` (one per
op, shared by every backend; the C backend uses it too, under its int8 and DSP overrides). This
module holds only the graph-level machinery: ``to_relax(graph)`` turns a whole graph into a Relax
module (one ``emit_te`` per node) that both server targets compile, ``missing_lowerings`` and
``check_lowerable`` name nodes without a rule, scalar constants are folded in as constant stages,
and values stored in half precision (``storage_dtype``) reach the rules as float16/bfloat16
outputs whose reductions accumulate in float32.
"""
from __future__ import annotations

import functools
import hashlib
import json

import numpy as np
import tvm
from tvm import te, tirx

from kiln.frontend import ops as _ops  # noqa: F401  (fills the registry)
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
    """Storage dtype of a value of type ``t`` when the target stores floats in ``dtype``."""
    return dtype if t.dtype == "float32" and dtype != "float32" else t.dtype


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


def node_te(graph: Graph, node, te_inputs, dtype="float32"):
    """Build the TE of one node from TE tensors of its inputs (folded scalars become constant stages)."""
    rule = lowering(node.op)
    if rule is None:
        check_lowerable(graph)
    folded = folded_consts(graph)
    xs = []
    for i in node.inputs:
        if i in te_inputs:
            xs.append(te_inputs[i])
        else:
            v = np.asarray(folded[i])
            t = graph.types[i]
            dt = storage_dtype(t, dtype)
            xs.append(const_stage(t.shape, v.ravel()[0].item(), dt, f"const_{_safe(i)}"))
    out = graph.types[node.name]
    out = type(out)(out.shape, storage_dtype(out, dtype))
    try:
        return rule(xs, node.attrs, out)
    except NotImplementedError:
        raise
    except Exception as e:
        raise RuntimeError(f"TE lowering of node {node.name!r} ({node.op}, attrs {node.attrs}) failed: "
                           f"{type(e).__name__}: {e}") from e


def to_relax(graph: Graph, dtype="float32", with_updates=False):
    """Relax module whose ``main`` takes ``runtime_args(graph)`` and returns a tuple of the graph
    outputs (then the buffer updates when ``with_updates``). One ``emit_te`` per node: Relax's
    FuseOps/FuseTIR merge element-wise epilogues into their producers afterwards."""
    from tvm import relax
    check_lowerable(graph)
    bb = relax.BlockBuilder()
    names = runtime_args(graph)
    rvars = {}
    for n in names:
        t = graph.types[n]
        rvars[n] = relax.Var(_safe(n), relax.TensorType(t.shape, storage_dtype(t, dtype)))
    outs = list(graph.outputs) + (list(graph.updates.values()) if with_updates else [])
    with bb.function("main", [rvars[n] for n in names]):
        with bb.dataflow():
            for node in graph.nodes:
                args = [i for i in node.inputs if i in rvars]

                def fte(*tensors, _node=node, _args=args):
                    return node_te(graph, _node, dict(zip(_args, tensors)), dtype)
                rvars[node.name] = bb.emit_te(fte, *[rvars[i] for i in args],
                                              primfunc_name_hint=_safe(node.name))
            res = []
            for o in outs:
                if o not in rvars:   # an output that is a folded constant
                    t = graph.types[o]
                    stage = const_stage(t.shape, np.asarray(graph.consts[o]).ravel()[0].item(),
                                        storage_dtype(t, dtype), "const")
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


