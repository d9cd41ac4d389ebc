"""Reverse mode by graph extension: the backward pass is appended to a copy of the forward graph,
so the result is an ordinary Graph (printable, serialisable, executable, differentiable again)."""
from __future__ import annotations

import numpy as np

from kiln.frontend import functional as F
from kiln.frontend.errors import GraphError
from kiln.frontend.graph import Graph
from kiln.frontend.registry import NONDIFF, get_op
from kiln.frontend.tensor import Tensor
from kiln.frontend.types import TensorType

from .remat import Rematerializer


def _relevant(graph: Graph, of: str, wrt):
    """Nodes on some path from a wrt value to ``of`` (others need no adjoint)."""
    fwd = set(wrt)
    for n in graph.nodes:
        if any(i in fwd for i in n.inputs) and not get_op(n.op).props & {NONDIFF}:
            fwd.add(n.name)
    back = {of}
    for n in reversed(graph.nodes):
        if n.name in back:
            back.update(n.inputs)
    return fwd & back


def backprop(g: Graph, of: str, seed: Tensor, wrt, regions=None):
    """Append to ``g`` the nodes computing d<seed, of>/d(wrt); returns {wrt name: Tensor or None}."""
    relevant = _relevant(g, of, wrt)
    adj: dict[str, Tensor] = {of: seed}
    remat = Rematerializer(g, regions or {})
    fwd_nodes = [n for n in g.nodes if n.name in relevant]
    for node in reversed(fwd_nodes):
        gy = adj.get(node.name)
        if gy is None:
            continue
        opdef = get_op(node.op)
        if NONDIFF in opdef.props:
            continue
        names = remat.names_for(node)
        xs = [Tensor(g, names.get(i, i)) for i in node.inputs]
        y = Tensor(g, names.get(node.name, node.name))
        grads = opdef.rule("vjp")(node, xs, y, gy)
        if len(grads) != len(node.inputs):
            raise GraphError(f"VJP for '{node.op}' returned {len(grads)} gradients for {len(node.inputs)} inputs")
        for i, gi in zip(node.inputs, grads):
            if gi is None or i not in relevant:
                continue
            if gi.shape != g.types[i].shape:
                raise GraphError(f"VJP for '{node.op}' (node {node.name!r}) gave gradient of shape {gi.shape} "
                                 f"for input {i!r} of shape {g.types[i].shape}")
            adj[i] = adj[i] + gi if i in adj else gi
    return {w: adj.get(w) for w in wrt}


def _zeros(g, name):
    t = g.types[name]
    return F.constant(np.zeros(t.shape, t.dtype), g)


def grad(graph: Graph, of: str | None = None, wrt=None, *, keep_outputs=False, name=None) -> Graph:
    """Gradient graph of scalar output ``of`` (default: the first output) with respect to ``wrt``
    (names of inputs or parameters; default: every parameter). Outputs are the gradients in
    ``wrt`` order, preceded by the original outputs when ``keep_outputs``."""
    of = of or graph.outputs[0]
    if graph.types[of].size != 1:
        raise GraphError(f"grad: output {of!r} has shape {graph.types[of].shape}; grad needs a scalar "
                         f"(use vjp for non-scalar outputs)")
    return vjp(graph, of, wrt, keep_outputs=keep_outputs, name=name, _scalar=True)


def vjp(graph: Graph, of: str | None = None, wrt=None, *, keep_outputs=False, name=None, _scalar=False) -> Graph:
    """Vector-Jacobian product graph: a new input ``cotangent`` (shaped like ``of``) is added
    and the outputs are d<cotangent, of>/d(wrt)."""
    of = of or graph.outputs[0]
    wrt = list(graph.params) if wrt is None else list(wrt)
    for w in wrt:
        graph.kind(w)
        if not graph.types[w].is_float:
            raise GraphError(f"cannot differentiate with respect to {w!r} of dtype {graph.types[w].dtype}")
    g = graph.copy()
    g.name = name or f"{'grad' if _scalar else 'vjp'}_{graph.name}"
    t = g.types[of]
    if _scalar:
        seed = F.constant(np.ones(t.shape, t.dtype), g, name=g.fresh("seed"))
    else:
        seed = Tensor(g, g.add_input(g.fresh("cotangent"), TensorType(t.shape, t.dtype)))
    grads = backprop(g, of, seed, wrt, regions=graph.meta.get("checkpoint"))
    outs = []
    for w in wrt:
        gw = grads[w] if grads[w] is not None else _zeros(g, w)
        outs.append(gw.name)
    g.outputs = (list(graph.outputs) if keep_outputs else []) + outs
    g.meta["grad"] = {"of": of, "wrt": wrt, "keep_outputs": keep_outputs}
    g.meta.pop("checkpoint", None)
    if not keep_outputs:
        g.updates = {}
    return prune(g).validate()


def prune(g: Graph) -> Graph:
    """Remove nodes (and constants) that no output or buffer update needs."""
    need = set(g.outputs) | set(g.updates.values())
    keep = []
    for n in reversed(g.nodes):
        if n.name in need:
            keep.append(n)
            need.update(n.inputs)
    dead = [n.name for n in g.nodes if n.name not in need]
    g.nodes = list(reversed(keep))
    for d in dead:
        del g.types[d]
    for c in [c for c in g.consts if c not in need and c not in g.updates]:
        if c.startswith(("const_", "seed_")):
            del g.consts[c]
            del g.types[c]
    g._producer = {}
    return g
