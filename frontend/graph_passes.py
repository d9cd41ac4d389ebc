"""Graph passes that prepare a float graph for int8: constant folding, BatchNorm folding,
activation fusion, dead-code removal, and re-batching (for calibration and evaluation).

Each pass takes a Graph and returns a new one; the input is never modified.

- :func:`fold_constants` evaluates nodes that read only parameters/constants (e.g. the
  ``running_var + eps -> sqrt -> ...`` chain of an eval-mode BatchNorm) into constants.
- :func:`fold_batchnorm` folds ``conv2d/dense -> mul(c) -> add(d)`` (per output channel constants,
  what an eval-mode BatchNorm traces to) into the conv's weights and bias: ``w' = w * c``,
  ``b' = b * c + d``. A lone ``mul`` or ``add`` is folded the same way.
- :func:`fuse_activations` turns ``conv2d/dense -> relu/relu6`` into the ``activation`` attribute.
- :func:`prepare` runs them all (needs: a float graph; gives: what PTQ and QAT quantise).
"""
from __future__ import annotations

import numpy as np

from .errors import GraphError
from .graph import Graph, Node
from .rebatch import rebatch_attrs
from .registry import get_op
from .types import TensorType


def _reindex(g):
    g._producer = {}
    return g


def _replace_uses(g, old, new):
    for n in g.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]
    g.outputs = [new if o == old else o for o in g.outputs]
    g.updates = {b: (new if v == old else v) for b, v in g.updates.items()}
    g.states = {s: (new if v == old else v) for s, v in g.states.items()}


def eliminate_dead(g: Graph) -> Graph:
    """Drop nodes, parameters and constants that no output depends on."""
    g = g.copy()
    live = set(g.outputs) | set(g.updates.values()) | set(g.updates) | set(g.states.values()) | set(g.states)
    keep = []
    for n in reversed(g.nodes):
        if n.name in live:
            keep.append(n)
            live.update(n.inputs)
    g.nodes = list(reversed(keep))
    for d in (g.params, g.consts):
        for k in [k for k in d if k not in live]:
            del d[k]
            del g.types[k]
    for k in [k for k in g.types if k not in live and k not in g.inputs and k not in g.params and k not in g.consts]:
        del g.types[k]
    return _reindex(g)


def fold_constants(g: Graph) -> Graph:
    """Evaluate every node whose inputs are all parameters or constants into a constant."""
    g = g.copy()
    known = {**g.consts, **g.params}
    keep = []
    for n in g.nodes:
        if n.inputs and all(i in known for i in n.inputs) and n.op not in ("dropout",):
            y = np.asarray(get_op(n.op).rule("ref")([known[i] for i in n.inputs], n.attrs))
            y = y.astype(g.types[n.name].dtype, copy=False)
            known[n.name] = y
            g.consts[n.name] = y
        else:
            keep.append(n)
    g.nodes = keep
    return eliminate_dead(_reindex(g))


def _tensor(g, v):
    if v in g.params:
        return g.params[v]
    return g.consts.get(v)


def _channel_vector(g, v, C):
    """A constant usable as a per-output-channel factor: shape broadcasting to [..., C] only on the
    last axis. Returns a float64 vector of length C, or None."""
    t = _tensor(g, v)
    if t is None:
        return None
    t = np.asarray(t)
    if t.ndim == 0:
        return np.full(C, float(t))
    if t.shape[-1] not in (1, C) or any(s != 1 for s in t.shape[:-1]):
        return None
    return np.broadcast_to(t.reshape(-1).astype(np.float64), (C,)).copy()


