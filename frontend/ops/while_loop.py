"""TFLite's WHILE, imported by static unrolling.

Kiln compiles a static plan (a fixed schedule and arena), so a loop must have a trip count known
when the model is imported. That is the WHILE converters write for an RNN over a fixed sequence
length (Keras ``RNN``/``LSTM``/``GRU`` with ``unroll=False``, ``tf.while_loop`` over a fixed
range): the loop-carried counters start from constants and are compared with constants. At import
the loop variables are either *static* (arrays known at import: the counters, and weights passed
through the loop) or *run-time* values (Kiln values). Each iteration inlines the cond subgraph
(its result must fold to a constant bool, else the trip count is data-dependent and the WHILE is
refused), then the body subgraph with static variables bound as constants; every node of the
inlined body whose inputs are all constants is evaluated at import (the counter chain, a time
step's GATHER index), so the unrolled graph holds only the run-time work, one copy of the body per
iteration, and each weight once. A loop running more than :data:`MAX_ITERATIONS` iterations is
refused. LiteRT runs the loop; Kiln's unrolled graph computes the same values (bit-exact in int8).
"""
from __future__ import annotations

import math

import numpy as np

from .. import tflite_checks as chk
from ..executor import run
from ..graph import Graph
from ..types import TensorType
from . import tflite_util as tfl
from .while_tidy import collapse_lists

chk.VERSIONS.update({"WHILE": 1})
NAME = "WHILE"
MAX_ITERATIONS = 4096           # iterations one WHILE may unroll into (each copies the body)
MAX_TOTAL_ITERATIONS = 65536    # iterations all the WHILEs of one model may unroll (nested loops multiply)
_ADVICE = ("Kiln unrolls a WHILE whose trip count is fixed at conversion (counters that start from constants "
           "and are compared with constants); convert the model with a fixed sequence length, or with "
           "unroll=True (Keras RNN layers), so the loop is unrolled by the converter")


@tfl.importer(NAME)
def _tfl_while(imp, k, op, ins, outs):
    w = tfl.where(k, NAME)
    o = tfl.options(imp, k, op, NAME, "WhileOptions")
    if o is None:
        raise imp.err(f"{w}: WhileOptions are missing (the cond and body subgraph indices)")
    if len(ins) != len(outs) or -1 in ins:
        raise imp.err(f"{w} has {len(ins)} inputs and {len(outs)} outputs; TFLite's WHILE carries each input "
                      f"(none absent) to the output of the same index")
    cond_i, body_i = int(o.CondSubgraphIndex()), int(o.BodySubgraphIndex())
    vals = [_initial(imp, i, k) for i in ins]
    trips = _trip_count(imp, cond_i, body_i, vals)
    if trips is not None and trips > MAX_ITERATIONS:
        raise imp.err(f"{w}: the loop runs more than {MAX_ITERATIONS} iterations (Kiln unrolls WHILE loops, "
                      f"one copy of the body per iteration); {_ADVICE}")
    total = imp.shared.setdefault("while_iterations", [0])        # across the model's WHILEs, nested ones too
    if trips is not None and total[0] + trips > MAX_TOTAL_ITERATIONS:
        raise _too_many(imp, w)
    before, pool, first = set(imp.g.consts), {}, len(imp.g.nodes)
    n = 0
    while _cond(imp, cond_i, vals, ins, w, n):
        if n == MAX_ITERATIONS:
            raise imp.err(f"{w}: the loop runs more than {MAX_ITERATIONS} iterations (Kiln unrolls WHILE loops, "
                          f"one copy of the body per iteration); {_ADVICE}")
        total[0] += 1
        if total[0] > MAX_TOTAL_ITERATIONS:
            raise _too_many(imp, w)
        vals = _body(imp, body_i, vals, ins, w, n, pool)
        n += 1
    for j, (out, v) in enumerate(zip(outs, vals)):
        _check_var(imp, w, j, v, imp._ttype(out), f"output {imp.label(out)}")
        if isinstance(v, np.ndarray):
            imp.tensors[out]["data"] = v            # a static variable (a counter) stays a constant
        else:
            imp.values[out] = v
    _prune(imp, first, [v for v in vals if isinstance(v, str)])
    _drop_unused_consts(imp, before)
    imp.g.meta.setdefault("while_trip_counts", []).append(n)


_tfl_while.multi_output = True


