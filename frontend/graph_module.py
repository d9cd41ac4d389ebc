"""``GraphModule(graph)``: a float Graph (an imported PyTorch/ONNX model, a saved Kiln graph) as a
Module, so kiln.training fine-tunes it like a model written with the Module API.

Its parameters are the graph's parameters and its buffers the BatchNorm running statistics among
the graph's constants, under the same names (the other constants are literals); ``forward`` replays the graph's nodes into whatever is being traced, at any batch size
(reshape/broadcast targets and batch-axis slices follow: frontend/rebatch.py). In train mode a
BatchNorm the importer recorded (``graph.meta["batchnorm"]``) normalises with the batch statistics
and updates its running statistics, as PyTorch's does; in eval mode the graph runs as it is.
"""
from __future__ import annotations

import math

import numpy as np

from . import functional as F
from .errors import KilnError
from .module import Buffer, Module, Parameter, record_update
from .rebatch import rebatch_attrs
from .tensor import constant


class GraphModule(Module):
    """A float Graph as a Module: parameters are the graph's, ``forward`` replays its nodes at any
    batch size; train mode runs recorded BatchNorms on batch statistics (fine-tuning imports)."""

    def __init__(self, graph):
        bad = [i for i in graph.inputs if not graph.types[i].is_float]
        if bad or any(t.quant is not None for t in graph.types.values()):
            raise KilnError(f"GraphModule needs a float graph; {graph.name!r} is quantised or has non-float inputs "
                            f"{bad} (fine-tune the float model, then quantise it)")
        self._g = graph
        self._p = {k: Parameter(v.copy(), v.dtype.name) for k, v in graph.params.items()}
        self._bn = {bn["output"]: bn for bn in graph.meta.get("batchnorm", [])}
        stats = {bn[k] for bn in self._bn.values() for k in ("running_mean", "running_var")}
        self._b = {k: Buffer(v.copy(), v.dtype.name) for k, v in graph.consts.items() if k in stats}
        skip = set()
        for bn in self._bn.values():    # the eval-form mul of the activation is not needed in train mode
            add = graph.producer(bn["output"])
            skip.update(i for i in add.inputs if graph.producer(i) is not None and graph.producer(i).op == "mul"
                        and bn["input"] in graph.producer(i).inputs)
        self._train_skip = skip

    def named_parameters(self):
        return list(self._p.items())

    def named_buffers(self):
        return list(self._b.items())

    def forward(self, *xs):
        g = self._g
        if len(xs) != len(g.inputs):
            raise KilnError(f"{g.name}: takes {len(g.inputs)} inputs, got {len(xs)}")
        batch = g.types[g.inputs[0]].shape[0] if g.types[g.inputs[0]].shape else None
        n = xs[0].shape[0] if batch is not None else None
        env = dict(zip(g.inputs, xs))
        for node in g.nodes:
            if self.training and node.name in self._train_skip:
                continue
            if self.training and node.name in self._bn:
                env[node.name] = self._batch_norm(self._bn[node.name], env)
                continue
            ins = [self._value(v, env) for v in node.inputs]
            env[node.name] = F.emit(node.op, ins, **rebatch_attrs(node.op, node.attrs, batch, n))
        if not self.training and self._bn:
            self._record_batchnorm(env)
        outs = [env[o] for o in g.outputs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _record_batchnorm(self, env):
        """The BatchNorms, under their new value names, in the graph being traced (so the traced
        graph fine-tunes the same way again)."""
        t = env[self._g.inputs[0]]
        graph = getattr(t, "graph", None)
        if graph is None:
            return
        for bn in self._bn.values():
            graph.meta.setdefault("batchnorm", []).append(
                dict(bn, input=env[bn["input"]].name, output=env[bn["output"]].name))

    def _value(self, v, env):
        if v in env:
            return env[v]
        if v in self._p:
            return self._p[v]
        if v in self._b:
            return self._b[v]
        return constant(self._g.consts[v])

    def _batch_norm(self, bn, env):
        x = env[bn["input"]]
        axes = list(range(x.ndim - 1))
        count = math.prod(x.shape[:-1])
        mean = F.mean(x, axes)
        xc = x - mean
        var = F.mean(xc * xc, axes)
        m = bn["momentum"]
        rm, rv = self._b[bn["running_mean"]], self._b[bn["running_var"]]
        record_update(rm, rm * (1.0 - m) + mean * m)
        record_update(rv, rv * (1.0 - m) + var * (m * count / max(count - 1, 1)))
        scale = 1.0 / F.sqrt(var + bn["eps"])
        if bn["weight"] is not None:
            scale = scale * self._p.get(bn["weight"], self._b.get(bn["weight"]))
        y = xc * scale
        if bn["bias"] is not None:
            y = y + self._p.get(bn["bias"], self._b.get(bn["bias"]))
        return y

    def graph(self):
        """The graph with this module's current parameters and buffers."""
        h = self._g.copy()
        h.params = {k: p.data.copy() for k, p in self._p.items()}
        h.consts = {**h.consts, **{k: b.data.copy() for k, b in self._b.items()}}
        return h

    def extra_repr(self):
        return f"{self._g.name}: {len(self._g.nodes)} nodes, {sum(np.size(p.data) for p in self._p.values()):,} parameters"