def fold_batchnorm(g: Graph) -> Graph:
    """Fold per-channel ``mul``/``add`` constants that follow a conv2d/dense into its weights/bias."""
    g = g.copy()
    changed = True
    while changed:
        changed = False
        cons = g.consumers()
        for k, n in enumerate(g.nodes):
            if n.op not in ("mul", "add") or len(n.inputs) != 2:
                continue
            for side in (0, 1):
                src = g.producer(n.inputs[side])
                other = n.inputs[1 - side]
                if (src is None or src.op not in ("conv2d", "dense") or src.attrs.get("activation", "none") != "none"
                        or len(cons[src.name]) != 1 or src.name in g.outputs):
                    continue
                w_name = src.inputs[1]
                if w_name not in g.params and w_name not in g.consts:
                    continue
                C = g.types[src.name].shape[-1]
                vec = _channel_vector(g, other, C)
                if vec is None or g.types[n.name].shape != g.types[src.name].shape:
                    continue
                w = np.asarray(_tensor(g, w_name), np.float64)
                b = np.asarray(_tensor(g, src.inputs[2]), np.float64) if len(src.inputs) == 3 else np.zeros(C)
                dt = g.types[w_name].dtype
                if n.op == "mul":
                    w = w * vec.reshape((C,) + (1,) * (w.ndim - 1))
                    b = b * vec
                else:
                    b = b + vec
                store = g.params if w_name in g.params else g.consts
                wn, bn = g.fresh(src.name + "_w"), g.fresh(src.name + "_b")
                store[wn] = w.astype(dt)
                g.types[wn] = TensorType(w.shape, dt)
                store[bn] = b.astype(dt)
                g.types[bn] = TensorType(b.shape, dt)
                src.inputs = [src.inputs[0], wn, bn]
                # the mul/add node disappears: its users read the conv
                g.nodes.pop(k)
                _replace_uses(g, n.name, src.name)
                changed = True
                break
            if changed:
                break
        _reindex(g)
    return eliminate_dead(g)


def fuse_activations(g: Graph) -> Graph:
    """``conv2d/dense (activation none) -> relu/relu6`` becomes one node with ``activation``."""
    g = g.copy()
    cons = g.consumers()
    drop = set()
    for n in g.nodes:
        if n.op not in ("relu", "relu6"):
            continue
        src = g.producer(n.inputs[0])
        if (src is None or src.op not in ("conv2d", "dense") or src.attrs.get("activation") != "none"
                or len(cons[src.name]) != 1 or src.name in g.outputs):
            continue
        src.attrs = dict(src.attrs, activation=n.op)
        drop.add(n.name)
        _replace_uses(g, n.name, src.name)
    g.nodes = [n for n in g.nodes if n.name not in drop]
    return eliminate_dead(_reindex(g))


def prepare(g: Graph) -> Graph:
    """fold_constants -> fold_batchnorm -> fuse_activations (the float graph PTQ/QAT quantise)."""
    for i in g.inputs:
        if not g.types[i].is_float:
            raise GraphError(f"prepare: graph input {i!r} is {g.types[i]}; quantisation starts from a float graph")
    return fuse_activations(fold_batchnorm(fold_constants(g)))


def with_batch(g: Graph, n: int) -> Graph:
    """The same graph for batch ``n`` (leading dimension of inputs and activations; reshape and
    broadcast targets and batch-axis slice bounds follow). Lets calibration and evaluation run many samples per call."""
    B = g.types[g.inputs[0]].shape[0] if g.inputs and g.types[g.inputs[0]].shape else None
    if B is None or B == n:
        return g
    h = g.copy()

    def rb(t):
        if t.shape and t.shape[0] == B:
            return TensorType((n,) + t.shape[1:], t.dtype, t.quant)
        return t
    for v in list(h.inputs) + [x.name for x in h.nodes]:
        h.types[v] = rb(h.types[v])
    nodes = []
    for x in h.nodes:
        nodes.append(Node(x.name, x.op, list(x.inputs), dict(rebatch_attrs(x.op, x.attrs, B, n))))
    h.nodes = nodes
    _rebatch_states(h, B, n)
    return _reindex(h)


def _rebatch_states(h, B, n):
    """An lstm's initial states (inputs 13, 14: [B, H] constants, all one value: a zero state) and
    the graph's persistent states (svdf: their reset values) follow the batch too."""
    lstm = [v for x in h.nodes if x.op == "lstm" for v in x.inputs[13:15]]
    for v in lstm + list(h.states):
        a = h.consts.get(v)
        if a is not None and a.ndim == 2 and a.shape[0] == B and a.size and np.all(a == a.flat[0]):
            h.consts[v] = np.full((n,) + a.shape[1:], a.flat[0], a.dtype)
            h.types[v] = TensorType(h.consts[v].shape, h.types[v].dtype, h.types[v].quant)
