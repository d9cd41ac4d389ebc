"""Calibration: observe every activation of a float graph on sample data and choose int8 ranges.

Methods (``method=``):

- ``minmax``: the observed minimum and maximum.
- ``percentile``: the ``percentile`` (default 99.99) and ``100 - percentile`` quantiles of a
  uniform subsample of the values (robust to outliers).
- ``mse``: the clipping of the minimum and of the maximum (factors in [0.2, 1], by coordinate
  descent) that minimises the mean squared quantisation error on the subsample.

Ranges always include 0 (TFLite's zero point must represent 0 exactly).
"""
from __future__ import annotations

import numpy as np

from kiln.frontend import run
from kiln.frontend.errors import KilnError
from kiln.frontend.types import QParams

from .graph_passes import with_batch

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


def qparams_from_range(lo, hi, qmin=-128, qmax=127) -> QParams:
    """TFLite-style asymmetric per-tensor int8 parameters covering [lo, hi] (and 0)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = (hi - lo) / (qmax - qmin)
    if not scale > 0 or not np.isfinite(scale):
        scale = 1e-8 if np.isfinite(scale) else 1.0
    scale = float(np.float32(scale))
    zp = int(np.clip(np.round(qmin - lo / scale), qmin, qmax))
    return QParams((scale,), (zp,))


def _fq(v, lo, hi):
    q = qparams_from_range(lo, hi)
    s, z = q.scale[0], q.zero_point[0]
    return (np.clip(np.round(v / s) + z, -128, 127) - z) * s


def choose_range(obs: Observer, method="minmax", percentile=99.99):
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
        return float(np.mean((v - _fq(v, a, b)) ** 2))
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

def observe(graph, data, batch_size=64, seed=0):
    """Run ``graph`` (float) on ``data`` ([N, ...] matching the input's sample shape) and return
    {value name: Observer} for the input and every node output."""
    data = np.asarray(data)
    if len(graph.inputs) != 1:
        raise KilnError(f"calibration feeds one input; graph {graph.name!r} has {len(graph.inputs)}")
    t = graph.types[graph.inputs[0]]
    if data.ndim == len(t.shape) - 1:
        data = data[None]
    if tuple(data.shape[1:]) != tuple(t.shape[1:]):
        raise KilnError(f"calibration data has samples of shape {data.shape[1:]}, the graph input is {t}")
    if len(data) == 0:
        raise KilnError("calibration data is empty")
    rng = np.random.default_rng(seed)
    names = [graph.inputs[0]] + [n.name for n in graph.nodes]
    obs = {n: Observer(rng) for n in names}
    cache = {}
    for i in range(0, len(data), batch_size):
        x = data[i:i + batch_size].astype(t.dtype, copy=False)
        g = cache.get(len(x)) or cache.setdefault(len(x), with_batch(graph, len(x)))
        _, kept = run(g, x, keep=names[1:])
        obs[names[0]].update(x)
        for n in names[1:]:
            obs[n].update(kept[n])
    return obs


def calibrate(graph, data, method="minmax", percentile=99.99, batch_size=64):
    """{value: (lo, hi)} for the input and every node output of a float graph."""
    obs = observe(graph, data, batch_size)
    return {k: choose_range(o, method, percentile) for k, o in obs.items()}
