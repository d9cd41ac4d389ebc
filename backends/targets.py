"""Verification targets of the C backend, registered in kiln.targets: ``host`` compiles the C
package with the host gcc as a shared library and runs it through ctypes."""
from __future__ import annotations

import os

from kiln.targets import Target, register_target


def _package_for(model_path, options):
    """A package folder (given) or a model compiled for the host (cached per model file)."""
    from .pipeline import compile as compile_pkg, load_package
    p = os.fspath(model_path)
    if os.path.isdir(p) and os.path.exists(os.path.join(p, "manifest.json")):
        return load_package(p)
    out = options.get("out_dir")
    if out is None:
        import hashlib
        import tempfile
        st = os.stat(p)
        key = hashlib.sha1(f"{os.path.abspath(p)}:{st.st_mtime_ns}:{st.st_size}".encode()).hexdigest()[:16]
        out = os.path.join(tempfile.gettempdir(), f"kiln_host_pkg_{os.getuid()}", key)
    return compile_pkg(p, target=options.get("c_target", "host"), out_dir=out, plot=False, measure_size=False)


def host_runner(model_path, samples, options):
    """One tuple of outputs per sample (a tuple of input arrays)."""
    from .host import HostModel
    pkg = _package_for(model_path, options)
    m = HostModel(pkg.path)
    return [tuple(m.run(*xs)) for xs in samples]


register_target(Target("host", host_runner, exact=True, atol=1e-5, multi_io=True,
                       description="C package compiled by host gcc, run through ctypes"))
