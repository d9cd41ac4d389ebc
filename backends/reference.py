"""The ``reference`` backend: Kiln's NumPy executor (frontend/executor.py) with TFLite's exact int8
rules. It compiles nothing; its package runs the graph as it is. It is the oracle every other
backend is checked against."""
from __future__ import annotations

import dataclasses

from kiln.frontend.executor import run_stateful, run_updates
from kiln.frontend.graph import Graph
from kiln.frontend.loader import load_model

from .base import no_package_folder, parse_options


@dataclasses.dataclass
class ReferencePackage:
    graph: Graph
    backend = "reference"
    path = None
    manifest = None
    state: dict = dataclasses.field(default_factory=dict)   # stateful graphs: the state runs carry

    def run(self, *inputs, feeds=None, params=None):
        """One inference; a stateful graph (``graph.states``: SVDF) starts from the state the
        previous call left (``reset_state()`` goes back to the reset values)."""
        return run_stateful(self.graph, self.state, *inputs, feeds=feeds, params=params)

    def reset_state(self):
        """Back to the reset values of the graph's states (zeros / zero points)."""
        self.state.clear()

    def run_updates(self, *inputs, feeds=None, params=None):
        return run_updates(self.graph, *inputs, feeds=feeds, params=params)


@dataclasses.dataclass
class ReferenceOptions:
    pass


class ReferenceBackend:
    name = "reference"
    description = "Kiln's NumPy reference executor (TFLite-exact int8 rules)"
    Options = ReferenceOptions

    def compile(self, graph, options=None) -> ReferencePackage:
        parse_options(self, options)
        return ReferencePackage(load_model(graph))

    def load(self, path):
        raise no_package_folder(self)
