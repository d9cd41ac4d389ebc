"""Compiled training steps: the backends of the one registry (kiln.backends) given to
kiln.training as step compilers. Training imports no backend itself; this is where a training
backend's name is resolved (``kiln train --backend NAME``, ``kiln.step_compiler(NAME)``).

    fit(model, train, test, backend=kiln.step_compiler("host-llvm"))
    StepGraph(model, "cross_entropy", (8, 8, 1), 32, backend=kiln.step_compiler("cuda"))
"""
from __future__ import annotations

import tempfile
import warnings

from kiln.backends import get_backend
from kiln.frontend.errors import UsageError
from kiln.training.step import REFERENCE

# training backend -> (backend of the step graph, backend of the evaluation graph)
STEP_BACKENDS = {"host-llvm": ("host-llvm", "host-llvm"),
                 "cuda": ("cuda", "host-llvm")}      # evaluation stays on the host
DEPRECATED = {"tvm": "host-llvm"}                    # old name -> name
TRAINING_BACKENDS = (REFERENCE, *STEP_BACKENDS)


class BackendStepCompiler:
    """A kiln.training.step.StepCompiler made of two registry backends: one compiles the training
    step (with its buffer updates), the other the evaluation graph."""

    def __init__(self, name, step_backend, eval_backend):
        self.name, self.step_backend, self.eval_backend = name, step_backend, eval_backend

    def compile_step(self, graph):
        options = {"with_updates": True}
        if self.step_backend.name == "cuda":
            options["out_dir"] = tempfile.mkdtemp(prefix="kiln_cuda_step_")
        pkg = self.step_backend.compile(graph, options)
        return lambda feeds, params: pkg.run_updates(feeds=feeds, params=params)

    def compile_eval(self, graph):
        pkg = self.eval_backend.compile(graph)
        return lambda feeds, params: pkg.run(feeds=feeds, params=params)

    def __repr__(self):
        return f"<step compiler {self.name!r}: step on {self.step_backend.name}, evaluation on {self.eval_backend.name}>"


def canonical_name(name: str) -> str:
    """``name`` with a deprecated alias replaced (a DeprecationWarning says so)."""
    if name in DEPRECATED:
        new = DEPRECATED[name]
        warnings.warn(f"training backend {name!r} is now called {new!r} (the same TVM LLVM host backend)",
                      DeprecationWarning, stacklevel=3)
        return new
    return name


def step_compiler(name: str):
    """What kiln.training takes as ``backend`` for the training backend ``name``: "numpy" (the
    reference executor, run by training itself) or a step compiler for "host-llvm" (the step
    compiled with TVM for this CPU) or "cuda" (a CUDA package on the GPU; evaluation on the host;
    raises CudaUnavailable naming what was found when no GPU can run it)."""
    name = canonical_name(name)
    if name in (REFERENCE, "reference"):
        return REFERENCE
    if name not in STEP_BACKENDS:
        raise UsageError(f"unknown training backend {name!r}: use {', '.join(map(repr, TRAINING_BACKENDS))} "
                         f"('tvm' is host-llvm's old name)")
    step, evaluate = (get_backend(b) for b in STEP_BACKENDS[name])
    if name == "cuda":
        step.check_available()
    return BackendStepCompiler(name, step, evaluate)
