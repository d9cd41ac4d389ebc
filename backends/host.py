"""Run a C package on the host: compile it with the host gcc as a shared library (cached by the
sources' hash) and call ``kiln_model_run`` through ctypes."""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile

import numpy as np

from kiln.frontend.errors import KilnError

from .manifest import load_manifest

CFLAGS = ["-O2", "-std=c99", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
_CACHE = os.path.join(tempfile.gettempdir(), f"kiln_host_{os.getuid()}")


def build_shared(pkg_dir, extra_flags=()):
    srcs = sorted(f for f in os.listdir(pkg_dir) if f.endswith((".c", ".h")))
    h = hashlib.sha256()
    for f in srcs:
        with open(os.path.join(pkg_dir, f), "rb") as fh:
            h.update(f.encode() + fh.read())
    h.update(" ".join(list(CFLAGS) + list(extra_flags)).encode())
    os.makedirs(_CACHE, exist_ok=True)
    so = os.path.join(_CACHE, h.hexdigest()[:24] + ".so")
    if not os.path.exists(so):
        cs = [os.path.join(pkg_dir, f) for f in srcs if f.endswith(".c")]
        tmp = so + f".{os.getpid()}.tmp"
        r = subprocess.run(["gcc", *CFLAGS, *extra_flags, "-I", pkg_dir, *cs, "-o", tmp, "-lm"],
                           capture_output=True, text=True)
        if r.returncode:
            raise KilnError(f"host gcc failed on package {pkg_dir}:\n{r.stderr[-4000:]}")
        os.replace(tmp, so)
    return so


class HostModel:
    """A C package built as a host shared library: ``run(*inputs) -> [outputs]``."""

    def __init__(self, pkg_dir, extra_flags=()):
        self.manifest = load_manifest(pkg_dir)
        self.lib = ctypes.CDLL(build_shared(pkg_dir, extra_flags))
        self.lib.kiln_model_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.lib.kiln_model_run.restype = ctypes.c_int
        n = self.manifest.arena_bytes
        self._arena_raw = np.zeros(n + 16, np.uint8)
        off = (-self._arena_raw.ctypes.data) % 16
        self.arena = self._arena_raw[off:off + n]
        self.reset_state()      # the library may be loaded already (one copy per process): start afresh

    def reset_state(self):
        """kiln_reset_state(): a stateful package's next run starts from the reset state (its
        state lives in the library, so every HostModel of one package shares it)."""
        if self.manifest.states:
            self.lib.kiln_reset_state()

    def run(self, *inputs):
        m = self.manifest
        if len(inputs) != len(m.inputs):
            raise KilnError(f"model takes {len(m.inputs)} inputs, got {len(inputs)}")
        parts = []
        for x, t in zip(inputs, m.inputs):
            x = np.ascontiguousarray(np.asarray(x).astype(t.dtype, copy=False))
            if list(x.shape) != t.shape and x.size != int(np.prod(t.shape or [1])):
                raise KilnError(f"input {t.name}: expected shape {t.shape}, got {list(x.shape)}")
            parts.append(x.reshape(-1).view(np.uint8))
        inbuf = np.ascontiguousarray(np.concatenate(parts)) if parts else np.zeros(1, np.uint8)
        outbuf = np.zeros(max(1, m.output_bytes), np.uint8)
        rc = self.lib.kiln_model_run(self.arena.ctypes.data, inbuf.ctypes.data, outbuf.ctypes.data)
        if rc != 0:
            raise KilnError(f"kiln_model_run returned {rc}")
        outs, off = [], 0
        for t in m.outputs:
            b = t.bytes
            outs.append(outbuf[off:off + b].view(t.dtype).reshape(t.shape).copy())
            off += b
        return outs
