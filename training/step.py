"""The training step as one graph: forward + loss + backward (from the autodiff), run by the
NumPy executor. The optimiser update happens outside, in NumPy.

``StepGraph(model, loss, sample_shape, batch)`` traces the model in train mode followed by the
loss, then ``kiln.autodiff.grad(..., keep_outputs=True)`` appends the backward pass. The graph's
inputs are ``x``, the targets (``labels`` int64, or ``target`` float; none when the loss
reconstructs the input) and, when the model has Dropout, ``dropout_key`` (int64 scalar). Its
outputs are ``[loss, prediction, grad_0, ..., grad_k]`` (gradients in ``named_parameters()``
order) and BatchNorm running statistics come back as buffer updates (``graph.updates``).

Parameters and buffers are not baked in: each call passes the current arrays by name
(``run(..., params=...)``), so one traced graph serves the whole run. Graphs are cached per
batch size (a final partial batch gets its own). ``EvalGraph`` is the same for inference.

Who runs the graphs: ``backend="numpy"`` is Kiln's reference executor. A compiled step comes
from a :class:`StepCompiler` given as ``backend``; training imports no compiler itself
(``kiln.step_compiler("host-llvm")`` or ``("cuda")`` makes one from Kiln's backends, and
``kiln train --backend NAME`` does the same).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from kiln.autodiff import grad
from kiln.frontend import executor
from kiln.frontend.errors import UsageError
from kiln.frontend.module import Module
from kiln.frontend.trace import trace
from kiln.frontend.types import TensorType

from .losses import get_loss


class _WithLoss(Module):
    """Model followed by a loss; exposes the model's parameter names unchanged."""

    def __init__(self, model, loss_fn, target_kind, loss_kw):
        self._model, self._loss, self._kind, self._kw = model, loss_fn, target_kind, loss_kw
        self.training = model.training

    def named_parameters(self):
        return self._model.named_parameters()

    def named_buffers(self):
        return self._model.named_buffers()

    def forward(self, x, *target):
        pred = self._model(x)
        t = x if self._kind == "input" else target[0]
        return [self._loss(pred, t, **self._kw), pred]


def _inputs(kind, sample_shape, batch, target_shape, dtype):
    ins = [TensorType((batch,) + tuple(sample_shape), dtype)]
    names = ["x"]
    if kind == "labels":
        ins.append(TensorType((batch,) + tuple(target_shape or ()), "int64"))
        names.append("labels")
    elif kind == "target":
        ins.append(TensorType((batch,) + tuple(target_shape or ()), dtype))
        names.append("target")
    return ins, names


def _float_dtype(model):
    ps = model.parameters()
    return ps[0].dtype if ps else "float32"


@runtime_checkable
class StepCompiler(Protocol):
    """What training needs from a compiler: ``compile_step(graph)`` returns
    ``run(feeds, params) -> (outputs, {buffer: new value})`` for a training-step graph (forward,
    loss, backward, buffer updates); ``compile_eval(graph)`` returns ``run(feeds, params) ->
    outputs`` for an evaluation graph. ``name`` is recorded in the run's configuration."""
    name: str

    def compile_step(self, graph) -> Callable: ...

    def compile_eval(self, graph) -> Callable: ...


REFERENCE = "numpy"   # the one backend training runs by itself: the reference executor


def resolve_backend(backend):
    """``backend`` as training runs it: None for the reference executor ("numpy" or None), or the
    StepCompiler given. Any other string is an error saying what to pass."""
    if backend is None or backend == REFERENCE:
        return None
    if isinstance(backend, StepCompiler):
        return backend
    if isinstance(backend, str):
        raise UsageError(f"unknown training backend {backend!r}: training runs 'numpy' (the reference executor) by "
                         f"itself; for a compiled step pass a step compiler, e.g. "
                         f"backend=kiln.step_compiler('host-llvm') or kiln.step_compiler('cuda') (what "
                         f"`kiln train --backend NAME` uses)")
    raise UsageError(f"training backend must be 'numpy' or a step compiler (kiln.step_compiler(name)), got "
                     f"{type(backend).__name__}")


