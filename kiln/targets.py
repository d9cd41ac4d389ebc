"""Verification targets, found by name: what ``kiln verify --target`` and ``kiln run --target``
run a model on. A target is a runner ``runner(model, samples, options: dict) -> list`` (one tuple
of output arrays per sample, each sample a tuple of input arrays) plus a comparison rule.

They are built here from what the packages export (the packages register nothing):
``reference``, ``host``, ``host-llvm``, ``cuda`` and ``cuda-plan`` from the one registry of
backends (kiln.backends.registry), and one target per board from kiln/board_targets.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Callable

import numpy as np

from kiln import board_targets
from kiln.backends import get_backend, is_package
from kiln.backends.manifest import load_manifest
from kiln.boards import board_names
from kiln.frontend.errors import KilnError
from kiln.frontend.loader import load_model


@dataclasses.dataclass
class Target:
    name: str
    runner: Callable
    exact: bool = True          # int8 targets compare bit-exactly
    atol: float = 1e-5          # float comparison tolerance when not exact
    description: str = ""
    multi_io: bool = True       # runner takes/returns tuples of arrays (several inputs/outputs)
    tolerance_for: Callable | None = None   # (model, options) -> atol, when it depends on them
    exact_for: Callable | None = None       # (model, options) -> exact, when it depends on them

    def tolerance(self, model=None, options=None):
        """The float tolerance for ``model`` run with ``options`` (e.g. a float16 CUDA package's)."""
        return self.tolerance_for(model, options or {}) if self.tolerance_for else self.atol

    def is_exact(self, model=None, options=None):
        """Whether integer outputs of ``model`` run with ``options`` compare bit-exactly (a CUDA
        package: when it is an int8 one)."""
        return self.exact_for(model, options or {}) if self.exact_for else self.exact


def _shaped(graph, samples):
    """Each sample's inputs reshaped to the graph's input shapes."""
    out = []
    for xs in samples:
        if len(xs) != len(graph.inputs):
            raise KilnError(f"{graph.name}: a sample has {len(xs)} inputs, the model takes {len(graph.inputs)} "
                            f"({', '.join(graph.inputs)})")
        out.append([np.asarray(x).reshape(graph.types[i].shape) for x, i in zip(xs, graph.inputs)])
    return out


def run_reference(model, samples, options=None):
    """Kiln's reference executor on every sample: one tuple of outputs per sample.
    ``options["semantics"]`` (here and in every runner): frontend.load_model's, for a model file."""
    g = load_model(model, semantics=(options or {}).get("semantics"))
    pkg = get_backend("reference").compile(g)
    return [tuple(pkg.run(*xs)) for xs in _shaped(g, samples)]


def _host_package(model, options):
    """A package folder (given) or the model compiled for the host: into ``options["out_dir"]``,
    else a per-model cache folder (keyed by the file's path, size and modification time)."""
    c = get_backend("c")
    p = os.fspath(model)
    if is_package(p):
        return c.load(p)
    out, sem = options.get("out_dir"), options.get("semantics")
    if out is None:
        st = os.stat(p)
        key = hashlib.sha1(f"{os.path.abspath(p)}:{st.st_mtime_ns}:{st.st_size}{':' + sem if sem else ''}"
                           .encode()).hexdigest()[:16]
        out = os.path.join(tempfile.gettempdir(), f"kiln_host_pkg_{os.getuid()}", key)
    return c.compile(load_model(p, semantics=sem) if sem else p, {"target": options.get("c_target", "host"), "out_dir": out, "plot": False,
                         "measure_size": False})


def run_host(model, samples, options):
    """The C package compiled by the host gcc, run through ctypes."""
    pkg = _host_package(model, options)
    m = pkg.host_model()
    return [tuple(m.run(*xs)) for xs in samples]


def run_host_llvm(model, samples, options):
    g = load_model(model, semantics=options.get("semantics"))
    pkg = get_backend("host-llvm").compile(g)
    return [tuple(pkg.run(*xs)) for xs in _shaped(g, samples)]


def _cuda_package(model, options, interpret):
    cuda = get_backend("cuda")
    p = os.fspath(model)
    if is_package(p):
        pkg = cuda.load(p, interpret=interpret, capture=options.get("capture", False))
    else:
        pkg = cuda.compile(load_model(p, semantics=options.get("semantics")), {"out_dir": options.get("package"), "arch": options.get("arch", "sm_90"),
                                           "dtype": options.get("dtype", "float32"), "interpret": interpret,
                                           "capture": options.get("capture", False)})
    options["package_dtype"] = pkg.manifest.dtype     # for the comparison, after the folder is gone
    return pkg


def _cuda_dtype(model, options):
    """The storage dtype of the CUDA package behind ``model``: the one a run used (noted in
    ``options["package_dtype"]`` by ``_cuda_package``), a package folder's, else ``--dtype``."""
    if options.get("package_dtype"):
        return options["package_dtype"]
    for p in (os.fspath(model) if model is not None else "", options.get("package") or ""):
        if p and is_package(p):
            m = load_manifest(p)
            if m.is_cuda:
                return m.dtype
    return options.get("dtype", "float32")


def cuda_tolerance(model, options):
    """A CUDA package's tolerance follows its storage dtype (a package folder's, or --dtype); an
    int8 package has none (0: its outputs are compared bit-exactly)."""
    from kiln.backends.cuda_plan import INT8, tolerance
    dtype = _cuda_dtype(model, options)
    return 0.0 if dtype == INT8 else tolerance(dtype)


def cuda_exact(model, options):
    """An int8 CUDA package's integer outputs compare bit-exactly (no tolerance)."""
    from kiln.backends.cuda_plan import INT8
    return _cuda_dtype(model, options) == INT8


def run_cuda(model, samples, options):
    pkg = _cuda_package(model, options, interpret=False)
    return [tuple(pkg.run(*xs)) for xs in samples]


def run_cuda_sim(model, samples, options):
    from kiln.backends.cuda_sim import Simulator  # TVM (OpenCL lowering), pyopencl
    pkg = _cuda_package(model, options, interpret=True)
    sim = Simulator(pkg.path)
    return [tuple(sim(*pkg._inputs(xs, None))) for xs in samples]


def run_cuda_plan(model, samples, options):
    pkg = _cuda_package(model, options, interpret=True)
    return [tuple(pkg.run(*xs)) for xs in samples]


BACKEND_TARGETS = {t.name: t for t in (
    Target("reference", run_reference, exact=True, atol=1e-5,
           description="Kiln's NumPy reference executor (TFLite-exact int8 rules)"),
    Target("host", run_host, exact=True, atol=1e-5, description="C package compiled by host gcc, run through ctypes"),
    Target("host-llvm", run_host_llvm, exact=False, atol=1e-5,
           description="float graph compiled by TVM (LLVM) for this CPU"),
    Target("cuda", run_cuda, exact=False, exact_for=cuda_exact, atol=1e-4, tolerance_for=cuda_tolerance,
           description="CUDA package (TVM-generated .cu + launch plan) run with CuPy/NVRTC"),
    Target("cuda-sim", run_cuda_sim, exact=False, exact_for=cuda_exact, atol=1e-4, tolerance_for=cuda_tolerance,
           description="CUDA package's scheduled kernels and launch plan run on the CPU with OpenCL (pocl)"),
    Target("cuda-plan", run_cuda_plan, exact=False, exact_for=cuda_exact, atol=1e-5, tolerance_for=cuda_tolerance,
           description="CUDA package's launch plan executed on the CPU (no GPU needed)"),
)}


def target_names() -> list[str]:
    return list(BACKEND_TARGETS) + board_names()


def get_target(name) -> Target:
    if name in BACKEND_TARGETS:
        return BACKEND_TARGETS[name]
    if name in board_names():
        return Target(name, board_targets.board_runner(name), exact=True,
                      description=f"firmware on board {name}")
    raise KilnError(f"unknown target {name!r}; available: {', '.join(sorted(target_names()))} "
                    f"(boards: see `kiln boards`)")


def run_target(target: Target, model, samples, options=None) -> list[tuple]:
    """Run ``samples`` (each a tuple of input arrays) on ``target``; one tuple of output arrays
    per sample."""
    options = {} if options is None else options
    samples = [tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in samples]
    if target.multi_io:
        return [tuple(o) if isinstance(o, (tuple, list)) else (o,) for o in target.runner(model, samples, options)]
    if any(len(s) != 1 for s in samples):
        raise KilnError(f"target {target.name!r} runs single-input models only; this model's samples have "
                        f"{max(len(s) for s in samples)} inputs")
    return [(o,) for o in target.runner(model, [s[0] for s in samples], options)]
