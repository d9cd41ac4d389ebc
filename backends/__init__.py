"""Kiln's backends: one shape (``Backend.compile(graph, options) -> Package``, ``Package.run``,
a typed ``Manifest``; backends/base.py) and one registry (backends/registry.py) holding
``reference``, ``c`` (Cortex-M or host C packages), ``host-llvm`` and ``cuda``.

    pkg = kiln.backends.get_backend("c").compile(graph, {"target": "cortex-m4", "out_dir": "out/kws"})
    pkg = kiln.backends.compile("model.tflite", target="cortex-m4", out_dir="out/kws")   # the same
    pkg.manifest.arena_bytes; pkg.run(x)       # host execution through ctypes
"""
from .base import Backend, Package
from .c import CPackage, compile, load_package
from .cpus import TARGETS, TargetSpec
from .host import HostModel
from .manifest import Manifest, is_package, load_manifest, save_manifest
from .registry import BACKENDS, backend_names, get_backend, register_backend


def host_model(package_dir):
    """The package compiled as a host shared library: ``.run(*inputs) -> [outputs]``."""
    return HostModel(package_dir)


__all__ = ["Backend", "Package", "CPackage", "compile", "load_package", "host_model", "TARGETS", "TargetSpec",
           "Manifest", "is_package", "load_manifest", "save_manifest", "BACKENDS", "backend_names", "get_backend",
           "register_backend"]
