"""Quantisation-aware training: fine-tune a float graph through ``fake_quant`` nodes (straight-
through gradient) with kiln.training's ``fit``, then convert it exactly like PTQ.

Per epoch:
1. calibrate the activation ranges of the current float graph (the ranges PTQ would pick);
2. build a :class:`FakeQuantModule`: the prepared graph replayed with ``fake_quant`` on the input,
   on every conv/dense weight (symmetric, per channel: what the int8 graph stores) and on every
   activation (the int8 graph's per-tensor parameters, including the fixed ones of softmax,
   sigmoid, tanh and the pass-through of pooling/reshape/pad);
3. train it for one epoch with ``kiln.training.fit``.
The trained weights go back into the float graph, which :func:`~kiln.frontend.int8_convert.convert` turns into
the same int8 graph type as PTQ.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from kiln.frontend import functional as F
from kiln.frontend.graph_passes import prepare
from kiln.frontend.module import Module, Parameter
from kiln.frontend.rebatch import rebatch_attrs
from kiln.frontend.registry import get_op
from kiln.frontend.tensor import constant
from kiln.frontend.types import QParams
from kiln.training import fit

from .calibrate import calibrate, qparams_from_range
from .ptq import QuantizationError, convert, quantize_weights


def activation_qparams(graph, ranges):
    """{value: QParams} the int8 graph will use for the input and every node output."""
    qp = {}
    for i in graph.inputs:
        qp[i] = qparams_from_range(*ranges[i])
    for n in graph.nodes:
        rule = get_op(n.op).quant
        if rule is not None and rule.output == "fixed":
            s, z = rule.fixed
            qp[n.name] = QParams((float(np.float32(s)),), (z,))
        elif rule is not None and rule.output == "input":
            qp[n.name] = qp[n.inputs[0]]
        else:
            qp[n.name] = qparams_from_range(*ranges[n.name])
    return qp


class FakeQuantModule(Module):
    """Replays a prepared float graph with fake quantisation; its parameters are the graph's."""

    def __init__(self, graph, act_qparams, per_channel=True):
        for n in graph.nodes:
            if get_op(n.op).quant is None:
                raise QuantizationError(f"node {n.name!r}: op '{n.op}' has no int8 kernel (QAT)")
        self._g = graph
        self._qp = act_qparams
        self._per_channel = per_channel
        self.p = {k: Parameter(v.copy(), v.dtype.name) for k, v in graph.params.items()}

    def _fq(self, t, q, axis=None, qmin=-128, qmax=127):
        return F.emit("fake_quant", [t], scale=list(q.scale), zero_point=list(q.zero_point), axis=axis,
                      qmin=qmin, qmax=qmax)

    def forward(self, x):
        g = self._g
        batch = g.types[g.inputs[0]].shape[0]
        env = {g.inputs[0]: self._fq(x, self._qp[g.inputs[0]])}
        for n in g.nodes:
            ins = []
            for k, v in enumerate(n.inputs):
                if v in env:
                    t = env[v]
                elif v in self.p:
                    t = self.p[v]
                    if get_op(n.op).quant.inputs == "weights" and k == 1:
                        _, wq = quantize_weights(self.p[v].data, self._per_channel)
                        t = self._fq(t, wq, axis=0 if wq.per_channel else None, qmin=-127, qmax=127)
                else:
                    t = constant(g.consts[v])
                ins.append(t)
            attrs = rebatch_attrs(n.op, n.attrs, batch, x.shape[0])   # traced at any batch
            y = F.emit(n.op, ins, **attrs)
            env[n.name] = self._fq(y, self._qp[n.name])
        return env[g.outputs[0]]

    def trained_graph(self):
        """The float graph with this module's current weights."""
        h = self._g.copy()
        h.params = {k: p.data.copy() for k, p in self.p.items()}
        return h


@dataclasses.dataclass
class QATResult:
    graph: object            # the int8 graph
    float_graph: object      # the fine-tuned float graph (prepared: BatchNorm folded)
    history: list            # per-epoch metrics from kiln.training.fit (on the fake-quantised model)


def qat(graph, train, test=None, *, epochs=3, lr=1e-4, per_channel=True, method="minmax", calibration=None,
        calibration_size=500, int8_io=False, batch_size=32, seed=0, quiet=True, **fit_overrides) -> QATResult:
    """Quantisation-aware fine-tuning of a float graph on ``train`` (a kiln.training ArrayDataset);
    returns the int8 graph (same form as :func:`ptq`) and the fine-tuned float graph."""
    pg = prepare(graph)
    calib = np.asarray(calibration if calibration is not None else train.x[:calibration_size])
    input_shape = pg.types[pg.inputs[0]].shape
    history = []
    for epoch in range(epochs):
        ranges = calibrate(pg, calib, method=method)
        mod = FakeQuantModule(pg, activation_qparams(pg, ranges), per_channel)
        r = fit(mod, train, test, input_shape=input_shape, epochs=1, lr=lr, batch_size=batch_size,
                seed=seed + epoch, quiet=quiet, model_name=f"{pg.name}_qat", **fit_overrides)
        history.append(dict(r.metrics, qat_epoch=epoch))
        pg = mod.trained_graph()
    ranges = calibrate(pg, calib, method=method)
    q = convert(pg, ranges, per_channel=per_channel, int8_io=int8_io)
    q.meta.update(calibration=method, qat_epochs=epochs)
    return QATResult(q, pg, history)
