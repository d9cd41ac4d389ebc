"""The NumPy reference executor: runs any Graph node by node with each op's reference rule.

Values are freed after their last use, so ``peak_live_bytes`` reports what the schedule needs
(inputs and node outputs; parameters and constants are not counted). With ``check=True`` the first
node whose output holds NaN or Inf raises :class:`NumericsError` naming the node and the op.
Nodes with quantised operands (a TensorType with ``quant``) run the op's int8 reference. A
stateful LSTM's sequence node and its cell twin (``lstm_state.cell_twins``) share one run of the
recurrence: the first of the two computes both values.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import ops  # noqa: F401  (fills the registry)
from .errors import GraphError, NumericsError
from .graph import Graph
from .lstm_state import cell_twins
from .ops.recurrent import lstm_states
from .ops.recurrent_16x8 import lstm_16x8_states
from .registry import get_op
from .types import np_dtype


@dataclasses.dataclass
class RunStats:
    peak_live_bytes: int = 0
    nodes_run: int = 0


def _is_quantized(graph, node):
    return graph.types[node.name].quant is not None or any(graph.types[i].quant is not None for i in node.inputs)


def prepare_feeds(graph: Graph, args, feeds):
    if feeds is None:
        feeds = {}
    else:
        feeds = dict(feeds)
    if args:
        if len(args) > len(graph.inputs):
            raise GraphError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs, got {len(args)}")
        feeds.update(zip(graph.inputs, args))
    out = {}
    for name in graph.inputs:
        if name not in feeds:
            raise GraphError(f"missing input {name!r} (graph inputs: {graph.inputs})")
        t = graph.types[name]
        v = np.asarray(feeds[name])
        if v.shape != t.shape:
            raise GraphError(f"input {name!r}: expected shape {t.shape}, got {v.shape}")
        want = np_dtype(t.dtype)
        if v.dtype != want:
            if v.dtype.kind != want.kind and not (v.dtype.kind in "iu" and want.kind in "iu"):
                raise GraphError(f"input {name!r}: expected {t.dtype}, got {v.dtype}")
            v = v.astype(want)
        out[name] = v
    extra = set(feeds) - set(graph.inputs)
    if extra:
        raise GraphError(f"unknown inputs {sorted(extra)}; graph inputs are {graph.inputs}")
    return out


def _guarded(k, node, compute):
    """``compute()`` for node k, a failure of its reference rule named with the node."""
    try:
        # NaN/Inf are values like any other here; check=True is the way to stop at the first
        with np.errstate(all="ignore"):
            return compute()
    except (NotImplementedError, GraphError, NumericsError):
        raise
    except Exception as e:  # a reference rule failed: say where
        raise GraphError(f"node {k} {node.name!r} ({node.op}) failed: {type(e).__name__}: {e}") from e


def _evaluate(graph, k, node, xs):
    """Node k's value by its op's reference rule (the int8 one for quantised operands)."""
    opdef = get_op(node.op)
    if opdef.int8_ref is not None and _is_quantized(graph, node):
        types = [graph.types[i] for i in node.inputs]
        return _guarded(k, node, lambda: opdef.int8_ref(xs, node.attrs, types, graph.types[node.name]))
    return _guarded(k, node, lambda: opdef.rule("ref")(xs, node.attrs))


def _shared_runs(graph):
    """{node: partner} for each stateful lstm and its cell twin (``lstm_state.cell_twins``): the
    first of the two in the schedule runs the recurrence once and keeps the partner's value."""
    out = {}
    for seq, twin in cell_twins(graph.nodes).items():
        out[seq], out[twin.name] = twin, graph.producer(seq)
    return out


def _evaluate_pair(graph, k, node, other, xs):
    """(node's value, its partner's) from one run of the lstm recurrence both read: the sequence
    and the final cell state, as the C backend's kernel writes both."""
    seq = node if node.attrs.get("output", "sequence") == "sequence" else other
    if _is_quantized(graph, seq):
        types = [graph.types[i] for i in seq.inputs]
        ys = _guarded(k, node, lambda: lstm_16x8_states(xs, seq.attrs, types, graph.types[seq.name]))
    else:
        ys = _guarded(k, node, lambda: lstm_states(xs, seq.attrs))
    return ys if seq is node else ys[::-1]


