"""The server backends: ``host-llvm`` (float graphs compiled with TVM's LLVM target for this CPU,
backends/llvm_host.py) and ``cuda`` (a CUDA package folder, backends/cuda.py, run on a GPU by
backends/cuda_runner.py or on the CPU by the plan interpreter, backends/cuda_plan.py).

Their implementations import TVM (or CuPy), so they are imported when a model is compiled or
run, not when the registry is."""
from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np

from kiln.frontend.errors import KilnError
from kiln.frontend.graph import Graph
from kiln.frontend.loader import load_model

from .base import feeds_as_inputs, no_package_folder, parse_options
from .manifest import Manifest


def float_graph(model, backend):
    """The float graph of ``model``; a named error for a quantised one (int8 models run on the C
    backend: the host or a board)."""
    g = load_model(model)
    if any(t.quant is not None for t in g.types.values()):
        raise KilnError(f"{model.name if isinstance(model, Graph) else model}: a quantised model; the {backend} "
                        f"backend runs float models (int8 models run on the C backend: --target host or a board)")
    return g


# ---- host-llvm ---------------------------------------------------------------------------------
@dataclasses.dataclass
class LlvmHostOptions:
    with_updates: bool = False       # also return the buffer updates of a train-mode graph
    cache: bool = True               # reuse the compiled library of a graph of the same structure
    num_threads: int | None = None   # TVM's CPU thread pool


class LlvmHostBackend:
    name = "host-llvm"
    description = "float graph compiled by TVM (LLVM) for this CPU"
    Options = LlvmHostOptions

    def compile(self, graph, options=None):
        """A llvm_host.CompiledGraph (the package, kept in memory; cached on disk by structure)."""
        from . import llvm_host  # TVM
        o = parse_options(self, options)
        return llvm_host.compile(float_graph(graph, self.name), cache=o.cache, with_updates=o.with_updates,
                                 num_threads=o.num_threads)

    def load(self, path):
        raise no_package_folder(self)


# ---- cuda --------------------------------------------------------------------------------------
@dataclasses.dataclass
class CudaOptions:
    out_dir: str | None = None       # default: a new temporary folder
    arch: str = "sm_90"
    dtype: str = "float32"           # storage dtype: float32 | float16 | bfloat16
    precision: str | None = None     # half packages: uniform | mixed (None: mixed for training steps)
    with_updates: bool = False       # the buffer updates of a train-mode graph become outputs
    params: dict | None = None       # parameter values to put in the weights blob
    interpret: bool = False          # run() executes the launch plan on the CPU (no GPU needed)
    capture: bool = False            # run() replays the launches as one captured CUDA graph
    check: bool | None = None        # NVRTC + ptxas compile of the package (None: when installed)


@dataclasses.dataclass
class CudaPackage:
    """A CUDA package folder. ``run`` runs it on the GPU (CuPy), or with ``interpret`` executes its
    launch plan on the CPU; parameters given to ``run`` are uploaded first."""
    path: str
    manifest: Manifest
    interpret: bool = False
    capture: bool = False
    backend = "cuda"
    _runner: object = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @property
    def runner(self):
        """The GPU runner (cuda_runner.CudaRunner), made on first use."""
        if self._runner is None:
            from .cuda_runner import CudaRunner  # CuPy
            self._runner = CudaRunner(self.path)
            if self.capture:
                self._runner.capture()
        return self._runner

    def _inputs(self, inputs, feeds):
        """The user's inputs in package order, each shaped as the package takes it."""
        names = self.manifest.user_inputs or [t.name for t in self.manifest.inputs]
        shapes = {t.name: t.shape for t in self.manifest.inputs}
        xs = feeds_as_inputs(names, inputs, feeds, f"CUDA package {self.path}")
        return [np.asarray(x).reshape(shapes[n]) if np.size(x) == np.prod(shapes[n]) else x for n, x in zip(names, xs)]

    def _weights(self, params):
        """The entries of ``params`` that are weights of the package (others are folded in)."""
        names = {w.name for w in self.manifest.weights}
        return {k: v for k, v in (params or {}).items() if k in names}

    def run(self, *inputs, feeds=None, params=None):
        xs = self._inputs(inputs, feeds)
        if self.interpret:
            from .cuda_plan import interpret_plan  # TVM
            return interpret_plan(self.path, xs, params=self._weights(params) or None)
        if params:
            self.runner.set_params(self._weights(params))
        return self.runner(*xs)

    def run_updates(self, *inputs, feeds=None, params=None):
        if self.interpret:
            raise KilnError("the CPU plan interpreter returns outputs only; run buffer updates on the GPU")
        if params:
            self.runner.set_params(self._weights(params))
        return self.runner.run_updates(*self._inputs(inputs, feeds))


class CudaBackend:
    name = "cuda"
    description = "CUDA package (TVM-generated .cu + launch plan; float or int8) run with CuPy/NVRTC"
    Options = CudaOptions

    def compile(self, graph, options=None) -> CudaPackage:
        from . import cuda  # TVM
        o = parse_options(self, options)
        g = load_model(graph)          # float graphs, and int8 ones (backends/cuda_int8.py)
        out = o.out_dir or tempfile.mkdtemp(prefix="kiln-cuda-")
        cuda.compile(g, out, arch=o.arch, dtype=o.dtype, with_updates=o.with_updates, params=o.params, check=o.check,
                     precision=o.precision)
        return self.load(out, interpret=o.interpret, capture=o.capture)

    def load(self, path, interpret=False, capture=False) -> CudaPackage:
        from .cuda_plan import load_manifest  # TVM (dropout masks)
        return CudaPackage(os.fspath(path), load_manifest(path), interpret, capture)

    def check_available(self, arch="sm_90"):
        """Raise cuda_runner.CudaUnavailable saying what was found when no GPU can run packages."""
        from .cuda_runner import probe  # CuPy
        probe(arch)
