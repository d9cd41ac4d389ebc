"""``trace(fn_or_module, *example_inputs)``: run user Python on symbolic tensors, return a Graph."""
from __future__ import annotations

import numpy as np

from . import ops  # noqa: F401
from .errors import TraceError
from .graph import Graph
from .module import Module
from .tensor import Tensor, building
from .types import TensorType


def _input_type(x):
    if isinstance(x, TensorType):
        return x
    if isinstance(x, tuple) and all(isinstance(s, int) for s in x):
        return TensorType(x, "float32")
    return TensorType.of(np.asarray(x))


def trace(fn, *example_inputs, name=None, input_names=None) -> Graph:
    """Trace ``fn`` (a function or a Module) on inputs given as example arrays, TensorTypes or shape
    tuples (float32). A Module's parameters and buffers become graph parameters and constants under
    their dotted names (all of them, used or not, in ``named_parameters()`` order)."""
    gname = name or getattr(fn, "__name__", None) or type(fn).__name__
    g = Graph(gname)
    names = {}
    if isinstance(fn, Module):
        for pname, p in fn.named_parameters() + fn.named_buffers():
            names[id(p)] = pname
        g.meta["module"] = type(fn).__name__
        g.meta["training"] = bool(fn.training)
    input_names = input_names or ([f"x{i}" for i in range(len(example_inputs))] if len(example_inputs) != 1 else ["x"])
    with building(g, names):
        if isinstance(fn, Module):
            from .tensor import as_tensor
            for _pname, p in fn.named_parameters() + fn.named_buffers():
                as_tensor(p)
        args = [Tensor(g, g.add_input(n, _input_type(x))) for n, x in zip(input_names, example_inputs)]
        out = fn(*args)
    outs = out if isinstance(out, (tuple, list)) else [out]
    if isinstance(out, dict):
        outs = list(out.values())
        g.meta["output_names"] = list(out.keys())
    for o in outs:
        if not isinstance(o, Tensor) or o.graph is not g:
            raise TraceError(f"{gname} returned {type(o).__name__}, not a traced tensor; "
                             f"return values computed from the inputs")
        g.outputs.append(o.name)
    g.validate()
    return g
