"""Kiln's C backend: TVM-generated kernels, a static memory plan and a command buffer, written
as a self-contained C package for Cortex-M (or the host).

    pkg = kiln.backends.compile("model.tflite", target="cortex-m4", out_dir="out/kws")
    pkg.manifest["arena_bytes"]; pkg.run(x)       # host execution through ctypes
"""
from .cpus import TARGETS, TargetSpec  # noqa: F401


def compile(graph_or_path, target="cortex-m4", out_dir=None, ram_budget=None, **kw):
    """Compile a Graph, a Kiln graph .json or a .tflite to a C package; returns a Package."""
    from .pipeline import compile as _compile
    return _compile(graph_or_path, target=target, out_dir=out_dir, ram_budget=ram_budget, **kw)


def load_package(path):
    from .pipeline import load_package as _lp
    return _lp(path)


def host_model(package_dir):
    """The package compiled as a host shared library: ``.run(*inputs) -> [outputs]``."""
    from .host import HostModel
    return HostModel(package_dir)


__all__ = ["compile", "load_package", "host_model", "TARGETS", "TargetSpec"]
