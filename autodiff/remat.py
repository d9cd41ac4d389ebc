"""Rematerialisation: ``checkpoint(fn)`` marks a region whose activations the backward pass
recomputes instead of keeping alive.

While tracing, ``checkpoint(fn)(*args)`` records the names of the nodes ``fn`` appended in
``graph.meta['checkpoint']``. When the backward pass first needs a value from a region, the
region's nodes are re-emitted (same ops and attributes, so dropout masks repeat) right there, and
the VJPs read the copies; the forward copies of the region's internal activations then die as
soon as the forward pass is done with them.
"""
from __future__ import annotations

import functools

from kiln.frontend.errors import TraceError
from kiln.frontend.tensor import current_graph


def checkpoint(fn):
    @functools.wraps(fn)
    def wrapped(*args, **kw):
        g = current_graph()
        if g is None:
            raise TraceError("checkpoint(fn) must be called while tracing (inside kiln.trace)")
        start = len(g.nodes)
        out = fn(*args, **kw)
        regions = g.meta.setdefault("checkpoint", {})
        regions[str(len(regions))] = [n.name for n in g.nodes[start:]]
        return out
    return wrapped


class Rematerializer:
    def __init__(self, graph, regions):
        self.g = graph
        self.region_of = {n: rid for rid, names in regions.items() for n in names}
        self.regions = regions
        self.copies = {}   # region id -> {original value: recomputed value}

    def names_for(self, node):
        rid = self.region_of.get(node.name)
        if rid is None:
            return {}
        if rid not in self.copies:
            mapping = {}
            producer = {n.name: n for n in self.g.nodes}
            for name in self.regions[rid]:
                n = producer[name]
                ins = [mapping.get(i, i) for i in n.inputs]
                mapping[name] = self.g.add_node(n.op, ins, n.attrs, name=self.g.fresh(f"remat_{n.op}"))
            self.copies[rid] = mapping
        return self.copies[rid]
