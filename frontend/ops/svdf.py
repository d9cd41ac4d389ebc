"""SVDF (TFLite's singular-value-decomposition filter), a stateful op, as two nodes.

TFLite's SVDF reads an input ``x`` [B, I], feature weights ``wf`` [F, I], time weights ``wt``
[F, M], a bias [F / rank] and an activation state [B, F * M] (a variable tensor that persists
between invocations). Each call shifts every filter's memory one step left, writes ``wf @ x`` into
the newest column, then sums ``state * wt`` over the memory, adds ``rank`` filters per unit and the
bias. Kiln splits it where the state is written:

- ``svdf_state(x, wf, state)`` -> the new state [B, F * M] (shift, then the new column);
- ``svdf(new_state, wt, bias; rank, activation)`` -> the output [B, F / rank].

The graph records ``graph.states[state] = new_state`` (docs/sequence_models.md, "Stateful graphs"): the state
is a constant holding the reset value (zeros; the zero point for int8 states, as TFLite Micro's
ResetVariableTensors) and every run starts from what the previous run left.

Integer SVDF (TFLite Micro ``EvalIntegerSvdfReference``, svdf_common.cc): int8 input, feature
weights and output, int16 (or, TFLite Micro only, int8) time weights and state, int32 bias. The new
column is ``MultiplyByQuantizedMultiplier(sum wf * (x - zx), s_x * s_wf / s_state)`` clamped to the
state type's range, plus the state zero point (stored with the state type's wrap-around, as TFLite
Micro does); the output is ``MultiplyByQuantizedMultiplier(bias + sum wt * (state - z_state),
s_state * s_wt / s_out) + z_out`` clamped to int8. The fused activation is not applied in integer
(neither TFLite nor TFLite Micro applies it: RELU lives in the output range).
"""
from __future__ import annotations

import numpy as np

from .. import fixedpoint as fp
from .. import functional as Fn
from ..errors import ShapeError
from ..registry import QUANTIZABLE, defrule, register
from ..registry import Attr as A
from ..types import TensorType
from . import tflite_util as tfl
from .int8util import per_tensor

STATE_DTYPES = ("int16", "int8")
_RANGE = {"int8": (-128, 127), "int16": (-32768, 32767)}


def _dims(x, wf, state, op):
    if len(x.shape) != 2 or len(wf.shape) != 2 or len(state.shape) != 2:
        raise ShapeError(f"{op}: input {x}, feature weights {wf} and state {state} must be 2-D "
                         f"([batch, input], [filters, input], [batch, filters * memory])")
    B, I = x.shape
    F = wf.shape[0]
    if wf.shape[1] != I:
        raise ShapeError(f"{op}: feature weights {wf} must have {I} columns (the input size of {x})")
    if state.shape[0] != B or F == 0 or state.shape[1] % F or state.shape[1] == 0:
        raise ShapeError(f"{op}: state {state} must be [{B}, {F} * memory] (batch, filters * memory size)")
    return B, I, F, state.shape[1] // F


def _infer_state(ts, a):
    x, wf, st = ts
    _dims(x, wf, st, "svdf_state")
    if x.quant is None and not x.is_float:
        raise ShapeError(f"svdf_state: input {x} must be float or quantised int8")
    return TensorType(st.shape, st.dtype, st.quant)


def _ref_state(xs, a):
    dt = np.float64 if xs[0].dtype == np.float64 else np.float32
    x, wf, st = (np.asarray(v, dt) for v in xs)
    B, _, F, M = _dims(x, wf, st, "svdf_state")
    s = st.reshape(B, F, M)
    new = np.concatenate([s[:, :, 1:], (x @ wf.T)[:, :, None]], axis=2)
    return new.reshape(B, F * M).astype(dt)


