"""Graph-level passes of the C backend, each small; ``pipeline.py`` lists them in order."""
from __future__ import annotations

import dataclasses

import numpy as np

from kiln.frontend.lstm_state import cell_twins
from kiln.frontend.registry import get_op

from .lower import LoweringError, c_lowerable

# activation-like ops fused into the kernel that produces their input
EPILOGUES = {"relu", "relu6"}
# ops whose producer may absorb them as an epilogue
ANCHORS = {"conv2d", "dense", "add", "sub", "mul", "matmul", "avg_pool2d", "max_pool2d", "mean"}


@dataclasses.dataclass
class Group:
    nodes: list        # frontend Node objects, in order
    out: str           # graph value the group produces
    also: list = dataclasses.field(default_factory=list)   # values its kernel writes too (lower.also_writes)

    @property
    def name(self):
        return self.out


def constants(graph):
    """All values known at compile time (parameters are frozen for inference)."""
    return {**graph.params, **graph.consts}


def fold_constants(graph, consts):
    """Needs: nothing. Evaluates nodes whose inputs are all constants with the reference rules
    (so e.g. a reshape of weights costs nothing at run time). Returns the remaining nodes."""
    keep = []
    for n in graph.nodes:
        if n.inputs and all(i in consts for i in n.inputs) and n.name not in graph.outputs:
            op = get_op(n.op)
            xs = [consts[i] for i in n.inputs]
            if op.int8_ref is not None and _quantized(graph, n):
                y = op.int8_ref(xs, n.attrs, [graph.types[i] for i in n.inputs], graph.types[n.name])
            else:
                y = op.rule("ref")(xs, n.attrs)
            consts[n.name] = np.asarray(y).astype(graph.types[n.name].dtype)
        else:
            keep.append(n)
    return keep


def _quantized(graph, node):
    """The node runs with its int8 rule (as in the reference executor): its output or an input is
    quantised."""
    return graph.types[node.name].quant is not None or any(graph.types[i].quant is not None for i in node.inputs)


def find_views(graph, nodes, consts):
    """Needs: fold_constants. A reshape of a run-time value is a view: it shares its input's
    bytes (no kernel). Returns {view value: storage value}."""
    views = {}
    for n in nodes:
        if n.op == "reshape" and n.inputs[0] not in consts:
            src = n.inputs[0]
            views[n.name] = views.get(src, src)
    return views


def fuse(graph, nodes, views):
    """Needs: find_views. Groups nodes into kernels: pad -> conv2d (pad folded into the conv's
    window), anchor -> relu/relu6 (activation fused), a sequence lstm and its cell twin (a stateful
    LSTM's final cell state, ``lstm_state.cell_twins``: one kernel writes both, where the first of
    the two stands), everything else alone."""
    uses = {}
    for n in nodes:
        for i in n.inputs:
            uses.setdefault(i, []).append(n)
    outs = set(graph.outputs)
    by_name = {n.name: n for n in nodes}
    absorbed = set()
    groups = []
    twins = cell_twins(nodes)                   # sequence lstm -> its cell twin
    seq_of = {v: s for s, m in twins.items() for v in (s, m.name)}
    for n in nodes:
        if n.name in absorbed or n.name in views:
            continue
        if n.name in seq_of:                      # at whichever of the two comes first
            seq, twin = by_name[seq_of[n.name]], twins[seq_of[n.name]]
            absorbed.update([seq.name, twin.name])
            groups.append(Group([seq, twin], seq.name, [twin.name]))
            continue
        members = [n]
        # pad folded into a following conv2d
        if n.op == "pad" and n.name not in outs and len(uses.get(n.name, [])) == 1:
            c = uses[n.name][0]
            pads = n.attrs["pads"]
            if c.op == "conv2d" and c.inputs[0] == n.name and len(pads) == 8 and not any(pads[:2]) and not any(pads[6:]):
                members.append(c)
        last = members[-1]
        while (last.op in ANCHORS and last.name not in outs and len(uses.get(last.name, [])) == 1
               and uses[last.name][0].op in EPILOGUES and uses[last.name][0].name in by_name):
            last = uses[last.name][0]
            members.append(last)
            if last.op not in ANCHORS:
                break
        for m in members[1:]:
            absorbed.add(m.name)
        groups.append(Group(members, members[-1].name))
    return groups


def check_supported(graph, nodes, views):
    """Needs: nothing. Every node that becomes a kernel has a C lowering (a C override or the
    op's TE compute): fail early naming the op and node."""
    for n in nodes:
        if n.name in views:
            continue
        if not c_lowerable(n.op):
            ins = ", ".join(str(graph.types[i]) for i in n.inputs)
            raise LoweringError(f"node {n.name!r}: op '{n.op}' has no C lowering (inputs {ins})")
