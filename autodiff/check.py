"""Gradient checking with centered finite differences in float64."""
from __future__ import annotations

import dataclasses

import numpy as np

from kiln.frontend.executor import run
from kiln.frontend.graph import Graph
from kiln.frontend.registry import NONDIFF, get_op
from kiln.frontend.types import FLOAT_DTYPES, TensorType


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
    worst: dict          # wrt name -> worst relative error
    blame: str | None    # node whose own VJP disagrees most with finite differences
    blame_error: float
    ok: bool

    def __str__(self):
        lines = [f"{k}: worst relative error {v:.3g}" for k, v in self.worst.items()]
        if self.blame:
            lines.append(f"node to blame: {self.blame} (local relative error {self.blame_error:.3g})")
        return "\n".join(lines)


def _rel(a, b):
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.maximum(np.abs(a), np.abs(b))))) if np.size(a) else 0.0


def _directional_fd(graph, feeds, params, name, direction, eps, out):
    def f(delta):
        p = dict(params)
        fd = dict(feeds)
        if name in fd:
            fd[name] = fd[name] + delta * direction
        else:
            p[name] = p[name] + delta * direction
        return run(graph, feeds=fd, params=p, outputs=[out])[0]
    return (f(eps) - f(-eps)) / (2 * eps)


def check_grads(graph: Graph, inputs, wrt=None, order=1, eps=1e-6, tol=1e-6, directions=3, seed=0):
    """Compare reverse-mode gradients with centered finite differences in float64.

    ``inputs``: list or dict of input arrays. ``wrt``: names (default: float inputs and every
    parameter). ``order=2`` checks the gradient of the gradient (via a random contraction).
    Returns a :class:`GradCheck` with the worst relative error per ``wrt`` value and, when one
    exceeds ``tol``, the node whose own VJP disagrees most with finite differences.
    """
    from .reverse import grad, vjp
    from .forward import _contract
    from kiln.frontend.tensor import Tensor

    g64 = to_float64(graph)
    rng = np.random.default_rng(seed)
    feeds = dict(zip(g64.inputs, inputs)) if not isinstance(inputs, dict) else dict(inputs)
    feeds = {k: np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v) for k, v in feeds.items()}
    if wrt is None:
        wrt = [i for i in g64.inputs if g64.types[i].is_float] + list(g64.params)
    out = g64.outputs[0]
    if order == 2:
        # f2 = <grad f, r> for a fixed random r: its gradient exercises second-order VJPs
        g1 = grad(_scalarize(g64, out, rng), wrt=wrt)
        rs = [rng.standard_normal(g1.types[o].shape) for o in g1.outputs]
        for k, (o, r) in enumerate(zip(list(g1.outputs), rs)):
            g1.add_const(f"r_{k}", r)
        s = _contract(g1, [(Tensor(g1, o), Tensor(g1, f"r_{k}")) for k, o in enumerate(g1.outputs)])
        g1.outputs = [s.name]
        return check_grads(g1, feeds, wrt, 1, eps, tol, directions, seed)
    gs = _scalarize(g64, out, rng)
    gg = grad(gs, wrt=wrt)
    params = gs.tensors()
    analytic = run(gg, feeds=feeds)
    worst = {}
    for name, an in zip(wrt, analytic):
        errs = []
        for _ in range(directions):
            d = rng.standard_normal(an.shape)
            fd = _directional_fd(gs, feeds, params, name, d, eps, gs.outputs[0])
            errs.append(_rel(np.sum(an * d), fd))
        worst[name] = max(errs)
    blame, berr = (None, 0.0)
    if max(worst.values(), default=0.0) > tol:
        blame, berr = _blame(g64, feeds, eps, rng)
    return GradCheck(worst, blame, berr, max(worst.values(), default=0.0) <= tol)


def _scalarize(g64, out, rng):
    """Graph whose single output is sum(out * r) for a fixed random r (a scalar objective)."""
    from kiln.frontend import functional as F
    from kiln.frontend.tensor import Tensor
    g = g64.copy()
    t = g.types[out]
    if t.size == 1 and t.shape == ():
        g.outputs = [out]
        return g
    r = g.add_const(g.fresh("probe"), rng.standard_normal(t.shape))
    g.outputs = [F.sum(Tensor(g, out) * Tensor(g, r)).name]
    return g


def _blame(g64, feeds, eps, rng):
    """Check every differentiable node's VJP locally; return the worst (node, error)."""
    from .reverse import vjp as vjp_graph
    values, kept = run(g64, feeds=feeds, keep=[n.name for n in g64.nodes] + list(g64.inputs))
    tensors = g64.tensors()
    worst = (None, 0.0)
    for n in g64.nodes:
        op = get_op(n.op)
        if NONDIFF in op.props or not g64.types[n.name].is_float:
            continue
        local = Graph(f"local_{n.name}")
        xs = []
        for k, i in enumerate(n.inputs):
            v = kept.get(i, tensors.get(i))
            local.add_input(f"in{k}", TensorType.of(v))
            xs.append(v)
        local.add_node(n.op, [f"in{k}" for k in range(len(xs))], n.attrs, name="y")
        local.outputs = ["y"]
        fwrt = [f"in{k}" for k, v in enumerate(xs) if np.asarray(v).dtype.kind == "f"]
        try:
            res = check_grads(local, xs, wrt=fwrt, eps=eps, directions=1, tol=np.inf)
        except Exception:
            continue
        e = max(res.worst.values(), default=0.0)
        if e > worst[1]:
            worst = (f"{n.name} ({n.op})", e)
    return worst