def backend_name(backend) -> str:
    """The name a run records for ``backend`` ("numpy" or the step compiler's name)."""
    compiler = resolve_backend(backend)
    return REFERENCE if compiler is None else compiler.name


class StepGraph:
    def __init__(self, model: Module, loss="cross_entropy", sample_shape=(), batch=32, target_shape=None,
                 label_smoothing=0.0, dtype=None, backend=REFERENCE):
        fn, kind = get_loss(loss)
        self.compiler = resolve_backend(backend)
        self._compiled = None
        self.loss_name, self.target_kind = loss, kind
        self.dtype = np.dtype(dtype or _float_dtype(model)).name
        kw = {"label_smoothing": label_smoothing} if label_smoothing else {}
        was = model.training
        model.train(True)
        try:
            wrapped = _WithLoss(model, fn, kind, kw)
            ins, names = _inputs(kind, sample_shape, batch, target_shape, self.dtype)
            fwd = trace(wrapped, *ins, name=f"{type(model).__name__}_loss", input_names=names)
        finally:
            model.train(was)
        self.param_names = [n for n, _ in model.named_parameters()]
        self.buffer_names = [n for n, _ in model.named_buffers()]
        self.forward_graph = fwd
        self.graph = grad(fwd, of=fwd.outputs[0], wrt=self.param_names, keep_outputs=True,
                          name=f"train_step_{type(model).__name__}")
        self.target_input = names[1] if len(names) > 1 else None
        self.has_dropout = "dropout_key" in self.graph.inputs
        self.batch = batch

    def feeds(self, x, y=None, dropout_key=None):
        f = {"x": x}
        if self.target_input is not None:
            f[self.target_input] = y
        if self.has_dropout:
            f["dropout_key"] = np.asarray(0 if dropout_key is None else dropout_key, np.int64)
        return f

    def __call__(self, params: dict, buffers: dict, x, y=None, dropout_key=None, check=False):
        """Run one step: returns (loss float, prediction, {param: grad}, {buffer: new value})."""
        feeds, ps = self.feeds(x, y, dropout_key), {**params, **buffers}
        if self.compiler is not None and not check:   # check mode (NaN diagnosis) always uses the reference
            self._compiled = self._compiled or self.compiler.compile_step(self.graph)
            outs, upd = self._compiled(feeds, ps)
        else:
            outs, upd = executor.run_updates(self.graph, feeds=feeds, params=ps, check=check)
        loss, pred = outs[0], outs[1]
        grads = dict(zip(self.param_names, outs[2:]))
        return float(loss), pred, grads, upd


class EvalGraph:
    """The model in eval mode on a fixed batch size, followed by the loss (for test metrics):
    outputs ``[loss, prediction]``; the targets input is as in :class:`StepGraph`."""

    def __init__(self, model: Module, sample_shape, batch, loss="cross_entropy", target_shape=None, dtype=None,
                 backend=REFERENCE):
        fn, kind = get_loss(loss)
        self.compiler = resolve_backend(backend)
        self._compiled = None
        self.dtype = np.dtype(dtype or _float_dtype(model))
        self.target_kind = kind
        was = model.training
        model.eval()
        try:
            ins, names = _inputs(kind, sample_shape, batch, target_shape, self.dtype.name)
            self.graph = trace(_WithLoss(model, fn, kind, {}), *ins, name=f"{type(model).__name__}_eval",
                               input_names=names)
        finally:
            model.train(was)
        self.target_input = names[1] if len(names) > 1 else None

    def __call__(self, params, buffers, x, y=None):
        feeds = {"x": x}
        if self.target_input is not None:
            feeds[self.target_input] = y
        if self.compiler is not None:
            self._compiled = self._compiled or self.compiler.compile_eval(self.graph)
            loss, pred = self._compiled(feeds, {**params, **buffers})
        else:
            loss, pred = executor.run(self.graph, feeds=feeds, params={**params, **buffers})
        return float(loss), pred


class GraphCache:
    """Traced graphs keyed by batch size."""

    def __init__(self, make):
        self.make, self.graphs = make, {}

    def __getitem__(self, batch):
        if batch not in self.graphs:
            self.graphs[batch] = self.make(batch)
        return self.graphs[batch]
