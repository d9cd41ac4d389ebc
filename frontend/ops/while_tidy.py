"""Tidying an unrolled WHILE (frontend/ops/while_loop.py): a converter's lowered tensor list.

The converter writes a loop's per-step outputs into a tensor list that it lowers to plain ops:
each step rebuilds the list as ``concat(list[:t], new_t, list[t+1:])``. Unrolled, that is a chain
of T concatenations, each copying the whole list. Two rewrites collapse it, applied in graph
order to the unrolled nodes only:

- a concat whose input is a concat on the same axis (same type) takes that concat's inputs;
- a slice of a concat that covers whole parts exactly becomes the concat of those parts, and a
  slice inside one part becomes a slice of that part (of a constant: folded at import).

So ``list[:t]`` is the steps written so far, ``list[t+1:]`` a slice of the initial (constant)
list, and the final list one concat of every step's output. The values are unchanged (slices and
concats move data; every rewritten node keeps its type).
"""
from __future__ import annotations

from .split_export import _cut_axis


def _same(g, a, b):
    ta, tb = g.types[a], g.types[b]
    return (ta.dtype, ta.quant) == (tb.dtype, tb.quant)


def _axis(g, node):
    nd = len(g.types[node.name].shape)
    return node.attrs["axis"] % nd if nd else 0


def _flatten(g, node, prod):
    ax, out = _axis(g, node), []
    for i in node.inputs:
        p = prod.get(i)
        if p is not None and p.op == "concat" and _axis(g, p) == ax and _same(g, i, node.name) and \
                all(_same(g, j, node.name) for j in p.inputs):
            out.extend(p.inputs)
        else:
            out.append(i)
    node.inputs = out


def _through(g, node, prod):
    """Rewrite slice ``node`` of a concat: the parts it covers exactly, or a slice of one part."""
    src = prod.get(node.inputs[0])
    if src is None or src.op != "concat":
        return
    shape = g.types[src.name].shape
    ax = _cut_axis(node, shape)
    if ax is None or ax != _axis(g, src):
        return
    b, e = node.attrs["begin"][ax], node.attrs["end"][ax]
    off, covered = 0, []
    for part in src.inputs:
        n = g.types[part].shape[ax]
        if off <= b and e <= off + n and not (b == off and e == off + n):         # inside one part
            begin, end = list(node.attrs["begin"]), list(node.attrs["end"])
            begin[ax], end[ax] = b - off, e - off
            node.inputs, node.attrs = [part], {**node.attrs, "begin": begin, "end": end}
            return
        if b <= off and off + n <= e:
            covered.append(part)
        off += n
    if covered and sum(g.types[p].shape[ax] for p in covered) == e - b and \
            all(_same(g, p, node.name) for p in covered):
        node.op, node.inputs, node.attrs = "concat", covered, {"axis": ax}


def collapse_lists(g, first):
    """Apply both rewrites to the nodes from index ``first`` on (in place)."""
    prod = {}
    for node in g.nodes[first:]:
        if node.op == "slice":
            _through(g, node, prod)
        if node.op == "concat":
            _flatten(g, node, prod)
        prod[node.name] = node
    g._producer = {}
