"""Symbolic tensors: the handles user code and VJP rules compute with.

A :class:`Tensor` names one value of a :class:`Graph`; every operation on it appends a node.
The same class serves tracing (user code) and autodiff (VJP rules build backward nodes with it).
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np

from .errors import TraceError
from .graph import Graph
from .types import FLOAT_DTYPES, TensorType, dtype_of

_state = threading.local()
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_KILN_DIRS = tuple(os.path.join(_ROOT, d) + os.sep for d in
                   ("frontend", "autodiff", "training", "quantize", "backends", "kiln"))


def current_graph() -> Graph | None:
    return getattr(_state, "graph", None)


class _Scope:
    def __init__(self, graph, param_names=None):
        self.graph = graph
        self.param_names = param_names or {}

    def __enter__(self):
        self.prev = (getattr(_state, "graph", None), getattr(_state, "param_names", None),
                     getattr(_state, "param_ids", None))
        _state.graph = self.graph
        _state.param_names = self.param_names
        _state.param_ids = {}
        return self

    def __exit__(self, *exc):
        _state.graph, _state.param_names, _state.param_ids = self.prev


def building(graph, param_names=None):
    """Context in which Tensors, Parameters and constants are recorded into ``graph``."""
    return _Scope(graph, param_names)


def user_location():
    """File and line of the innermost frame outside Kiln's own code (a frame is Kiln's when its
    module is ``kiln``/``kiln.*`` or its file lies in one of Kiln's source folders)."""
    f = sys._getframe(1)
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        path = os.path.abspath(f.f_code.co_filename)
        if not (mod == "kiln" or mod.startswith("kiln.") or path.startswith(_KILN_DIRS)):
            return f"{f.f_code.co_filename}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>"