# integer/bool TFLite ops a counter chain uses, evaluated at import when every input is a constant
# (Kiln's op importers take float and quantised operands; these int32 values never reach run time)
_INT_OPS = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "MINIMUM": np.minimum, "MAXIMUM": np.maximum,
    "FLOOR_DIV": np.floor_divide, "FLOOR_MOD": np.mod, "LESS": np.less, "LESS_EQUAL": np.less_equal,
    "GREATER": np.greater, "GREATER_EQUAL": np.greater_equal, "EQUAL": np.equal, "NOT_EQUAL": np.not_equal,
    "LOGICAL_AND": np.logical_and, "LOGICAL_OR": np.logical_or, "LOGICAL_NOT": np.logical_not,
}
_FUSED = {"ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions"}
# index arithmetic of a lowered tensor list (TensorListSetItem: SLICE bounds built from the counter)
_SHAPE_OPS = {"RESHAPE": None, "EXPAND_DIMS": None, "CONCATENATION": "ConcatenationOptions", "PACK": "PackOptions"}


def _shape_op(sub, k, opname, op, xs, out):
    if opname in ("RESHAPE", "EXPAND_DIMS"):
        return xs[0].reshape(out["shape"]) if xs[0].size == math.prod(out["shape"]) else None
    o = tfl.options(sub, k, op, opname, _SHAPE_OPS[opname])
    axis = int(o.Axis()) if o is not None else 0
    if opname == "PACK":
        return np.stack(xs, axis) if -xs[0].ndim - 1 <= axis <= xs[0].ndim else None
    if (o is not None and int(o.FusedActivationFunction()) != 0) or not -xs[0].ndim <= axis < xs[0].ndim:
        return None
    return np.concatenate(xs, axis) if all(x.ndim == xs[0].ndim for x in xs) else None


# more ops of a counter chain: CAST (int/bool -> int, bool or float32: a step's index as a float),
# an int32 table GATHERed with the counter, SQUEEZE
_CHAIN_OPS = {"CAST", "GATHER", "SQUEEZE"}
_INTS = ("int32", "int64", "bool")


def _gather(sub, k, op, xs):
    """TFLite's GATHER of an integer table (batch_dims 0); indices out of range are refused, as
    TFLite's kernel refuses them when it runs."""
    o = tfl.options(sub, k, op, "GATHER", "GatherOptions")
    axis, batch = (int(o.Axis()), int(o.BatchDims())) if o is not None else (0, 0)
    params, idx = xs
    if batch != 0 or not -params.ndim <= axis < params.ndim:
        return None
    n = params.shape[axis]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise sub.err(f"{tfl.where(k, 'GATHER')}: a loop counter's index {idx.tolist()} is out of range 0..{n - 1} "
                      f"(TFLite refuses it when the loop runs)")
    return np.take(params, idx.astype(np.int64), axis=axis)


def _chain_op(sub, k, opname, op, xs, out):
    if opname == "GATHER":
        return _gather(sub, k, op, xs)
    if opname == "SQUEEZE":
        return xs[0].reshape(out["shape"]) if xs[0].size == math.prod(out["shape"]) else None
    return xs[0]            # CAST: the conversion below (C's static_cast: int64 -> int32 wraps, bool is x != 0)


def _foldable(sub, opname, ins, outs):
    """The constant inputs of a foldable integer op (None: not one)."""
    if (opname not in _INT_OPS and opname not in _SHAPE_OPS and opname not in _CHAIN_OPS) or len(outs) != 1 \
            or not ins or -1 in ins:
        return None
    ts = [sub.tensors[i] for i in (ins[:1] if opname in ("RESHAPE", "EXPAND_DIMS", "SQUEEZE") else ins)]
    if any(t["data"] is None or t["dtype"] not in _INTS or t["quant"] is not None for t in ts):
        return None
    out = sub.tensors[outs[0]]
    outs_ok = _INTS + ("float32",) if opname == "CAST" else _INTS
    if outs[0] in sub.values or out["data"] is not None or out["dtype"] not in outs_ok or out["quant"] is not None:
        return None
    return [np.asarray(t["data"]) for t in ts]


