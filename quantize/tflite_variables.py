"""Graph states exported as TFLite resource variables (the form the importer reads back,
frontend/ops/variables.py).

A state that an op's exporter carries itself (a stateful LSTM's or SVDF's variable tensors) never
reaches here. Any other state, e.g. a streaming model's ring buffer or a running counter, is read
where it is first used (VAR_HANDLE + READ_VARIABLE, named by the state: ``shared_name``) and assigned its next
value after the main subgraph's last operator (ASSIGN_VARIABLE); a CALL_ONCE, the main subgraph's
first operator, runs an initialisation subgraph that assigns each variable its reset value (the
state constant). LiteRT keeps the variables between invocations, as Kiln's ``graph.states`` do.
"""
from __future__ import annotations

import numpy as np

from kiln.frontend.ops.tflite_util import ExportError


def shared_name(g, state):
    """The variable's name: the state's, less the ``var_`` the importer prefixes (so a model
    re-exported after import keeps its variables' names) where no other state has that name."""
    return state[4:] if state.startswith("var_") and len(state) > 4 and state[4:] not in g.states else state


def _handle(e, state):
    """A resource (variable handle) tensor for ``state`` and the VAR_HANDLE that sets it."""
    name = e._fresh(f"{state}/handle")
    e.tensors.append(dict(name=name, shape=(), dtype="resource", quant=None, data=None))
    e.index[name] = len(e.tensors) - 1
    e.op("VAR_HANDLE", [], [e.index[name]], "VarHandleOptions", SharedName=shared_name(e.g, state))
    return e.index[name]


def refuse_shared(state):
    """A state that an op carries as its own variable tensor (SVDF, stateful LSTM) is also read by
    another node: LiteRT would give that node the op's updated tensor, not the state it started from."""
    raise ExportError(f"graph state {state!r}: it is read by a node other than the op that carries it as its "
                      f"own variable tensor (SVDF, stateful LSTM); TFLite cannot share one state between an op's "
                      f"variable tensor and another reader: read the op's output instead")


def read(e, state):
    """Tensor index of graph state ``state``'s current value: READ_VARIABLE of its variable."""
    h = _handle(e, state)
    e.variables[state] = h
    out = e.tensor(state, e.g.types[state])
    e.op("READ_VARIABLE", [h], [out])
    return out


def finish(e):
    """After the main subgraph's operators: assign each variable its next value, and write the
    initialisation subgraph (the reset values) with the CALL_ONCE that runs it."""
    if not e.variables:
        return
    g = e.g
    init, index = e.subgraph(f"{g.name}_init")
    written = {o for op in e.ops for o in op[2]}
    for state, h in e.variables.items():
        nxt = g.states[state]
        if e.index.get(nxt) not in written and nxt not in g.inputs:
            refuse_shared(state)
        e.op("ASSIGN_VARIABLE", [h, e.value(nxt)], [])
        t, reset = g.types[state], g.consts.get(state, g.params.get(state))
        if reset is None:
            raise ExportError(f"graph state {state!r} has no reset value: a state must be a constant (or a "
                              f"parameter) holding the value it starts from")
        c = init.const(f"{state}/reset", np.asarray(reset).astype(t.dtype).reshape(t.shape), t.quant)
        init.op("ASSIGN_VARIABLE", [_handle(init, state), c], [])
    e.op("CALL_ONCE", [], [], "CallOnceOptions", InitSubgraphIndex=index)
    e.ops.insert(0, e.ops.pop())
