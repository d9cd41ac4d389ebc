"""Slices that cut one tensor into equal consecutive parts along one axis export as one SPLIT (what
a converter writes for ``split(x, k, axis)``: a GRU's 3H-wide gate products, a sequence cut into
its time steps) instead of one STRIDED_SLICE each. Kiln's graph has single-output nodes, so a
split is k ``slice`` nodes; the .tflite exporter (quantize/tflite_export.py) calls
:func:`export_as_split` from the slice exporter: the first slice of a group in graph order writes
the SPLIT with every part's tensor, the others find their tensor written. The import converter
turns SPLIT back into slices (frontend/ops/movement.py), so the round trip is exact; int8 parts
copy the raw values and share the input's quantisation.
"""
from __future__ import annotations

import numpy as np

PLAN = "_split_plan"


def _cut_axis(node, shape):
    """The one axis ``node`` (a slice) cuts, or None (strided, several axes, or a full copy)."""
    b, e = list(node.attrs["begin"]), list(node.attrs["end"])
    st = list(node.attrs["strides"] or [1] * len(shape))
    if len(b) != len(shape) or any(s != 1 for s in st):
        return None
    cut = [d for d in range(len(shape)) if (b[d], e[d]) != (0, shape[d])]
    if len(cut) != 1 or not 0 <= b[cut[0]] < e[cut[0]] <= shape[cut[0]]:
        return None
    return cut[0]


def split_plan(g):
    """slice node name -> (axis, the group's slice nodes in part order) for every group of slices
    of one value that partitions one axis into >= 2 equal parts (each part sliced once)."""
    groups = {}
    for n in g.nodes:
        if n.op == "slice":
            ax = _cut_axis(n, g.types[n.inputs[0]].shape)
            if ax is not None:
                groups.setdefault((n.inputs[0], ax), []).append(n)
    plan = {}
    for (src, ax), ns in groups.items():
        dim = g.types[src].shape[ax]
        starts = sorted(n.attrs["begin"][ax] for n in ns)
        size = dim // len(ns)
        if (len(ns) >= 2 and dim % len(ns) == 0 and starts == [k * size for k in range(len(ns))]
                and all(n.attrs["end"][ax] - n.attrs["begin"][ax] == size for n in ns)
                and all((g.types[n.name].dtype, g.types[n.name].quant) == (g.types[src].dtype, g.types[src].quant)
                        for n in ns)):
            ordered = sorted(ns, key=lambda n: n.attrs["begin"][ax])
            for n in ns:
                plan[n.name] = (ax, ordered)
    return plan


def export_as_split(e, n, out):
    """Write slice ``n`` as part of its group's SPLIT; False when it is not in a group."""
    plan = getattr(e, PLAN, None)
    if plan is None:
        plan = split_plan(e.g)
        setattr(e, PLAN, plan)
    if n.name not in plan or out != n.name:
        return False
    if out in e.index:                   # written by the group's SPLIT
        return True
    ax, ordered = plan[n.name]
    int8 = e.g.types[n.inputs[0]].quant is not None
    outs = [e.tensor(m.name, e.g.types[m.name]) for m in ordered]
    e.op("SPLIT", [e.const(f"{n.name}/axis", np.asarray(ax, np.int32)), e.value(n.inputs[0])], outs,
         "SplitOptions", int8, NumSplits=len(ordered))
    return True