def fold_int_op(sub, k, opname, op, ins, outs):
    """Compute an integer/bool op of constants (a loop counter's ``i + 1``, ``i < n``, a lowered
    tensor list's slice bounds, a CAST or int32 GATHER of the counter) at import; True when it set
    the output's data."""
    xs = _foldable(sub, opname, ins, outs)
    if xs is None:
        return False
    out = sub.tensors[outs[0]]
    if opname in _SHAPE_OPS:
        y = _shape_op(sub, k, opname, op, xs, out)
    elif opname in _CHAIN_OPS:
        y = _chain_op(sub, k, opname, op, xs, out)
    else:
        o = tfl.options(sub, k, op, opname, _FUSED[opname]) if opname in _FUSED else None
        if o is not None and int(o.FusedActivationFunction()) != 0:
            return False
        if opname in ("FLOOR_DIV", "FLOOR_MOD") and not np.all(xs[1]):
            raise sub.err(f"{tfl.where(k, opname)}: division by zero in a loop counter")
        with np.errstate(over="ignore"):
            y = _INT_OPS[opname](*xs)
    if y is None or np.shape(y) != tuple(out["shape"]):
        return False
    out["data"] = np.asarray(y).astype(out["dtype"])
    return True


def _too_many(imp, w):
    return imp.err(f"{w}: the model's WHILE loops (nested ones multiply) unroll into more than "
                   f"{MAX_TOTAL_ITERATIONS} iterations in all; {_ADVICE}")


def _trip_count(imp, cond_i, body_i, vals):
    """The trip count from the integer counter chain alone (cheap: nothing is inlined), or None
    when that chain does not decide it (the unrolling then evaluates the cond itself)."""
    nsub = imp.model.SubgraphsLength()
    if not (0 < cond_i < nsub and 0 < body_i < nsub):
        return None
    cond, body = (_parsed(imp, i) for i in (cond_i, body_i))
    static = [v if isinstance(v, np.ndarray) else None for v in vals]
    for n in range(MAX_ITERATIONS + 2):
        c = _static_outputs(cond, static)
        if not c or c[0] is None or c[0].dtype != np.bool_ or c[0].size != 1:
            return None
        if not c[0].reshape(-1)[0]:
            return n
        static = _static_outputs(body, static)
        if static is None:
            return None
    return MAX_ITERATIONS + 1


def _parsed(imp, index):
    sub = type(imp)(imp.buf, f"{imp.where} (subgraph {index})", imp.name)
    sub.model, sub.opcodes, sub.sg = imp.model, imp.opcodes, imp.model.Subgraphs(index)
    sub._read_tensors()
    sub._read_ops()
    sub.io = [sub._io_list(what, getattr(sub.sg, f"{what.title()}Length"), getattr(sub.sg, f"{what.title()}AsNumpy"))
              for what in ("inputs", "outputs")]
    return sub


def _static_outputs(sub, static):
    """Outputs of a parsed subgraph computable by :func:`fold_int_op` from the static inputs (None:
    a run-time value); None when the inputs do not fit."""
    ins, outs = sub.io
    if len(ins) != len(static):
        return None
    saved = [t["data"] for t in sub.tensors]
    try:
        for i, v in zip(ins, static):
            sub.tensors[i]["data"] = v
        for k, (opname, op, oins, oouts) in enumerate(sub.ops):
            fold_int_op(sub, k, opname, op, oins, oouts)
        return [sub.tensors[o]["data"] for o in outs]
    finally:
        for t, d in zip(sub.tensors, saved):
            t["data"] = d


def _initial(imp, i, k):
    t = imp.tensors[i]
    if i in imp.folded or t["data"] is not None:
        return np.asarray(imp.folded.get(i, t["data"]))
    return imp.value(i, k, NAME)


def _check_var(imp, w, j, v, want, what):
    got = TensorType(v.shape, str(v.dtype), want.quant) if isinstance(v, np.ndarray) else imp.g.types[v]
    if (tuple(got.shape), got.dtype, got.quant) != (tuple(want.shape), want.dtype, want.quant):
        raise imp.err(f"{w}: loop variable {j} is {got} but {what} is {want}; TFLite's WHILE keeps each loop "
                      f"variable's shape, type and quantisation")


