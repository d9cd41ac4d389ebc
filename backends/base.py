"""The one shape every backend has (after TVM's ``relax.build`` and ExecuTorch's backend
delegates): a :class:`Backend` compiles a graph into a :class:`Package`, and a package runs.

    backend = kiln.backends.get_backend("c")                  # the registry: backends/registry.py
    pkg = backend.compile(graph, {"target": "cortex-m4", "out_dir": "out/kws"})
    outs = pkg.run(x)                                         # list of np.ndarray, graph output order
    pkg.manifest.arena_bytes                                  # typed (backends/manifest.py)

A backend's options are one dataclass (``Backend.Options``); :func:`parse_options` turns the dict a
caller gives into it, naming an unknown option and the known ones.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from kiln.frontend.errors import UsageError

from .manifest import Manifest


@runtime_checkable
class Package(Protocol):
    """A compiled model. ``path``: its folder (None for packages kept in memory); ``manifest``: the
    typed manifest.json of a package folder (None for in-memory packages)."""
    backend: str
    path: str | None
    manifest: Manifest | None

    def run(self, *inputs, feeds: Mapping | None = None, params: Mapping | None = None) -> list:
        """Outputs (NumPy arrays, graph output order) for inputs given in graph input order or as
        ``feeds`` by name; ``params`` replaces parameter values by name where the package allows."""
        ...

    def run_updates(self, *inputs, feeds: Mapping | None = None, params: Mapping | None = None) -> tuple:
        """(outputs, {buffer: new value}): also the buffer updates of a train-mode graph (packages
        compiled with ``with_updates``)."""
        ...


@runtime_checkable
class Backend(Protocol):
    name: str
    description: str
    Options: type

    def compile(self, graph, options: Mapping | Any | None = None) -> Package:
        """Compile a Graph (or a model file) with ``options`` (a dict or ``self.Options``)."""
        ...

    def load(self, path) -> Package:
        """A package folder this backend wrote (backends that keep packages in memory raise)."""
        ...


def parse_options(backend, options):
    """``options`` (None, a dict or an instance of ``backend.Options``) as ``backend.Options``."""
    cls = backend.Options
    if options is None:
        return cls()
    if isinstance(options, cls):
        return options
    if not isinstance(options, Mapping):
        raise UsageError(f"backend {backend.name!r}: options must be a dict or {cls.__qualname__}, got "
                         f"{type(options).__name__}")
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UsageError(f"backend {backend.name!r} has no option {', '.join(map(repr, unknown))}; its options: "
                         f"{', '.join(known) or 'none'}")
    return cls(**options)


def no_package_folder(backend):
    """The error of ``load`` for backends that keep their packages in memory."""
    return UsageError(f"backend {backend.name!r} keeps its compiled packages in memory: there is no package "
                      f"folder to load; compile the model instead")


def feeds_as_inputs(names, inputs, feeds, where):
    """Positional inputs in ``names`` order from ``inputs`` or ``feeds`` (one of them)."""
    if feeds is None:
        if len(inputs) != len(names):
            raise UsageError(f"{where} takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
        return list(inputs)
    if inputs:
        raise UsageError(f"{where}: give the inputs positionally or as feeds, not both")
    missing = [n for n in names if n not in feeds]
    if missing:
        raise UsageError(f"{where}: feeds lack input {', '.join(map(repr, missing))} (inputs: {', '.join(names)})")
    return [feeds[n] for n in names]
