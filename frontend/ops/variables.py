"""TFLite's resource variables (VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE) and CALL_ONCE, as
Kiln's graph states (``Graph.states``, the persistent-state design of SVDF).

A variable is named by VAR_HANDLE's (container, shared_name). CALL_ONCE runs its initialisation
subgraph once per interpreter: its ASSIGN_VARIABLEs of constants become the variables' reset
values. In the main subgraph a READ_VARIABLE gives the variable's current value: the state (a
constant holding the reset value) until an ASSIGN_VARIABLE in the same run, that assigned value
after it; the last value assigned in a run is what the next run reads (``states[c] = value``), as
TFLite keeps resource variables between invocations. ``kiln_reset_state()`` / ``reset_state()``
returns to the reset values. A variable read before any initialisation is refused (TFLite would
read an unallocated resource).
"""
from __future__ import annotations

import numpy as np

from .. import tflite_checks as chk
from ..types import TensorType
from . import tflite_util as tfl

chk.VERSIONS.update({"VAR_HANDLE": 1, "READ_VARIABLE": 1, "ASSIGN_VARIABLE": 1, "CALL_ONCE": 1})


def _vars(imp):
    return imp.shared.setdefault("variables", {})


def _key(imp, k, name, i):
    """The variable a handle tensor names (set by VAR_HANDLE)."""
    key = imp.shared.setdefault("handles", {}).get((id(imp), i))
    if key is None:
        raise imp.err(f"{tfl.where(k, name)}: {imp.label(i)} is not a VAR_HANDLE output of this subgraph")
    return key


@tfl.importer("VAR_HANDLE")
def _tfl_var_handle(imp, k, op, ins, out):
    name = "VAR_HANDLE"
    tfl.need(imp, k, name, ins, 0)
    o = tfl.options(imp, k, op, name, "VarHandleOptions")
    container = (o.Container() or b"").decode() if o else ""
    shared = (o.SharedName() or b"").decode() if o else ""
    key = f"{container}/{shared}" if container else shared or f"var{out}"
    imp.shared.setdefault("handles", {})[(id(imp), out)] = key
    imp.folded[out] = np.asarray(0, np.int32)         # a handle: no data, only a name
    if _finish not in imp.finishers:
        imp.finishers.append(_finish)
    _vars(imp).setdefault(key, {"state": None, "current": None, "reset": None, "type": None})


@tfl.importer("ASSIGN_VARIABLE")
def _tfl_assign_variable(imp, k, op, ins, outs):
    name = "ASSIGN_VARIABLE"
    tfl.need(imp, k, name, ins, 2)
    v = _vars(imp)[_key(imp, k, name, ins[0])]
    if imp.shared.get("initialising"):
        t = imp.tensors[ins[1]]
        data = imp.folded.get(ins[1], t["data"])
        if data is None:
            raise imp.err(f"{tfl.where(k, name)}: CALL_ONCE's subgraph assigns {imp.label(ins[1])}, which is not a "
                          f"constant; Kiln takes a variable's initial value from a constant")
        v["reset"], v["type"] = np.asarray(data), TensorType(t["shape"], t["dtype"], t["quant"])
        return
    value = imp.value(ins[1], k, name)
    vt = imp.g.types[value]
    if v["type"] is not None and (tuple(vt.shape), vt.dtype, vt.quant) != (tuple(v["type"].shape), v["type"].dtype,
                                                                            v["type"].quant):
        raise imp.err(f"{tfl.where(k, name)}: assigns {vt} to a variable of type {v['type']}")
    if v["type"] is None:
        v["type"] = vt
    v["current"] = value


_tfl_assign_variable.multi_output = True
_tfl_assign_variable.no_outputs = True


def _state(imp, k, name, key, v):
    """The variable's state constant (created on first use, holding the reset value)."""
    if v["state"] is None:
        if v["reset"] is None:
            raise imp.err(f"{tfl.where(k, name)}: variable {key!r} is read before it is initialised (no CALL_ONCE "
                          f"subgraph assigns it a constant)")
        t = v["type"]
        v["state"] = imp._vname(f"var_{key}")
        imp.g.add_const(v["state"], np.asarray(v["reset"]).astype(t.dtype).reshape(t.shape), t.quant)
        v["current"] = v["current"] or v["state"]
    return v["state"]


@tfl.importer("READ_VARIABLE")
def _tfl_read_variable(imp, k, op, ins, out):
    name = "READ_VARIABLE"
    tfl.need(imp, k, name, ins, 1)
    key = _key(imp, k, name, ins[0])
    v = _vars(imp)[key]
    state = _state(imp, k, name, key, v)
    cur = v["current"] or state
    want, got = imp._ttype(out), imp.g.types[cur]
    if (tuple(want.shape), want.dtype, want.quant) != (tuple(got.shape), got.dtype, got.quant):
        raise imp.err(f"{tfl.where(k, name)}: output {imp.label(out)} is {want}, the variable {key!r} holds {got}")
    imp.values[out] = cur


@tfl.importer("CALL_ONCE")
def _tfl_call_once(imp, k, op, ins, outs):
    name = "CALL_ONCE"
    tfl.need(imp, k, name, ins, 0)
    o = tfl.options(imp, k, op, name, "CallOnceOptions")
    if o is None:
        raise imp.err(f"{tfl.where(k, name)}: CallOnceOptions are missing (the initialisation subgraph index)")
    imp.shared["initialising"] = True
    try:
        imp.inline_subgraph(int(o.InitSubgraphIndex()), [], f"{tfl.where(k, name)} initialisation")
    finally:
        imp.shared["initialising"] = False


_tfl_call_once.multi_output = True
_tfl_call_once.no_outputs = True


def _finish(imp):
    """After the main subgraph: each variable read or assigned becomes a state whose next value is
    the last one assigned (a variable only read keeps its value: no state update)."""
    for key, v in _vars(imp).items():
        if v["state"] is None and v["current"] is not None:
            _state(imp, None, "ASSIGN_VARIABLE", key, v)
        if v["state"] is not None and v["current"] not in (None, v["state"]) and v["state"] not in imp.g.states:
            cur = v["current"]
            if imp.g.producer(cur) is None:         # a state's next value must be a node's output
                cur = imp.g.add_node("reshape", [cur], {"shape": list(imp.g.types[cur].shape)},
                                     name=imp._vname(f"var_{key}_next"))
            imp.g.states[v["state"]] = cur