class Tensor:
    __array_priority__ = 1000   # make ndarray <op> Tensor defer to Tensor

    def __init__(self, graph: Graph, name: str):
        self.graph = graph
        self.name = name

    @property
    def type(self) -> TensorType:
        return self.graph.types[self.name]

    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self):
        return self.type.dtype

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return self.type.size

    def __repr__(self):
        return f"Tensor({self.name}: {self.type})"

    # ---- data-dependent control flow is an error ------------------------------------------
    def _concrete(self, what):
        raise TraceError(
            f"{what} of traced value {self.name!r} at {user_location()}: the value is not known "
            f"while tracing, so Kiln cannot record a branch on it. Use kiln.where(cond, a, b) "
            f"for data-dependent selection, or compute the condition outside the traced function.")

    def __bool__(self):
        self._concrete("bool()")

    def __float__(self):
        self._concrete("float()")

    def __int__(self):
        self._concrete("int()")

    def __index__(self):
        self._concrete("use as an index")

    def __array__(self, dtype=None, copy=None):
        self._concrete("conversion to a NumPy array")

    def item(self):
        self._concrete(".item()")

    def numpy(self):
        self._concrete(".numpy()")

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    __hash__ = object.__hash__

    # ---- operators (each appends a node; in-place forms create new nodes too) --------------
    def __add__(self, o): return F.add(self, o)
    def __radd__(self, o): return F.add(o, self)
    def __sub__(self, o): return F.sub(self, o)
    def __rsub__(self, o): return F.sub(o, self)
    def __mul__(self, o): return F.mul(self, o)
    def __rmul__(self, o): return F.mul(o, self)
    def __truediv__(self, o): return F.div(self, o)
    def __rtruediv__(self, o): return F.div(o, self)
    def __matmul__(self, o): return F.matmul(self, o)
    def __rmatmul__(self, o): return F.matmul(o, self)
    def __neg__(self): return F.neg(self)
    def __abs__(self): return F.abs(self)
    def __pos__(self): return self
    def __pow__(self, p): return F.pow(self, p)
    def __lt__(self, o): return F.less(self, o)
    def __le__(self, o): return F.less_equal(self, o)
    def __gt__(self, o): return F.greater(self, o)
    def __ge__(self, o): return F.greater_equal(self, o)
    def __eq__(self, o): return F.equal(self, o)      # elementwise, like NumPy
    def __ne__(self, o): return F.not_equal(self, o)
    def __getitem__(self, idx): return F.getitem(self, idx)

    # in-place operators rebind the Python name to a new node: the IR has no mutation
    __iadd__ = __add__
    __isub__ = __sub__
    __imul__ = __mul__
    __itruediv__ = __truediv__

    # ---- NumPy-like methods ----------------------------------------------------------------
    def sum(self, axis=None, keepdims=False): return F.sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return F.mean(self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return F.max(self, axis, keepdims)
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return F.reshape(self, shape)

    view = reshape      # PyTorch's name: x.view(x.shape[0], -1)
    def transpose(self, *perm):
        if len(perm) == 1 and isinstance(perm[0], (tuple, list)):
            perm = perm[0]
        return F.transpose(self, perm or None)
    @property
    def T(self): return F.transpose(self, None)
    def exp(self): return F.exp(self)
    def log(self): return F.log(self)
    def sqrt(self): return F.sqrt(self)
    def tanh(self): return F.tanh(self)
    def sigmoid(self): return F.sigmoid(self)
    def relu(self): return F.relu(self)
    def astype(self, dtype): return F.cast(self, dtype)
    def flatten(self, start=1): return F.reshape(self, self.shape[:start] + (-1,))


def as_tensor(x, like: Tensor | None = None, graph: Graph | None = None) -> Tensor:
    """Turn a Tensor, Parameter, NumPy array or Python scalar into a Tensor of the current graph."""
    from .module import Buffer, Parameter
    if isinstance(x, Tensor):
        return x
    g = graph or (like.graph if like is not None else current_graph())
    if g is None:
        raise TraceError("no graph is being built: call Kiln ops inside kiln.trace(...) "
                         "(or pass a traced Tensor)")
    if isinstance(x, (Parameter, Buffer)):
        return _bind_tensor(g, x)
    if isinstance(x, (bool, int, float, np.number)) or (isinstance(x, np.ndarray) and x.ndim == 0 and like is not None):
        dtype = "float32"
        if like is not None:
            if like.dtype in FLOAT_DTYPES:
                dtype = like.dtype
            elif like.dtype == "bool" and isinstance(x, (bool, np.bool_)):
                dtype = "bool"
            elif (like.dtype != "bool" and isinstance(x, (int, np.integer))
                  and not isinstance(x, (bool, np.bool_))):
                dtype = like.dtype      # int tensor op int literal stays in the tensor's dtype
        return constant(np.asarray(x, dtype=dtype), g)
    if isinstance(x, np.ndarray):
        dtype_of(x)
        return constant(x, g)
    raise TraceError(f"cannot use {type(x).__name__} as a Kiln tensor at {user_location()}")


def constant(value, graph: Graph | None = None, name=None) -> Tensor:
    """A constant (a NumPy array or number, kept with the graph) in the graph being traced."""
    g = graph or current_graph()
    return Tensor(g, g.add_const(name or g.fresh("const"), np.asarray(value)))


def _bind_tensor(g: Graph, p):
    from .module import Buffer
    ids = getattr(_state, "param_ids", None)
    if ids is None or current_graph() is not g:
        raise TraceError("a Parameter was used outside kiln.trace(...)")
    key = id(p)
    if key in ids:
        return Tensor(g, ids[key])
    names = getattr(_state, "param_names", {}) or {}
    is_buffer = isinstance(p, Buffer)
    base = names.get(key) or g.fresh("buffer" if is_buffer else "param")
    name = (g.add_const if is_buffer else g.add_param)(base, p.data)
    ids[key] = name
    return Tensor(g, name)


from . import functional as F  # noqa: E402  (circular: functional builds on Tensor)
