"""TFLite import and export of the recurrent ops (frontend/ops/recurrent.py).

UNIDIRECTIONAL_SEQUENCE_LSTM has 24 inputs (20 in old files): 0 input, 1-4 input-to-gate weights
(input, forget, cell, output), 5-8 recurrent weights, 9-11 peephole weights, 12-15 gate biases,
16-17 projection weights and bias, 18 the output state and 19 the cell state (variable tensors:
a fresh interpreter starts them at zero), 20-23 layer-norm coefficients. Kiln imports the LSTM
TensorFlow's converter writes for a Keras ``LSTM`` layer (no peephole, projection, layer norm or
CIFG). The state tensors become constants holding their reset value (zero; an int8 output
state's zero point). Variable state tensors (what converters write) persist between invocations
in LiteRT and TFLite Micro, so they become graph states updated with the last step's hidden and
cell state (``recurrent.carry_state``); export writes such an LSTM back as one operator with its
variable tensors. int8 models (int8 activations, int16 cell state) carry five intermediates; the
fifth holds the hidden state's quantisation, which must be the output's.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..lstm_state import carry_state, state_nodes
from ..types import QParams, TensorType
from . import tflite_util as tfl
from .int16util import symmetric16

NAME = "UNIDIRECTIONAL_SEQUENCE_LSTM"
# TFLite input position of each Kiln lstm input (after x): weights, recurrent weights, biases, states
_POS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 14, 15, 18, 19]
_UNSUPPORTED = {9: "peephole", 10: "peephole", 11: "peephole", 16: "projection", 17: "projection",
                20: "layer-norm", 21: "layer-norm", 22: "layer-norm", 23: "layer-norm"}
_ACT_TANH = 4


def _lstm_options(imp, k, op):
    o = tfl.options(imp, k, op, NAME, "UnidirectionalSequenceLSTMOptions")
    w = tfl.where(k, NAME)
    if o is None:
        return {"time_major": False, "cell_clip": 0.0}
    act = int(o.FusedActivationFunction())
    if act != _ACT_TANH:
        raise imp.err(f"{w}: fused_activation_function = {tfl.ACT_NAMES.get(act, act)} is not supported "
                      f"(Kiln imports TANH, what Keras LSTMs use)")
    if o.CellClip() < 0 or o.ProjClip() < 0:
        raise imp.err(f"{w}: cell_clip = {o.CellClip()} / proj_clip = {o.ProjClip()} is out of range: allowed >= 0")
    if o.AsymmetricQuantizeInputs():
        raise imp.err(f"{w}: asymmetric_quantize_inputs is set (a hybrid LSTM); Kiln imports float and int8 LSTMs")
    return {"time_major": bool(o.TimeMajor()), "cell_clip": float(o.CellClip())}


def _check_inputs(imp, k, ins):
    w = tfl.where(k, NAME)
    if len(ins) not in (20, 24):
        raise imp.err(f"{w} has {len(ins)} inputs; TFLite's LSTM takes 24 (or 20 in old files)")
    for j, what in _UNSUPPORTED.items():
        if j < len(ins) and ins[j] >= 0:
            raise imp.err(f"{w}: input {j} is present: {what} LSTMs are not supported (Kiln imports LSTMs without "
                          f"peephole, projection or layer norm, as Keras' LSTM converts)")
    if ins[1] < 0 or ins[5] < 0 or ins[12] < 0:
        raise imp.err(f"{w}: the input gate is absent (a CIFG LSTM); Kiln imports LSTMs with all four gates")
    missing = [j for j in [0] + _POS if ins[j] < 0]
    if missing:
        raise imp.err(f"{w}: required input {missing[0]} is -1 (absent)")


def _state(imp, k, i, n_elems, shape):
    """A state tensor as a constant holding its reset value (zeros; the zero point of an int8
    state, as TFLite Micro's ResetVariableTensors); (name, is it a variable tensor)."""
    t = imp.tensors[i]
    w = tfl.where(k, NAME)
    if int(np.prod(t["shape"])) != n_elems:
        raise imp.err(f"{w}: state {imp.label(i)} has shape {list(t['shape'])}; expected {n_elems} elements")
    zp = t["quant"].zero_point[0] if t["quant"] is not None else 0
    if t["data"] is not None and np.any(np.asarray(t["data"]) != zp):
        raise imp.err(f"{w}: state {imp.label(i)} holds nonzero initial data; TFLite resets variable tensors to "
                      f"zero, so Kiln imports LSTM states that start there")
    if t.get("variable") and i in imp.values:
        raise imp.err(f"{w}: the state {imp.label(i)} is shared with another operator; each LSTM needs its own")
    name = imp._vname(t["name"])
    imp.g.add_const(name, np.full(shape, zp, t["dtype"]), t["quant"])
    if t.get("variable"):
        imp.values[i] = name
    return name, bool(t.get("variable"))


def _dtypes(imp, k, ins, x_dtype):
    w = tfl.where(k, NAME)
    want = {"float32": ["float32"] * 14, "int8": ["int8"] * 8 + ["int32"] * 4 + ["int8", "int16"],
            "int16": ["int8"] * 8 + ["int64"] * 4 + ["int16", "int16"]}.get(x_dtype)
    if want is None:
        raise imp.err(f"{w}: input {imp.label(ins[0])} is {x_dtype}; Kiln imports float32, int8 and int16 (16x8) LSTMs")
    kinds = {"float32": "a hybrid (float input, int8 weights) LSTM is not supported",
             "int8": "TFLite's integer LSTM takes int8 weights, int32 biases, an int8 output state and an int16 cell "
                     "state",
             "int16": "TFLite Micro's 16x8 LSTM takes int8 weights, int64 biases, int16 output and cell states"}
    for j, d in zip(_POS, want):
        t = imp.tensors[ins[j]]
        if t["dtype"] != d:
            raise imp.err(f"{w}: input {j} {imp.label(ins[j])} is {t['dtype']}, expected {d} ({kinds[x_dtype]})")
    if x_dtype == "int16":
        symmetric16(imp.err, w, [(f"input {j} {imp.label(ins[j])}", imp.tensors[ins[j]]["quant"]) for j in (0, 18, 19)])


def _hidden_quant(imp, k, op, out):
    w = tfl.where(k, NAME)
    n = op.IntermediatesLength()
    if n != 5:
        raise imp.err(f"{w}: an int8 LSTM needs 5 intermediates (the converter's gate and hidden scales), got {n}")
    hq = imp.tensors[int(op.IntermediatesAsNumpy()[4])]["quant"]
    oq = imp.tensors[out]["quant"]
    if hq is None or oq is None or (hq.scale[0], hq.zero_point[0]) != (oq.scale[0], oq.zero_point[0]):
        raise imp.err(f"{w}: the hidden-state intermediate's quantisation {hq} differs from the output's {oq}; "
                      f"without projection TFLite copies the hidden state to the output, so Kiln needs them equal")


@tfl.importer(NAME)
def _tfl_lstm(imp, k, op, ins, out):
    w = tfl.where(k, NAME)
    _check_inputs(imp, k, ins)
    attrs = _lstm_options(imp, k, op)
    xt = imp.activation_type(ins[0], w)
    if len(xt["shape"]) != 3:
        raise imp.err(f"{w}: input {imp.label(ins[0])} has shape {list(xt['shape'])}; an LSTM input is 3-D")
    _dtypes(imp, k, ins, xt["dtype"])
    x = imp.operand(ins[0], k, NAME)
    n = xt["shape"][1] if attrs["time_major"] else xt["shape"][0]
    H = imp.tensors[ins[2]]["shape"][0] if len(imp.tensors[ins[2]]["shape"]) == 2 else 0
    inputs = [x] + [imp.value(ins[j], k, NAME) for j in _POS[:12]]
    (h0, hv), (c0, cv) = _state(imp, k, ins[18], n * H, (n, H)), _state(imp, k, ins[19], n * H, (n, H))
    inputs += [h0, c0]
    if xt["dtype"] == "int8":
        _hidden_quant(imp, k, op, out)
    try:
        imp.values[out] = y = imp.emit(k, NAME, "lstm", inputs, attrs, out)
        if hv and cv:           # variable tensors: TFLite carries them from one invocation to the next
            carry_state(imp.g, y, imp._vname(f"{h0}_next"), imp._vname(f"{c0}_next"))
    except ShapeError as e:
        raise imp.err(f"{w}: {e}") from None


# ---- export -------------------------------------------------------------------------------------
def _zero_state(e, n, v, state):
    """The variable state tensor for Kiln input v (a zero constant, or a graph state whose reset
    value is zero): no buffer, is_variable set."""
    g = e.g
    data = g.consts.get(v, g.params.get(v))
    t = g.types[v]
    zp = t.quant.zero_point[0] if t.quant is not None else 0
    if data is None or np.any(np.asarray(data) != zp):
        raise tfl.ExportError(f"node {n.name!r}: LSTM state {v!r} must be a zero constant (its zero point when "
                              f"quantised): TFLite keeps the state in a variable tensor that starts at zero")
    idx = e.tensor(e._fresh(v if state else f"{n.name}/{v}_state"), t)
    e.tensors[idx]["variable"] = True
    return idx


def _state_export(e, n):
    """True when the lstm node carries its state (graph.states, ``carry_state``): the nodes that
    compute the next state are the variable tensors' update, written by no operator of their own."""
    g = e.g
    if n.inputs[13] not in g.states and n.inputs[14] not in g.states:
        return False
    found = state_nodes(g, n)
    cons = g.consumers()
    if found is None or any(cons[v] for v in (found[0][1], found[1].name)) or \
            [m.name for m in cons[found[0][0]]] != [found[0][1]] or \
            {found[0][1], found[1].name, found[0][0]} & set(g.outputs):
        raise tfl.ExportError(f"node {n.name!r}: a stateful LSTM exports as one operator whose variable tensors "
                              f"carry the state: the next h0 must be the last step of its output and the next c0 "
                              f"its final cell state (lstm output='cell'), read by nothing else")
    e.skip.update([found[0][0], found[0][1], found[1].name])
    return True


def _intermediates(e, n, out_t):
    names = ("input_to_input", "input_to_forget", "input_to_cell", "input_to_output")
    idx = [e.tensor(e._fresh(f"{n.name}/{s}_intermediate"), TensorType((0,), "float32")) for s in names]
    q = QParams((out_t.quant.scale[0],), (out_t.quant.zero_point[0],))
    idx.append(e.tensor(e._fresh(f"{n.name}/effective_hidden_scale_intermediate"), TensorType((0,), out_t.dtype, q)))
    return idx


@tfl.exporter("lstm")
def _tfl_export_lstm(e, n, act, out, int8):
    ins = [-1] * 24
    ins[0] = e.value(n.inputs[0])
    for j, v in zip(_POS[:12], n.inputs[1:13]):
        ins[j] = e.value(v)
    if n.attrs.get("output") == "cell":
        seq = [m for m in e.g.nodes if m.op == "lstm" and m.attrs.get("output", "sequence") == "sequence"
               and (state_nodes(e.g, m) or ([], None))[1] is n]
        if not seq:
            raise tfl.ExportError(f"node {n.name!r}: an lstm with output='cell' exports only as the cell-state "
                                  f"update of a stateful LSTM (lstm.carry_state); TFLite's LSTM has no such output")
        return                  # written with its sequence node (the variable cell-state tensor)
    state = _state_export(e, n)
    ins[18], ins[19] = _zero_state(e, n, n.inputs[13], state), _zero_state(e, n, n.inputs[14], state)
    out_t = e.g.types[out]
    extra = {"intermediates": _intermediates(e, n, out_t)} if int8 else {}
    e.op(NAME, ins, [e.tensor(out, out_t)], "UnidirectionalSequenceLSTMOptions", int8,
         FusedActivationFunction=_ACT_TANH, CellClip=float(n.attrs["cell_clip"]), ProjClip=0.0,
         TimeMajor=bool(n.attrs["time_major"]), **extra)

