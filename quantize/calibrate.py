"""Calibration: observe every activation of a float graph on sample data and choose int8 ranges.

Methods (``method=``):

- ``minmax``: the observed minimum and maximum.
- ``percentile``: the ``percentile`` (default 99.99) and ``100 - percentile`` quantiles of a
  uniform subsample of the values (robust to outliers).
- ``mse``: the clipping of the minimum and of the maximum (factors in [0.2, 1], by coordinate
  descent) that minimises the mean squared quantisation error on the subsample.

Ranges always include 0 (TFLite's zero point must represent 0 exactly). For 16x8 quantisation
(``activations="int16"``) the range becomes symmetric at conversion (zero point 0, scale
max|range| / 32767), and ``mse`` measures the error on that int16 grid.
"""
from __future__ import annotations

import numpy as np

from kiln.frontend import run
from kiln.frontend.errors import KilnError
from kiln.frontend.graph_passes import with_batch
from kiln.frontend.int8_convert import qparams16_from_range, qparams_from_range  # noqa: F401
from kiln.frontend.registry import get_op

METHODS = ("minmax", "percentile", "mse")
SAMPLE = 200_000


class Observer:
    """Running min/max and a bounded uniform subsample of one value."""

    def __init__(self, rng):
        self.lo, self.hi = np.inf, -np.inf
        self.sample = []
        self.n = 0
        self.rng = rng

    def update(self, a):
        a = np.asarray(a, np.float32).ravel()
        if a.size == 0:
            return
        self.lo = min(self.lo, float(a.min()))
        self.hi = max(self.hi, float(a.max()))
        take = min(a.size, max(1, SAMPLE // 16))
        self.sample.append(a if a.size <= take else self.rng.choice(a, take, replace=False))
        self.n += a.size
        if sum(s.size for s in self.sample) > 2 * SAMPLE:
            allv = np.concatenate(self.sample)
            self.sample = [self.rng.choice(allv, SAMPLE, replace=False)]

    def values(self):
        return np.concatenate(self.sample) if self.sample else np.zeros(1, np.float32)


def _fq(v, lo, hi, activations="int8"):
    if activations == "int16":          # 16x8: symmetric int16
        s = qparams16_from_range(lo, hi).scale[0]
        return np.clip(np.round(v / s), -32768, 32767) * s
    q = qparams_from_range(lo, hi)
    s, z = q.scale[0], q.zero_point[0]
    return (np.clip(np.round(v / s) + z, -128, 127) - z) * s


def choose_range(obs: Observer, method="minmax", percentile=99.99, activations="int8"):
    if method not in METHODS:
        raise KilnError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    if obs.n == 0:
        raise KilnError("calibration saw no values for an activation (empty calibration data?)")
    if method == "minmax":
        return obs.lo, obs.hi
    v = obs.values()
    if method == "percentile":
        return float(np.percentile(v, 100 - percentile)), float(np.percentile(v, percentile))
    lo, hi = obs.lo, obs.hi

    def err(a, b):
        return float(np.mean((v - _fq(v, a, b, activations)) ** 2))
    grid = np.linspace(0.2, 1.0, 33)
    best = err(lo, hi)
    for _ in range(2):        # coordinate descent: clip the top, then the bottom, twice
        for which in (1, 0):
            for a in grid:
                c = (lo, a * obs.hi) if which else (a * obs.lo, hi)
                e = err(*c)
                if e < best:
                    best, (lo, hi) = e, c
    return lo, hi

def _per_input(graph, data):
    """Calibration data as one [N, ...] array per graph input: ``data`` is an array (a graph with
    one input), a list/tuple with one array per input, or a dict keyed by input name."""
    names = graph.inputs
    if isinstance(data, dict):
        missing = [n for n in names if n not in data]
        if missing:
            raise KilnError(f"calibration data has no array for input(s) {missing} (has {sorted(data)})")
        arrays = [data[n] for n in names]
    elif isinstance(data, (list, tuple)) and len(names) > 1:
        arrays = list(data)
    else:
        arrays = [data]
    if len(arrays) != len(names):
        raise KilnError(f"calibration data has {len(arrays)} arrays, graph {graph.name!r} has {len(names)} inputs "
                        f"({', '.join(names)})")
    out = []
    for name, a in zip(names, arrays):
        a, t = np.asarray(a), graph.types[name]
        if a.ndim == len(t.shape) - 1:
            a = a[None]
        if tuple(a.shape[1:]) != tuple(t.shape[1:]):
            raise KilnError(f"calibration data for input {name!r} has samples of shape {a.shape[1:]}, "
                            f"the graph input is {t}")
        if len(a) == 0:
            raise KilnError(f"calibration data for input {name!r} is empty")
        out.append(a)
    if len({len(a) for a in out}) != 1:
        raise KilnError(f"calibration arrays hold different numbers of samples: {[len(a) for a in out]}")
    return out


def observe(graph, data, batch_size=64, seed=0):
    """Run ``graph`` (float) on ``data`` (see :func:`_per_input`: [N, ...] per input) and return
    {value name: Observer} for every input and every node output. A stateful graph (``graph.states``:
    SVDF) runs the samples in order as one stream, at its own batch size, carrying the state, so
    the ranges are those of a running stream."""
    arrays = _per_input(graph, data)
    rng = np.random.default_rng(seed)
    names = list(graph.inputs) + [n.name for n in graph.nodes]
    obs = {n: Observer(rng) for n in names}
    cache, state = {}, {}
    nodes = [n.name for n in graph.nodes]
    if graph.states:        # stateful (svdf): the samples are successive runs of one stream, the state carried
        batch_size = graph.types[graph.inputs[0]].shape[0]
    for i in range(0, len(arrays[0]) - (len(arrays[0]) % batch_size if graph.states else 0), batch_size):
        xs = [a[i:i + batch_size].astype(graph.types[name].dtype, copy=False) for a, name in zip(arrays, graph.inputs)]
        g = cache.get(len(xs[0])) or cache.setdefault(len(xs[0]), with_batch(graph, len(xs[0])))
        prev = state
        _, kept = run(g, *xs, keep=nodes + list(g.states.values()), params=state)
        state = {s: kept[v] for s, v in g.states.items()}
        for name, x in zip(graph.inputs, xs):
            obs[name].update(x)
        for n in nodes:
            obs[n].update(kept[n])
        _observe_internal(g, xs, kept, obs, rng, prev)
    return obs


def _observe_internal(g, xs, kept, obs, rng, state=None):
    """Internal values an op's Quant rule asks for (``observe``: the lstm's cell state), as
    obs["<node>:<tag>"]; ``state``: the graph states this run started from (a stream's)."""
    env = {**g.consts, **(state or {}), **g.params, **dict(zip(g.inputs, xs)), **kept}
    for n in g.nodes:
        rule = get_op(n.op).quant
        if rule is not None and rule.observe is not None:
            for tag, v in rule.observe([np.asarray(env[i]) for i in n.inputs], n.attrs).items():
                obs.setdefault(f"{n.name}:{tag}", Observer(rng)).update(v)


def calibrate(graph, data, method="minmax", percentile=99.99, batch_size=64, activations="int8"):
    """{value: (lo, hi)} for the input and every node output of a float graph (``activations``:
    the integer type the ranges are for, "int8" or "int16": mse clips for that grid)."""
    obs = observe(graph, data, batch_size)
    return {k: choose_range(o, method, percentile, activations) for k, o in obs.items()}
