"""The ``c`` backend: TVM-generated C kernels, a static memory plan and a command buffer, as a
self-contained C package for a Cortex-M core or the host (backends/pipeline.py runs the passes;
docs/c_package.md is the package format).

    pkg = CBackend().compile(graph, {"target": "cortex-m4", "out_dir": "out/kws"})
    pkg.manifest.arena_bytes; pkg.run(x)        # host execution through ctypes (backends/host.py)
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import time

from kiln.frontend.errors import UsageError
from kiln.frontend.files import staged_dir

from . import cpus
from .base import feeds_as_inputs, parse_options
from .host import HostModel
from .manifest import FILE, Manifest, load_manifest, save_manifest
from .planner import MemoryPlan


@dataclasses.dataclass
class CPackage:
    """A compiled C package on disk. ``plan`` and ``graph`` are set when it was just compiled."""
    path: str
    manifest: Manifest
    plan: MemoryPlan | None = None
    graph: object = None
    backend = "c"

    @property
    def arena_bytes(self):
        return self.manifest.arena_bytes

    def host_model(self) -> HostModel:
        """The package built as a host shared library (cached by the sources' hash)."""
        return HostModel(self.path)

    def _host(self) -> HostModel:
        if getattr(self, "_host_model", None) is None:
            self._host_model = self.host_model()
        return self._host_model

    def reset_state(self):
        """A stateful package (manifest ``states``): the next run starts from the reset state."""
        self._host().reset_state()

    def run(self, *inputs, feeds=None, params=None):
        """Run on the host (compiled with host gcc, called through ctypes). A stateful package
        carries its state from one call to the next (``reset_state()`` starts over)."""
        if params:
            raise UsageError(f"{self.path}: a C package has its weights compiled in; recompile the model to "
                             f"change {', '.join(sorted(params))}")
        if feeds is not None:
            inputs = feeds_as_inputs([t.name for t in self.manifest.inputs], inputs, feeds, f"package {self.path}")
        return self._host().run(*inputs)

    def run_updates(self, *inputs, feeds=None, params=None):
        return self.run(*inputs, feeds=feeds, params=params), {}



@dataclasses.dataclass
class COptions:
    target: str | cpus.TargetSpec = "cortex-m4"   # a C target (cpus.TARGETS) or a TargetSpec
    out_dir: str | None = None                     # default: a new temporary folder
    optimize: str = "size"                         # "size" | "speed" (cpus.OPTIMIZE)
    ram_budget: int | None = None                  # bytes: the arena plus ram_reserved must fit
    ram_reserved: dict | None = None               # {what: bytes} of the other RAM a board needs
    plot: bool = True                              # draw memory.png
    measure_size: bool = True                      # arm-none-eabi-gcc code sizes (Cortex-M targets)


class CBackend:
    name = "c"
    description = "C package (TVM kernels, static memory plan, command buffer) for Cortex-M or the host"
    Options = COptions

    def compile(self, graph, options=None) -> CPackage:
        """Compile a Graph, a Kiln graph .json or a .tflite to a C package in ``options.out_dir``.
        ``optimize``: "size" (int8 weights everywhere, the default) or "speed" (int16-packed
        weights for layers up to schedules.W16_MAX_BYTES: fewer instructions, more flash). More
        RAM than ``ram_budget`` fails with pipeline.BudgetError."""
        from . import pipeline  # TVM: imported when a model is compiled
        o = parse_options(self, options)
        t0 = time.time()
        out_dir = o.out_dir if o.out_dir is not None else tempfile.mkdtemp(prefix="kiln_pkg_")
        # the package is written to a temporary folder beside out_dir and moved into place when
        # complete: a failure (a full disk included) leaves no half-written package
        with staged_dir(out_dir, "package folder", last=FILE) as tmp:
            st = pipeline.run(pipeline.CompileState(
                source=graph, target=cpus.get(o.target, o.optimize), out_dir=tmp, ram_budget=o.ram_budget,
                ram_reserved=o.ram_reserved, plot=o.plot, measure=o.measure_size))
            st.manifest.compile_seconds = round(time.time() - t0, 3)
            save_manifest(tmp, st.manifest)
        return CPackage(os.fspath(out_dir), st.manifest, st.plan, st.graph)

    def load(self, path) -> CPackage:
        return load_package(path)


def load_package(path) -> CPackage:
    """A C package folder written by :meth:`CBackend.compile`."""
    return CPackage(os.fspath(path), load_manifest(path))


def compile(graph_or_path, target="cortex-m4", out_dir=None, ram_budget=None, plot=True, measure_size=True,
            optimize="size", ram_reserved=None) -> CPackage:
    """``CBackend().compile`` with the options as keywords (kiln.backends.compile)."""
    return CBackend().compile(graph_or_path, COptions(target, out_dir, optimize, ram_budget, ram_reserved, plot,
                                                      measure_size))