def _infer_out(ts, a):
    st, wt, b = ts
    if len(st.shape) != 2 or len(wt.shape) != 2 or len(b.shape) != 1:
        raise ShapeError(f"svdf: state {st}, time weights {wt} and bias {b} must be 2-D, 2-D and 1-D")
    F, M = wt.shape
    rank = a["rank"]
    if rank < 1 or F % rank:
        raise ShapeError(f"svdf: rank {rank} must be >= 1 and divide the {F} filters of {wt}")
    if st.shape[1] != F * M:
        raise ShapeError(f"svdf: state {st} must be [batch, {F} * {M}] for time weights {wt}")
    if b.shape[0] != F // rank:
        raise ShapeError(f"svdf: bias {b} must have {F // rank} elements (filters / rank)")
    dtype = "int8" if st.quant is not None else st.dtype
    return TensorType((st.shape[0], F // rank), dtype)


def _ref_out(xs, a):
    dt = np.float64 if xs[0].dtype == np.float64 else np.float32
    st, wt, b = (np.asarray(v, dt) for v in xs)
    F, M = wt.shape
    B = st.shape[0]
    scratch = np.sum(st.reshape(B, F, M) * wt[None], axis=2, dtype=dt)
    y = b[None] + np.sum(scratch.reshape(B, F // a["rank"], a["rank"]), axis=2, dtype=dt)
    if a["activation"] == "relu":
        y = np.maximum(y, dt(0))
    return y.astype(dt)


def _vjp_state(n, xs, y, gy):
    """new[b, f, :M-1] = state[b, f, 1:]; new[b, f, M-1] = (x @ wf.T)[b, f]."""
    x, wf, st = xs
    B, F, M = x.shape[0], wf.shape[0], st.shape[1] // wf.shape[0]
    g3 = Fn.reshape(gy, (B, F, M))
    gcol = Fn.reshape(Fn.slice(g3, [0, 0, M - 1], [B, F, M]), (B, F))
    dx = Fn.matmul(gcol, wf)
    dwf = Fn.matmul(Fn.transpose(gcol, (1, 0)), x)
    if M > 1:
        dst = Fn.pad(Fn.slice(g3, [0, 0, 0], [B, F, M - 1]), [(0, 0), (0, 0), (1, 0)])
    else:
        dst = g3 * 0.0
    return [dx, dwf, Fn.reshape(dst, (B, F * M))]


def _vjp_out(n, xs, y, gy):
    st, wt, b = xs
    F, M = wt.shape
    B, U = gy.shape
    rank = F // U
    gz = Fn.where(y > 0.0, gy, 0.0) if n.attrs["activation"] == "relu" else gy
    gsc = Fn.reshape(Fn.broadcast_to(Fn.reshape(gz, (B, U, 1)), (B, U, rank)), (B, F, 1))
    dst = Fn.reshape(gsc * Fn.reshape(wt, (1, F, M)), (B, F * M))
    dwt = Fn.sum(gsc * Fn.reshape(st, (B, F, M)), axis=0)
    return [dst, dwt, Fn.sum(gz, axis=0)]


register("svdf_state", attrs={}, infer=_infer_state, ref=_ref_state, vjp=_vjp_state, props={QUANTIZABLE}, arity=3,
         doc="SVDF's state update: shift each filter's memory left, newest column = feature weights @ x "
             "(TFLite SVDF, first half; the new state persists: graph.states)")
register("svdf", attrs={"rank": A("int", 1), "activation": A("str", "none", ("none", "relu"))},
         infer=_infer_out, ref=_ref_out, vjp=_vjp_out, props={QUANTIZABLE}, arity=3,
         doc="SVDF's output: time weights . state summed over memory, rank filters per unit, + bias "
             "(TFLite SVDF, second half)")


# ---- integer ------------------------------------------------------------------------------------
def state_params(in_types, op):
    """(scale, zero point, dtype) of the quantised state (input 2 of svdf_state, 0 of svdf)."""
    t = in_types[2] if op == "svdf_state" else in_types[0]
    if t.dtype not in STATE_DTYPES:
        raise ShapeError(f"{op}: the integer SVDF state must be int16 (or int8), got {t}")
    s, z = per_tensor(t, "state", op)
    return s, z, t.dtype


def svdf_state_params(in_types):
    """(multiplier, shift, input zero point, state zero point, state dtype) of svdf_state."""
    x, wf = in_types[0], in_types[1]
    if x.dtype != "int8" or wf.dtype != "int8":
        raise ShapeError(f"svdf_state: the integer SVDF takes int8 input and feature weights, got {x}, {wf}")
    s_x, z_x = per_tensor(x, "input", "svdf_state")
    s_w, _ = per_tensor(wf, "feature weights", "svdf_state")
    s_s, z_s, dt = state_params(in_types, "svdf_state")
    # TFLite and TFLite Micro compute the effective scale in float32, then widen it
    m, sh = fp.quantize_multiplier(float(np.float32(s_x) * np.float32(s_w) / np.float32(s_s)))
    return m, sh, z_x, z_s, dt


@defrule("svdf_state", "int8_ref")
def svdf_state_int8(xs, attrs, in_types, out_type):
    x, wf, st = xs
    B, _, F, M = _dims(in_types[0], in_types[1], in_types[2], "svdf_state")
    m, sh, z_x, z_s, dt = svdf_state_params(in_types)
    acc = fp.wrap_int32((x.astype(np.int64) - z_x) @ wf.astype(np.int64).T)
    lo, hi = _RANGE[dt]
    col = np.clip(fp.multiply_by_quantized_multiplier(acc, m, sh), lo, hi) + z_s
    col = col.astype(np.int64).astype(dt)        # TFLite Micro stores zp + value with the type's wrap-around
    s = st.reshape(B, F, M)
    return np.concatenate([s[:, :, 1:], col[:, :, None]], axis=2).reshape(B, F * M).astype(dt)


def svdf_out_params(in_types, out_type):
    """(multiplier, shift, state zero point, output zero point) of svdf."""
    wt = in_types[1]
    s_s, z_s, dt = state_params(in_types, "svdf")
    if wt.dtype != dt:
        raise ShapeError(f"svdf: time weights {wt} must have the state's type {dt}")
    if out_type.dtype != "int8":
        raise ShapeError(f"svdf: the integer SVDF's output is int8, got {out_type}")
    s_w, _ = per_tensor(wt, "time weights", "svdf")
    s_o, z_o = per_tensor(out_type, "output", "svdf")
    m, sh = fp.quantize_multiplier(float(np.float32(s_s) * np.float32(s_w) / np.float32(s_o)))
    return m, sh, z_s, z_o


@defrule("svdf", "int8_ref")
def svdf_int8(xs, attrs, in_types, out_type):
    st, wt, b = xs
    m, sh, z_s, z_o = svdf_out_params(in_types, out_type)
    F, M = wt.shape
    B = st.shape[0]
    s = st.reshape(B, F, M).astype(np.int64) - z_s
    scratch = fp.wrap_int32(np.sum(s * wt.astype(np.int64)[None], axis=2))
    acc = fp.wrap_int32(b.astype(np.int64)[None] + np.sum(scratch.reshape(B, F // attrs["rank"], attrs["rank"]), axis=2))
    y = fp.multiply_by_quantized_multiplier(acc, m, sh) + z_o
    return np.clip(y, -128, 127).astype(np.int8)


# ---- TE (float) ---------------------------------------------------------------------------------
@defrule("svdf_state", "te")
def _svdf_state_te(T, xs, a, out):
    x, wf, st = xs
    I = int(x.shape[1])
    F = int(wf.shape[0])
    M = int(st.shape[1]) // F
    r = T.te.reduce_axis((0, I), "r")
    col = T.te.compute((int(x.shape[0]), F), lambda b, f: T.te.sum(x[b, r] * wf[f, r], axis=r), name="svdf_col")
    return T.te.compute(out.shape, lambda b, j: T.tirx.Select(
        j % M == M - 1, col[b, j // M], st[b, T.tirx.min(j + 1, F * M - 1)]), name="svdf_state")


@defrule("svdf", "te")
def _svdf_te(T, xs, a, out):
    st, wt, bias = xs
    F, M = (int(s) for s in wt.shape)
    rank = a["rank"]
    m = T.te.reduce_axis((0, M), "m")
    sc = T.te.compute((int(st.shape[0]), F), lambda b, f: T.te.sum(st[b, f * M + m] * wt[f, m], axis=m),
                      name="svdf_scratch")
    r = T.te.reduce_axis((0, rank), "r")
    acc = T.te.compute(out.shape, lambda b, u: T.te.sum(sc[b, u * rank + r], axis=r), name="svdf_sum")
    if a["activation"] == "relu":
        return T.te.compute(out.shape, lambda b, u: T.tirx.max(acc[b, u] + bias[u], T.c(0.0, "float32")), name="svdf")
    return T.te.compute(out.shape, lambda b, u: acc[b, u] + bias[u], name="svdf")


def _macs_state(ts, out, a):
    return int(np.prod(ts[0].shape)) * int(ts[1].shape[0])


def _macs_out(ts, out, a):
    return int(np.prod(ts[0].shape))


defrule("svdf_state", "macs")(_macs_state)
defrule("svdf", "macs")(_macs_out)



# ---- TFLite -------------------------------------------------------------------------------------
NAME = "SVDF"
_ACTS = {0: "none", 1: "relu"}


def _svdf_options(imp, k, op):
    o = tfl.options(imp, k, op, NAME, "SVDFOptions")
    w = tfl.where(k, NAME)
    if o is None:
        raise imp.err(f"{w}: SVDFOptions are missing; SVDF needs its rank")
    act = int(o.FusedActivationFunction())
    if act not in _ACTS:
        raise imp.err(f"{w}: fused_activation_function = {tfl.ACT_NAMES.get(act, act)} is not supported "
                      f"(Kiln imports SVDF with NONE or RELU)")
    if o.AsymmetricQuantizeInputs():
        raise imp.err(f"{w}: asymmetric_quantize_inputs is set (a hybrid SVDF); Kiln imports float and int8 SVDF")
    if o.Rank() < 1:
        raise imp.err(f"{w}: rank = {o.Rank()} is out of range: allowed >= 1")
    return {"rank": int(o.Rank()), "activation": _ACTS[act]}


def _state(imp, k, i):
    """The variable state tensor as a constant holding its reset value (zeros; the zero point for
    an int8 state, as TFLite Micro's ResetVariableTensors)."""
    t = imp.tensors[i]
    w = tfl.where(k, NAME)
    if not t["variable"]:
        raise imp.err(f"{w}: the state {imp.label(i)} is not a variable tensor (is_variable); TFLite keeps "
                      f"SVDF's state in one")
    if i in imp.values:
        raise imp.err(f"{w}: the state {imp.label(i)} is shared with another operator; each SVDF needs its own")
    fill = t["quant"].zero_point[0] if t["quant"] is not None and t["dtype"] == "int8" else 0
    if t["data"] is not None and np.any(np.asarray(t["data"]) != fill):
        raise imp.err(f"{w}: the state {imp.label(i)} holds nonzero initial data; TFLite resets variable "
                      f"tensors to zero, so Kiln imports SVDF states that start there")
    name = imp._vname(t["name"])
    imp.g.add_const(name, np.full(tuple(t["shape"]), fill, t["dtype"]), t["quant"])
    imp.values[i] = name
    return name


def _bias(imp, k, ins, x_dtype, units):
    if len(ins) > 3 and ins[3] >= 0:
        return imp.value(ins[3], k, NAME)
    dt = "int32" if x_dtype == "int8" else "float32"
    name = imp._vname(f"svdf_{k}_zero_bias")
    return imp.g.add_const(name, np.zeros(units, dt))


@tfl.importer(NAME)
def _tfl_svdf(imp, k, op, ins, out):
    w = tfl.where(k, NAME)
    tfl.need(imp, k, NAME, ins, 5, 5, optional=(3,))
    attrs = _svdf_options(imp, k, op)
    x = imp.operand(ins[0], k, NAME)
    xt = imp.g.types[x]
    wf, wt = imp.value(ins[1], k, NAME), imp.value(ins[2], k, NAME)
    want = ("float32",) * 2 if xt.dtype == "float32" else ("int8", STATE_DTYPES)
    for j, v, d in ((1, wf, want[0]), (2, wt, want[1])):
        if imp.g.types[v].dtype not in (d if isinstance(d, tuple) else (d,)):
            raise imp.err(f"{w}: input {j} {imp.label(ins[j])} is {imp.g.types[v].dtype}; expected {d} (a hybrid "
                          f"SVDF, float input with int8 weights, is not supported)")
    F = imp.g.types[wf].shape[0] if len(imp.g.types[wf].shape) == 2 else 0
    st = _state(imp, k, ins[4])
    b = _bias(imp, k, ins, xt.dtype, F // attrs["rank"] if attrs["rank"] and F % attrs["rank"] == 0 else 0)
    new = imp._vname(imp.tensors[ins[4]]["name"] + "_next")
    try:
        imp.g.add_node("svdf_state", [x, wf, st], {}, name=new)
        imp.g.states[st] = new
        imp.values[out] = imp.emit(k, NAME, "svdf", [new, wt, b], attrs, out)
    except ShapeError as e:
        raise imp.err(f"{w}: {e}") from None


@tfl.exporter("svdf_state")
def _tfl_export_svdf_state(e, n, act, out, int8):
    """Written with its svdf node (one SVDF operator): nothing of its own."""
    g = e.g
    users = [m for m in g.nodes if n.name in m.inputs]
    if n.inputs[2] not in g.states or g.states[n.inputs[2]] != n.name or len(users) != 1 or users[0].op != "svdf" \
            or users[0].inputs[0] != n.name or n.name in g.outputs:
        raise tfl.ExportError(f"node {n.name!r}: an svdf_state node exports only as part of one SVDF operator: its "
                              f"state must be a graph state updated by it, read by exactly one svdf node")


@tfl.exporter("svdf", versions={NAME: 3})
def _tfl_export_svdf(e, n, act, out, int8):
    g = e.g
    src = g.producer(n.inputs[0])
    if src is None or src.op != "svdf_state":
        raise tfl.ExportError(f"node {n.name!r}: an svdf node exports with the svdf_state node that feeds it")
    x, wf, st = src.inputs
    si = e.tensor(e._fresh(st), g.types[st])
    e.tensors[si]["variable"] = True
    ins = [e.value(x), e.value(wf), e.value(n.inputs[1]), e.value(n.inputs[2]), si]
    e.op(NAME, ins, [e.tensor(out, g.types[out])], "SVDFOptions", int8, Rank=int(n.attrs["rank"]),
         FusedActivationFunction=tfl.ACT_CODES[n.attrs["activation"]], AsymmetricQuantizeInputs=False)
