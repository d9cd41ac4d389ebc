"""The one registry of backends, found by name: ``kiln compile``, ``kiln run --target``,
``kiln verify --target`` and ``kiln train --backend`` all resolve their backend here.

    reference   Kiln's NumPy executor, the oracle (backends/reference.py)
    c           C package for a Cortex-M core or the host (backends/c.py; option ``target``)
    host-llvm   float graph compiled by TVM for this CPU (backends/server.py)
    cuda        CUDA package run on a GPU, or its launch plan on the CPU (backends/server.py)

``register_backend`` adds one (any object with the :class:`~kiln.backends.base.Backend` shape).
"""
from __future__ import annotations

from kiln.frontend.errors import UsageError

from .base import Backend
from .c import CBackend
from .reference import ReferenceBackend
from .server import CudaBackend, LlvmHostBackend

BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def get_backend(name: str) -> Backend:
    """The backend called ``name``; a UsageError listing the known ones otherwise."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    return BACKENDS[name]


def backend_names() -> list[str]:
    return list(BACKENDS)


for _b in (ReferenceBackend(), CBackend(), LlvmHostBackend(), CudaBackend()):
    register_backend(_b)