def _cond(imp, index, vals, ins, w, n):
    """Evaluate the cond subgraph on the loop variables; it must fold to a constant bool."""
    g, start = imp.g, len(imp.g.nodes)
    res = imp.inline_subgraph(index, vals, f"{w} cond", consts=True, fold=fold_int_op)
    if len(res) != 1:
        raise imp.err(f"{w}: the cond subgraph {index} has {len(res)} outputs; it must have one bool")
    _fold(imp, start, {})
    r = res[0]
    if isinstance(r, str) and r in g.consts:
        r = g.consts[r]
    for node in g.nodes[start:]:                   # the cond's nodes served only to find the trip count
        del g.types[node.name]
    g.nodes, g._producer = g.nodes[:start], {}
    if not isinstance(r, np.ndarray):
        live = [f"{j} ({imp.label(i)})" for j, (i, v) in enumerate(zip(ins, vals)) if isinstance(v, str)]
        raise imp.err(f"{w}: the loop condition (subgraph {index}) depends on values computed at run time "
                      f"(loop variables {', '.join(live) or 'none'} are run-time values at iteration {n}): the "
                      f"trip count is data-dependent and Kiln compiles a static plan. {_ADVICE}")
    if r.dtype != np.bool_ or r.size != 1:
        raise imp.err(f"{w}: the cond subgraph {index} returns {r.dtype}{list(r.shape)}; it must return one bool")
    return bool(r.reshape(-1)[0])


def _body(imp, index, vals, ins, w, n, pool):
    start = len(imp.g.nodes)
    res = imp.inline_subgraph(index, vals, f"{w} body (iteration {n})", consts=True,
                               fold=fold_int_op)
    if len(res) != len(vals):
        raise imp.err(f"{w}: the body subgraph {index} has {len(res)} outputs for {len(vals)} loop variables")
    _fold(imp, start, pool)
    new = []
    for j, r in enumerate(res):
        if r is None:
            raise imp.err(f"{w}: output {j} of the body subgraph {index} is never computed")
        if isinstance(r, str) and r in imp.g.consts and r not in _states(imp):
            r = imp.g.consts[r]
        _check_var(imp, w, j, r, imp._ttype(ins[j]), f"WHILE's input {imp.label(ins[j])}")
        new.append(r)
    return new


def _states(imp):
    """Constants that hold a resource variable's state (they change between runs: never folded)."""
    return {v.get("state") for v in imp.shared.get("variables", {}).values()} - {None}


def _fold(imp, start, pool):
    """Evaluate the nodes from ``start`` on whose inputs are all constants into constants; equal
    constants (a weight each iteration re-reads) become one (``pool``: content -> name)."""
    g, states = imp.g, _states(imp)
    keep = g.nodes[:start]
    for node in g.nodes[start:]:
        node.inputs = [_canonical(g, i, pool, states) for i in node.inputs]
        if node.inputs and node.op != "dropout" and all(i in g.consts and i not in states for i in node.inputs):
            g.consts[node.name] = _evaluate(g, node)
        else:
            keep.append(node)
    g.nodes, g._producer = keep, {}


def _canonical(g, name, pool, states):
    if name not in g.consts or name in states:
        return name
    a, t = g.consts[name], g.types[name]
    return pool.setdefault((a.dtype.str, a.shape, repr(t.quant), a.tobytes()), name)


def _evaluate(g, node):
    t = Graph("fold")
    for i in dict.fromkeys(node.inputs):
        t.add_const(i, g.consts[i], g.types[i].quant)
    t.add_node(node.op, node.inputs, node.attrs, name=node.name, out_type=g.types[node.name])
    t.outputs = [node.name]
    return np.asarray(run(t)[0])


def _prune(imp, first, roots):
    """Tidy the unrolled nodes (from ``first`` on): concat inputs with no elements (a lowered tensor
    list's empty head or tail slice at the first and last step) are dropped, the list's concat
    chain collapsed, then every node the loop's results do not need is removed."""
    g = imp.g
    for node in g.nodes[first:]:
        if node.op == "concat" and len(node.inputs) > 1:
            full = [i for i in node.inputs if g.types[i].size > 0]
            node.inputs = full or node.inputs[:1]
    collapse_lists(g, first)                  # a lowered tensor list's concat chain (while_tidy.py)
    _fold(imp, first, {})
    live = set(roots) | set(g.outputs) | set(imp.values.values()) | _states(imp)
    for v in imp.shared.get("variables", {}).values():
        live.update(x for x in v.values() if isinstance(x, str))
    keep = []
    for node in reversed(g.nodes[first:]):
        if node.name in live:
            keep.append(node)
            live.update(node.inputs)
        else:
            del g.types[node.name]
    g.nodes, g._producer = g.nodes[:first] + keep[::-1], {}


def _drop_unused_consts(imp, before):
    """Constants the unrolling made (counter values, cond results) that no node reads."""
    g = imp.g
    used = {i for node in g.nodes for i in node.inputs} | set(g.outputs) | set(imp.values.values()) | _states(imp)
    for name in [c for c in g.consts if c not in before and c not in used]:
        del g.consts[name]
        del g.types[name]