def run(graph: Graph, *args, feeds=None, params=None, check=False, stats: RunStats | None = None,
        keep=(), outputs=None, after=None):
    """Run ``graph`` on positional inputs (or a ``feeds`` dict). ``params`` overrides parameter or
    constant values by name. Returns the list of output arrays (``outputs`` names others to return).
    ``keep`` names extra values to return in a dict (second return value) when given. ``after(name,
    value)``, when given, replaces each node's result (e.g. rounds it as a target stores it)."""
    env = prepare_feeds(graph, args, feeds)
    tensors = graph.tensors()
    if params:
        for k, v in params.items():
            if k not in tensors:
                raise GraphError(f"graph {graph.name!r} has no parameter or constant {k!r}")
            v = np.asarray(v)
            if v.shape != graph.types[k].shape:
                raise GraphError(f"override of {k!r}: expected shape {graph.types[k].shape}, got {v.shape}")
            tensors[k] = v
    want = list(outputs if outputs is not None else graph.outputs)
    last = {}                                   # value -> index of the last node reading it
    for k, node in enumerate(graph.nodes):
        for i in node.inputs:
            last[i] = k
    for w in list(want) + list(keep):           # what is returned lives to the end
        last[w] = len(graph.nodes)
    for name in [n for n in env if n not in last]:     # inputs nothing reads are dropped at once
        del env[name]
    live = sum(v.nbytes for v in env.values())
    peak = live
    partner = _shared_runs(graph)
    stash = {}                                  # node -> value computed with its partner's run
    for k, node in enumerate(graph.nodes):
        xs = [env[i] if i in env else tensors[i] for i in node.inputs]
        if node.name in stash:
            y = stash.pop(node.name)
            live -= y.nbytes
        elif node.name in partner:
            y, other = _evaluate_pair(graph, k, node, partner[node.name], xs)
            stash[partner[node.name].name] = other
            live += other.nbytes
        else:
            y = _evaluate(graph, k, node, xs)
        y = np.asarray(y)
        t = graph.types[node.name]
        if y.shape != t.shape:
            raise GraphError(f"node {node.name!r} ({node.op}) produced shape {y.shape}, its type says {t}")
        if t.dtype != "bfloat16" and y.dtype != np_dtype(t.dtype):
            y = y.astype(np_dtype(t.dtype))
        if check and y.dtype.kind == "f" and not np.all(np.isfinite(y)):
            bad = "NaN" if np.isnan(y).any() else "Inf"
            srcs = ", ".join(f"{i} ({graph.types[i]})" for i in node.inputs)
            raise NumericsError(f"{bad} produced by node {k} {node.name!r} (op '{node.op}') from inputs {srcs}",
                                node=node.name, op=node.op)
        env[node.name] = y if after is None else after(node.name, y)
        live += y.nbytes
        peak = max(peak, live)
        for i in set(node.inputs) | {node.name}:
            if i in env and last.get(i, -1) <= k:
                live -= env.pop(i).nbytes
    if stats is not None:
        stats.peak_live_bytes = peak
        stats.nodes_run = len(graph.nodes)

    def get(n):
        if n in env:
            return env[n]
        if n in tensors:
            return tensors[n]
        raise GraphError(f"value {n!r} was not computed")
    result = [get(o) for o in want]
    if keep:
        return result, {k: get(k) for k in keep}
    return result


def run_updates(graph: Graph, *args, **kw):
    """Run and also return the new values of buffers updated in train mode: (outputs, {buffer: value})."""
    keep = list(graph.updates.values())
    if not keep:
        return run(graph, *args, **kw), {}
    outs, kept = run(graph, *args, keep=keep, **kw)
    return outs, {b: kept[v] for b, v in graph.updates.items()}


def initial_state(graph: Graph) -> dict:
    """The reset value of every state of a stateful graph (``graph.states``): {state: array}."""
    return {s: np.array(graph.consts[s]) for s in graph.states}


def run_stateful(graph: Graph, state: dict, *args, **kw):
    """One run of a stateful graph from ``state`` ({state constant: current value}; a missing entry
    starts at its reset value), writing the states the run leaves back into ``state``. Successive
    calls with the same dict carry the state as TFLite's variable tensors do; ``state.clear()``
    (or a fresh dict) resets it. Graphs without states run as ``run`` does."""
    if not graph.states:
        return run(graph, *args, **kw)
    params = dict(kw.pop("params", None) or {})
    params.update({s: state[s] for s in graph.states if s in state})
    keep = list(graph.states.values())
    outs, kept = run(graph, *args, params=params, keep=keep + list(kw.pop("keep", ())), **kw)
    for s, v in graph.states.items():
        state[s] = np.array(kept[v])
    return outs
