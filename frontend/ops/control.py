"""TFLite's IF, imported by if-conversion: both branch subgraphs are inlined into the graph (their
inputs bound to IF's operands) and each output is ``where(cond, then, else)``. For branches without
side effects (every op Kiln imports) that is the same result as running only the taken branch,
and the graph stays static (a fixed schedule and arena, as on a microcontroller); the price is
that both branches run. Branch subgraphs may hold IFs themselves (up to
``tflite_import.MAX_SUBGRAPH_DEPTH`` levels). WHILE is unrolled at import (frontend/ops/while_loop.py).
"""
from __future__ import annotations

from .. import tflite_checks as chk
from . import tflite_util as tfl

chk.VERSIONS.update({"IF": 1})
NAME = "IF"


@tfl.importer(NAME)
def _tfl_if(imp, k, op, ins, outs):
    w = tfl.where(k, NAME)
    if len(ins) < 1:
        raise imp.err(f"{w} has no inputs; it needs a bool condition first")
    o = tfl.options(imp, k, op, NAME, "IfOptions")
    if o is None:
        raise imp.err(f"{w}: IfOptions are missing (the branch subgraph indices)")
    cond = imp.value(ins[0], k, NAME)
    ct = imp.g.types[cond]
    if ct.dtype != "bool" or ct.size != 1:
        raise imp.err(f"{w}: condition {imp.label(ins[0])} is {ct}; TFLite's IF takes one bool")
    args = [i if imp.tensors[i]["data"] is not None or i in imp.folded else imp.value(i, k, NAME) for i in ins[1:]]
    branches = [imp.inline_subgraph(int(idx), args, f"{w} {what} branch")
                for idx, what in ((o.ThenSubgraphIndex(), "then"), (o.ElseSubgraphIndex(), "else"))]
    for j, (out, tv, ev) in enumerate(zip(outs, *branches)):
        if len(branches[0]) != len(outs) or len(branches[1]) != len(outs):
            raise imp.err(f"{w} has {len(outs)} outputs, its branches {len(branches[0])} and {len(branches[1])}")
        t = imp._ttype(out)
        for v, what in ((tv, "then"), (ev, "else")):
            vt = imp.g.types[v]
            if (tuple(vt.shape), vt.dtype, vt.quant) != (tuple(t.shape), t.dtype, t.quant):
                raise imp.err(f"{w}: output {j} of the {what} branch is {vt}, IF's output {imp.label(out)} is {t}")
        imp.values[out] = tv if tv == ev else imp.emit(k, NAME, "where", [cond, tv, ev], {}, out)


_tfl_if.multi_output = True
