"""The graph IR: SSA nodes in topological order, every value typed.

Values are named by strings. A value is one of: a graph input (fed at run time), a parameter
(trainable tensor, stored in the graph), a constant (non-trainable tensor: literals, buffers such as
BatchNorm running statistics, int8 weights) or the output of exactly one node (a node's name is the
name of the value it produces). Nothing holds a closure: a graph is data and serialises exactly.

A stateful graph (TFLite's variable tensors: SVDF's activation state) lists its states in
``states``: ``states[c] = v`` says that constant ``c`` holds the state's reset value and that a run
leaves the value ``v`` computed as the state the next run reads. Runners keep the current state
(frontend/executor.py ``Session``, the C package's static state buffers) and reset it to the
constants on ``reset_state()``. ``updates`` are BatchNorm's train-mode buffer updates, not states.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import limits
from .errors import GraphError, ShapeError
from .registry import get_op
from .types import TensorType, dtype_of


@dataclasses.dataclass
class Node:
    name: str
    op: str
    inputs: list
    attrs: dict = dataclasses.field(default_factory=dict)

    def __str__(self):
        a = ", ".join(f"{k}={v}" for k, v in self.attrs.items() if v is not None)
        return f"{self.name} = {self.op}({', '.join(self.inputs)}{'; ' + a if a else ''})"


class Graph:
    def __init__(self, name="graph"):
        self.name = name
        self.inputs: list[str] = []
        self.params: dict[str, np.ndarray] = {}
        self.consts: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []
        self.outputs: list[str] = []
        self.types: dict[str, TensorType] = {}
        self.updates: dict[str, str] = {}   # buffer (const) name -> value holding its new value (train mode)
        self.states: dict[str, str] = {}    # state (const: its reset value) -> value holding the next state
        self.meta: dict = {}
        self._producer: dict[str, Node] = {}

    # ---- construction -------------------------------------------------------------------
    def _new_value(self, name, ttype):
        if name in self.types:
            raise GraphError(f"value {name!r} defined twice (SSA: every value has one definition)")
        self.types[name] = ttype

    def add_input(self, name, ttype: TensorType):
        self._new_value(name, ttype)
        self.inputs.append(name)
        return name

    def add_param(self, name, value, quant=None):
        value = np.asarray(value)
        self._new_value(name, TensorType.of(value, quant))
        self.params[name] = value
        return name

    def add_const(self, name, value, quant=None):
        value = np.asarray(value)
        self._new_value(name, TensorType.of(value, quant))
        self.consts[name] = value
        return name

    def add_node(self, op, inputs, attrs=None, name=None, out_type=None):
        """Append a node; infers its output type with the op's shape rule (or checks the given one)."""
        opdef = get_op(op)
        name = name or self.fresh(op)
        where = f"node {name!r} ({op}): "
        for i in inputs:
            if i not in self.types:
                raise GraphError(f"{where}input {i!r} is not defined before it is used")
        if opdef.arity is not None and len(inputs) != opdef.arity:
            raise GraphError(f"{where}expects {opdef.arity} inputs, got {len(inputs)}")
        attrs = opdef.normalize_attrs(attrs, where)
        if out_type is None:
            try:
                out_type = opdef.rule("infer")([self.types[i] for i in inputs], attrs)
            except ShapeError as e:
                raise ShapeError(f"{where}{e}") from None
        limits.check("max_nodes", len(self.nodes) + 1, f"graph {self.name!r}")
        node = Node(name, op, list(inputs), attrs)
        self._new_value(name, out_type)
        self.nodes.append(node)
        self._producer[name] = node
        return name

    def fresh(self, base):
        base = base.replace(".", "_")
        i = len(self.types)
        while f"{base}_{i}" in self.types:
            i += 1
        return f"{base}_{i}"

    # ---- queries ------------------------------------------------------------------------
    def producer(self, value) -> Node | None:
        if len(self._producer) != len(self.nodes):
            self._producer = {n.name: n for n in self.nodes}
        return self._producer.get(value)

    def kind(self, value):
        if value in self.params:
            return "param"
        if value in self.consts:
            return "const"
        if value in self.inputs:
            return "input"
        if self.producer(value) is not None:
            return "node"
        raise GraphError(f"value {value!r} is not defined in graph {self.name!r}")

    def consumers(self):
        uses = {v: [] for v in self.types}
        for n in self.nodes:
            for i in n.inputs:
                uses[i].append(n)
        return uses

    def last_use(self):
        """value -> index of the last node reading it (graph outputs live to the end)."""
        last = {}
        for k, n in enumerate(self.nodes):
            for i in n.inputs:
                last[i] = k
        for o in list(self.outputs) + list(self.updates.values()) + list(self.states.values()):
            last[o] = len(self.nodes)
        return last

    def depth(self):
        """Length of the longest producer chain (iterative: never recursion)."""
        d = {}
        best = 0
        for n in self.nodes:
            d[n.name] = 1 + max((d.get(i, 0) for i in n.inputs), default=0)
            best = max(best, d[n.name])
        return best

    def tensors(self):
        return {**self.consts, **self.params}

    # ---- validation ---------------------------------------------------------------------
    def validate(self):
        """Check SSA order, definitions, attributes, types and limits; names the node at fault."""
        limits.check("max_nodes", len(self.nodes), f"graph {self.name!r}")
        defined = set(self.inputs) | set(self.params) | set(self.consts)
        for name in defined:
            if name not in self.types:
                raise GraphError(f"value {name!r} has no type")
        for name, arr in self.tensors().items():
            t = self.types[name]
            if tuple(arr.shape) != t.shape or dtype_of(arr) != t.dtype:
                raise GraphError(f"tensor {name!r} holds {dtype_of(arr)}{list(arr.shape)} but its type says {t}")
        seen = set()
        for k, n in enumerate(self.nodes):
            where = f"node {k} {n.name!r} ({n.op}): "
            if n.name in defined or n.name in seen:
                raise GraphError(f"{where}value {n.name!r} defined twice")
            opdef = get_op(n.op)
            for i in n.inputs:
                if i not in defined and i not in seen:
                    raise GraphError(f"{where}input {i!r} is used before it is defined "
                                     f"(nodes must be in topological order)")
            if opdef.arity is not None and len(n.inputs) != opdef.arity:
                raise GraphError(f"{where}expects {opdef.arity} inputs, got {len(n.inputs)}")
            attrs = opdef.normalize_attrs(n.attrs, where)
            if n.name not in self.types:
                raise GraphError(f"{where}output has no type")
            if opdef.infer is not None:
                try:
                    t = opdef.infer([self.types[i] for i in n.inputs], attrs)
                except ShapeError as e:
                    raise ShapeError(f"{where}{e}") from None
                have = self.types[n.name]
                if t.shape != have.shape or t.dtype != have.dtype:
                    raise GraphError(f"{where}recorded type {have} but the shape rule gives {t}")
            seen.add(n.name)
        for o in self.outputs:
            if o not in defined and o not in seen:
                raise GraphError(f"graph output {o!r} is not defined")
        for b, v in self.updates.items():
            if b not in self.consts or v not in seen | defined:
                raise GraphError(f"buffer update {b!r} <- {v!r} refers to an undefined value")
        for s, v in self.states.items():
            if s not in self.consts or v not in seen:
                raise GraphError(f"state {s!r} <- {v!r}: a state must be a constant (its reset value) updated by a "
                                 f"node's output")
            if (self.types[s].shape, self.types[s].dtype, self.types[s].quant) != \
                    (self.types[v].shape, self.types[v].dtype, self.types[v].quant):
                raise GraphError(f"state {s!r} is {self.types[s]} but its next value {v!r} is {self.types[v]}")
        limits.check("max_depth", self.depth(), f"graph {self.name!r}")
        return self

    # ---- rendering ----------------------------------------------------------------------
    def pretty(self):
        lines = [f"graph {self.name}("
                 + ", ".join(f"{i}: {self.types[i]}" for i in self.inputs) + ")"]
        for kind, d in (("param", self.params), ("const", self.consts)):
            for name in d:
                lines.append(f"  {kind} {name}: {self.types[name]}")
        for n in self.nodes:
            lines.append(f"  {n}  # {self.types[n.name]}")
        lines.append("  return " + ", ".join(self.outputs))
        for b, v in self.updates.items():
            lines.append(f"  update {b} <- {v}")
        for s, v in self.states.items():
            lines.append(f"  state {s} <- {v}")
        return "\n".join(lines)

    __str__ = pretty

    def to_dot(self):
        esc = lambda s: str(s).replace('"', '\\"')
        out = [f'digraph "{esc(self.name)}" {{', "  rankdir=TB; node [fontname=monospace];"]
        for i in self.inputs:
            out.append(f'  "{esc(i)}" [shape=ellipse, style=filled, fillcolor=lightblue, label="{esc(i)}\\n{self.types[i]}"];')
        for d, color in ((self.params, "khaki"), (self.consts, "lightgrey")):
            for name in d:
                out.append(f'  "{esc(name)}" [shape=note, style=filled, fillcolor={color}, label="{esc(name)}\\n{self.types[name]}"];')
        for n in self.nodes:
            out.append(f'  "{esc(n.name)}" [shape=box, label="{esc(n.op)}\\n{esc(n.name)}\\n{self.types[n.name]}"];')
            for i in n.inputs:
                out.append(f'  "{esc(i)}" -> "{esc(n.name)}";')
        for k, o in enumerate(self.outputs):
            out.append(f'  "out{k}" [shape=doublecircle, label="out{k}"]; "{esc(o)}" -> "out{k}";')
        out.append("}")
        return "\n".join(out)

    def copy(self):
        g = Graph(self.name)
        g.inputs = list(self.inputs)
        g.params = dict(self.params)
        g.consts = dict(self.consts)
        g.nodes = [Node(n.name, n.op, list(n.inputs), dict(n.attrs)) for n in self.nodes]
        g.outputs = list(self.outputs)
        g.types = dict(self.types)
        g.updates = dict(self.updates)
        g.states = dict(self.states)
        g.meta = dict(self.meta)
        g._producer = {n.name: n for n in g.nodes}
        return g

    def __repr__(self):
        return (f"<Graph {self.name!r}: {len(self.inputs)} inputs, {len(self.params)} params, "
                f"{len(self.nodes)} nodes, {len(self.outputs)} outputs>")
