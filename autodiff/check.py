"""Gradient checking with centered finite differences in float64.

``check_grads(graph, inputs, order=1)`` differentiates the scalar objective ``sum(out * r)`` (``r`` a
fixed random probe; a scalar output is used as is) and compares, for every ``wrt`` value and a few
random directions ``d``, the analytic directional derivative ``<grad, d>`` with the centered
difference ``(f(x + eps d) - f(x - eps d)) / (2 eps)``. ``order=2`` does the same for the scalar
``<grad f, r2>``, so every VJP of the backward graph (second-order rules) is exercised.

The error measure is relative: ``|a - b| / max(|a|, |b|, floor)`` where ``floor = 1e-6 * max(1,
|f(x)|)`` is the size below which a float64 centered difference is noise (rounding in ``f`` divided
by ``eps``). When the worst error exceeds ``tol``, every differentiable node's VJP is checked on its
own (its recorded input values become the inputs of a one-node graph) and the worst one is blamed.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from kiln.frontend import functional as F
from kiln.frontend.errors import GraphError
from kiln.frontend.executor import run
from kiln.frontend.graph import Graph
from kiln.frontend.registry import NONDIFF, get_op
from kiln.frontend.tensor import Tensor
from kiln.frontend.types import FLOAT_DTYPES, TensorType

from .forward import _contract
from .reverse import grad


def to_float64(graph: Graph) -> Graph:
    """A copy of ``graph`` with every float value, parameter and constant in float64."""
    g = graph.copy()
    conv = lambda t: TensorType(t.shape, "float64", t.quant) if t.dtype in FLOAT_DTYPES else t
    g.types = {k: conv(t) for k, t in g.types.items()}
    for d in (g.params, g.consts):
        for k, v in d.items():
            if v.dtype.kind == "f":
                d[k] = v.astype(np.float64)
    for n in g.nodes:
        if n.op == "cast" and n.attrs["dtype"] in FLOAT_DTYPES:
            n.attrs = dict(n.attrs, dtype="float64")
    return g


@dataclasses.dataclass
class GradCheck:
    worst: dict          # wrt name -> worst relative error over the directions tried
    blame: str | None    # "node (op)" whose own VJP disagrees most with finite differences
    blame_error: float
    ok: bool
    order: int = 1
    blame_node: str | None = None
    blame_op: str | None = None

    @property
    def max_error(self):
        return max(self.worst.values(), default=0.0)

    def __str__(self):
        lines = [f"order-{self.order} gradient check: {'ok' if self.ok else 'FAILED'}"]
        lines += [f"  {k}: worst relative error {v:.3g}" for k, v in self.worst.items()]
        if self.blame:
            lines.append(f"  node to blame: {self.blame} (its own VJP has relative error {self.blame_error:.3g})")
        return "\n".join(lines)


def _rel(a, b, floor):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not np.size(a):
        return 0.0
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return 0.0 if np.array_equal(a, b) else float("inf")
    return float(np.max(np.abs(a - b) / np.maximum(floor, np.maximum(np.abs(a), np.abs(b)))))


def _directional_fd(graph, feeds, params, name, direction, eps):
    def f(delta):
        p = dict(params)
        fd = dict(feeds)
        if name in fd:
            fd[name] = fd[name] + delta * direction
        else:
            p[name] = p[name] + delta * direction
        return run(graph, feeds=fd, params=p)[0]
    return (f(eps) - f(-eps)) / (2 * eps)


def _feeds(g64, inputs):
    if isinstance(inputs, dict):
        feeds = dict(inputs)
    else:
        inputs = list(inputs)
        if len(inputs) > len(g64.inputs):
            raise GraphError(f"check_grads: graph {g64.name!r} takes {len(g64.inputs)} inputs, got {len(inputs)}")
        feeds = dict(zip(g64.inputs, inputs))
    return {k: np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
            for k, v in feeds.items()}


def check_grads(graph: Graph, inputs, wrt=None, order=1, eps=1e-6, tol=1e-6, directions=3, seed=0,
                blame=True) -> GradCheck:
    """Compare reverse-mode gradients of ``graph``'s first output with centered finite differences
    in float64.

    ``inputs``: list (graph input order) or dict of arrays. ``wrt``: names of inputs/parameters
    (default: every float input and every parameter). ``order``: 1 checks the gradient, 2 the
    gradient of the gradient. Returns a :class:`GradCheck`: the worst relative error per ``wrt``
    value and, when one exceeds ``tol`` (and ``blame``), the node whose own VJP disagrees most.
    """
    if order not in (1, 2):
        raise ValueError(f"check_grads: order must be 1 or 2, got {order!r}")
    g64 = to_float64(graph)
    rng = np.random.default_rng(seed)
    feeds = _feeds(g64, inputs)
    if wrt is None:
        wrt = [i for i in g64.inputs if g64.types[i].is_float] + list(g64.params)
    wrt = list(wrt)
    for w in wrt:
        g64.kind(w)     # names an undefined value clearly
    gs = _scalarize(g64, g64.outputs[0], rng)
    if order == 2:
        # f2 = <grad f, r2> for a fixed random r2: its gradient exercises every second-order VJP
        g1 = grad(gs, wrt=wrt, name=f"grad_{graph.name}")
        pairs = []
        for o in list(g1.outputs):
            r = g1.add_const(g1.fresh("probe2"), rng.standard_normal(g1.types[o].shape))
            pairs.append((Tensor(g1, o), Tensor(g1, r)))
        g1.outputs = [_contract(g1, pairs).name]
        res = check_grads(g1, feeds, wrt, 1, eps, tol, directions, seed, blame)
        res.order = 2
        return res
    gg = grad(gs, wrt=wrt)
    params = gs.tensors()
    analytic = run(gg, feeds=feeds)
    f0 = float(np.abs(run(gs, feeds=feeds)[0]))
    floor = 1e-6 * max(1.0, f0)
    worst = {}
    for name, an in zip(wrt, analytic):
        errs = [0.0]
        for _ in range(directions):
            d = rng.standard_normal(an.shape)
            fd = _directional_fd(gs, feeds, params, name, d, eps)
            errs.append(_rel(np.sum(an * d), fd, floor))
        worst[name] = max(errs)
    bad = max(worst.values(), default=0.0) > tol
    node = (None, None, 0.0)
    if bad and blame:
        node = _blame(g64, feeds, eps)
    return GradCheck(worst, f"{node[0]} ({node[1]})" if node[0] else None, node[2], not bad, 1, node[0], node[1])


def _scalarize(g64, out, rng):
    """Graph whose single output is sum(out * r) for a fixed random r (a scalar objective)."""
    g = g64.copy()
    t = g.types[out]
    if not t.is_float:
        raise GraphError(f"check_grads: output {out!r} is {t}, not a float tensor")
    if t.shape == ():
        g.outputs = [out]
        return g
    r = g.add_const(g.fresh("probe"), rng.standard_normal(t.shape))
    g.outputs = [F.sum(Tensor(g, out) * Tensor(g, r)).name]
    return g


def _blame(g64, feeds, eps):
    """Check every differentiable node's VJP on its own; return the worst (node, op, error).
    A VJP that raises is blamed with an infinite error."""
    _, kept = run(g64, feeds=feeds, keep=[n.name for n in g64.nodes] + list(g64.inputs))
    tensors = g64.tensors()
    worst = (None, None, 0.0)
    for n in g64.nodes:
        op = get_op(n.op)
        if NONDIFF in op.props or not g64.types[n.name].is_float:
            continue
        xs = [kept[i] if i in kept else tensors[i] for i in n.inputs]
        fwrt = [f"in{k}" for k, v in enumerate(xs) if np.asarray(v).dtype.kind == "f"]
        if not fwrt:
            continue
        local = Graph(f"local_{n.name}")
        for k, v in enumerate(xs):
            local.add_input(f"in{k}", TensorType.of(v))
        local.add_node(n.op, [f"in{k}" for k in range(len(xs))], n.attrs, name="y")
        local.outputs = ["y"]
        try:
            res = check_grads(local, xs, wrt=fwrt, eps=eps, directions=2, tol=np.inf, blame=False)
            e = res.max_error
        except NotImplementedError:
            raise
        except Exception:   # a VJP that cannot even build or run its graph is the culprit
            e = float("inf")
        if e > worst[2]:
            worst = (n.name, n.op, e)
    return worst
