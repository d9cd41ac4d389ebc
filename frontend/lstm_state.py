"""A stateful LSTM: the ``lstm`` op's initial states (h0, c0) as graph states (``graph.states``),
TFLite's variable tensors that LiteRT and TFLite Micro carry from one invocation to the next.

``carry_state`` adds the next-state values after an ``lstm`` node: ``h0 <- y[:, T-1]`` (a slice and
a reshape of its output) and ``c0 <- lstm(...; output="cell")`` (a second lstm node with the same
inputs returning the final cell state, its *cell twin*: the op has one output). Kiln computes the
pair's recurrence once per run: the NumPy reference evaluates the two together (``cell_twins``;
frontend/executor.py) and the C backend lowers it as one kernel that writes both (backends/passes.py
fuse).
The TFLite importer (ops/recurrent_tflite.py), ``F.lstm(stateful=True)`` and ``nn.LSTM(stateful=True)``
build it; the exporter recognises it (``state_nodes``) and writes one operator with variable
tensors. Runners keep the states as for any stateful graph (docs/sequence_models.md).
"""
from __future__ import annotations

from .errors import ShapeError
from .types import TensorType


def _dims(g, n):
    """(N, T, H) of lstm node n (shapes already checked by the op's shape rule)."""
    x = g.types[n.inputs[0]].shape
    tm = n.attrs.get("time_major", False)
    return ((x[1], x[0]) if tm else (x[0], x[1])) + (g.types[n.inputs[1]].shape[0],)


def carry_state(g, name, h_next=None, c_next=None):
    """Make the lstm node ``name``'s initial states (constants: their reset values) graph states
    (``graph.states``) updated with its last step: ``h0 <- y[:, T-1]`` (a slice and a reshape of
    the output) and ``c0 <- lstm(...; output="cell")`` (a second lstm node, the final cell state,
    the sequence node's cell twin). Returns (h_next, c_next), the new values' names."""
    n = g.producer(name)
    if n is None or n.op != "lstm" or n.attrs.get("output", "sequence") != "sequence":
        raise ShapeError(f"carry_state: {name!r} is not the output of an lstm node")
    h0, c0 = n.inputs[13], n.inputs[14]
    for v in (h0, c0):
        if v not in g.consts or v in g.states:
            raise ShapeError(f"carry_state: lstm {name!r}'s initial state {v!r} must be a constant of its own (the "
                             f"state's reset value), not yet a graph state")
    if h0 == c0:
        raise ShapeError(f"carry_state: lstm {name!r} reads {h0!r} as both h0 and c0; each state needs its own")
    tm = n.attrs.get("time_major", False)
    N, T, H = _dims(g, n)
    ct = g.types[c0]
    c_next = g.add_node("lstm", list(n.inputs), dict(n.attrs, output="cell"), name=c_next or g.fresh(f"{c0}_next"),
                        out_type=TensorType((N, H), ct.dtype, ct.quant))
    last = g.add_node("slice", [name], {"begin": [T - 1, 0, 0] if tm else [0, T - 1, 0],
                                        "end": [T, N, H] if tm else [N, T, H], "strides": None},
                      name=g.fresh(f"{name}_last"))
    h_next = g.add_node("reshape", [last], {"shape": [N, H]}, name=h_next or g.fresh(f"{h0}_next"))
    g.states[h0], g.states[c0] = h_next, c_next
    return h_next, c_next


def is_cell_twin(n, m):
    """Whether lstm node ``m`` returns the final cell state of lstm node ``n``'s recurrence:
    ``n`` gives the sequence, ``m`` has ``output="cell"``, the same inputs and otherwise the same
    attributes (the next c0 ``carry_state`` adds)."""
    if n.op != "lstm" or m.op != "lstm" or n.attrs.get("output", "sequence") != "sequence" \
            or m.attrs.get("output") != "cell" or m.inputs != n.inputs:
        return False
    return {k: v for k, v in m.attrs.items() if k != "output"} == {k: v for k, v in n.attrs.items() if k != "output"}


def cell_twins(nodes):
    """{sequence lstm node name: its cell twin node} among ``nodes`` (the first twin of each). A
    backend computes each pair's recurrence once."""
    seqs = [n for n in nodes if n.op == "lstm" and n.attrs.get("output", "sequence") == "sequence"]
    out = {}
    for m in nodes:
        n = next((s for s in seqs if s.name not in out and is_cell_twin(s, m)), None)
        if n is not None:
            out[n.name] = m
    return out


def state_nodes(g, n):
    """(h_next chain, c_next node) when the lstm node ``n`` carries its state as ``carry_state``
    makes it (the slice and reshape names, the final-cell node), else None. The TFLite exporter
    writes them as the LSTM's variable tensors."""
    h0, c0 = n.inputs[13], n.inputs[14]
    if h0 not in g.states or c0 not in g.states:
        return None
    cn = g.producer(g.states[c0])
    hn = g.producer(g.states[h0])
    if cn is None or not is_cell_twin(n, cn):
        return None
    sl = g.producer(hn.inputs[0]) if hn is not None and hn.op == "reshape" else None
    if sl is None or sl.op != "slice" or sl.inputs != [n.name]:
        return None
    tm = n.attrs.get("time_major", False)
    N, T, H = _dims(g, n)
    want = ([T - 1, 0, 0], [T, N, H]) if tm else ([0, T - 1, 0], [N, T, H])
    if (list(sl.attrs["begin"]), list(sl.attrs["end"])) != want or sl.attrs.get("strides") not in (None, [1, 1, 1]):
        return None
    return [sl.name, hn.name], cn
