"""The builder both model importers (torch.export and ONNX) write into: framework values with their
layout, on top of a Kiln :class:`Graph`.

A PyTorch or ONNX model computes on *logical* arrays (NCHW, NCL, [N, C*H*W] after a flatten); Kiln
computes on NHWC. The importer keeps every framework value as a :class:`V`: the Kiln value that holds
it *physically* plus a :class:`Layout` saying how to read it logically::

    logical = physical.reshape(pre).transpose(perm).reshape(shape)

A ``permute``/``transpose``/``view``/``flatten`` changes only the layout (no node). A node is
emitted only when a consumer needs another physical order than the one at hand (``physical``),
so NCHW becomes NHWC once at the input, a conv reads the NHWC value directly, and a ``Linear``
after a flatten reads it too with its weight columns permuted (``linear_columns``).

Constants stay NumPy arrays (``V.array``) until an op needs them in the graph; parameters are
graph parameters under their framework names (re-laid out to Kiln's layouts), buffers and
constants are graph constants.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .errors import KilnError
from .graph import Graph
from .types import TensorType, dtype_of


class ImportError_(KilnError):
    """Base of the import errors (named ImportError_ to leave Python's ImportError alone)."""


@dataclasses.dataclass(frozen=True)
class Layout:
    pre: tuple
    perm: tuple
    shape: tuple

    @staticmethod
    def plain(shape):
        shape = tuple(int(s) for s in shape)
        return Layout(shape, tuple(range(len(shape))), shape)

    @staticmethod
    def permuted(phys_shape, perm):
        """logical = physical.transpose(perm)."""
        phys_shape = tuple(int(s) for s in phys_shape)
        return Layout(phys_shape, tuple(perm), tuple(phys_shape[p] for p in perm))

    @property
    def pure(self):
        """No reshape after the transpose: logical is a permutation of ``pre``."""
        return self.shape == tuple(self.pre[p] for p in self.perm)

    @property
    def identity(self):
        return self.perm == tuple(range(len(self.perm)))

    def reshaped(self, shape):
        """The layout of this value reshaped (logically) to ``shape``: still a pure permutation
        when the reshape only splits or merges axes that are adjacent and in order physically
        too, else a trailing reshape."""
        shape = tuple(int(s) for s in shape)
        if self.pure:
            lay = _pure_reshape(self, shape)
            if lay is not None:
                return lay
        return Layout(self.pre, self.perm, shape)

    def to_logical(self, arr):
        return np.transpose(np.reshape(arr, self.pre), self.perm).reshape(self.shape)

    def to_physical(self, arr, phys_shape):
        """The physical array holding logical ``arr`` (the inverse of to_logical)."""
        t = np.reshape(arr, tuple(self.pre[p] for p in self.perm))
        return np.transpose(t, inverse(self.perm)).reshape(phys_shape)


def _groups(a, b):
    """Pairs (axes of a, axes of b) with equal products, for shapes without 1s; None if none."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        gi, gj, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(a):
                pa *= a[i]
                gi.append(i)
                i += 1
            elif pb < pa and j < len(b):
                pb *= b[j]
                gj.append(j)
                j += 1
            else:
                return None
        out.append((gi, gj))
    return out if i == len(a) and j == len(b) else None


def _pure_reshape(lay, shape):
    la = [k for k, s in enumerate(lay.shape) if s != 1]
    lb = [k for k, s in enumerate(shape) if s != 1]
    groups = _groups([lay.shape[k] for k in la], [shape[k] for k in lb])
    if groups is None:
        return None
    runs = []
    for gi, gj in groups:
        phys = [lay.perm[la[k]] for k in gi]
        if phys != list(range(phys[0], phys[0] + len(phys))):
            return None
        runs.append((phys[0], [lb[k] for k in gj]))
    order = [k for _, outs in sorted(runs) for k in outs]      # logical axes in physical order
    for k, s in enumerate(shape):
        if s == 1:      # a size-1 axis goes right after the axis before it (anywhere would do)
            order.insert(order.index(k - 1) + 1 if k > 0 else 0, k)
    pre = [shape[k] for k in order]
    perm = [order.index(k) for k in range(len(shape))]
    return Layout(tuple(pre), tuple(perm), shape)


def inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def channels_last(rank):
    """perm with logical [N, C, *S] = physical [N, *S, C].transpose(perm)."""
    return (0, rank - 1) + tuple(range(1, rank - 1)) if rank >= 3 else tuple(range(rank))


def moves_only_ones(shape, perm):
    """Whether transposing ``shape`` by ``perm`` keeps the order of its non-1 axes (a reshape)."""
    big = [p for p in perm if shape[p] != 1]
    return big == sorted(big)


@dataclasses.dataclass
class V:
    """A framework value: ``name`` (the Kiln value holding it physically) with ``lay``, or a
    constant ``array`` (logical) not yet in the graph; ``pname`` names a parameter or buffer."""
    name: str | None = None
    lay: Layout | None = None
    array: np.ndarray | None = None
    pname: str | None = None
    trainable: bool = False
    view: tuple = ()          # how ``array`` was derived from the named tensor (permute, reshape)

    @property
    def shape(self):
        return tuple(self.array.shape) if self.array is not None else self.lay.shape

    @property
    def rank(self):
        return len(self.shape)

    @property
    def is_const(self):
        return self.array is not None


class Builder:
    """A Kiln graph under construction from framework values (see the module docstring)."""

    def __init__(self, name):
        self.g = Graph(name)
        self._params = {}       # (pname, key) -> Kiln name of a re-laid-out parameter/constant
        self.meta = self.g.meta
        self.hint = "v"

    # ---- values ---------------------------------------------------------------------------
    def wrap(self, name, perm=None):
        t = self.g.types[name].shape
        return V(name, Layout.plain(t) if perm is None else Layout.permuted(t, perm))

    def input(self, name, shape, dtype="float32"):
        return self.wrap(self.g.add_input(name, TensorType(shape, dtype)))

    def fresh(self, base):
        return self.g.fresh(base)

    def emit(self, op, inputs, attrs=None, hint=None):
        return self.g.add_node(op, inputs, attrs, name=self.fresh(hint or self.hint))

    def tensor(self, v: V, arr=None, key="as_is"):
        """The Kiln name of constant ``v`` stored as ``arr`` (default: its logical array): a
        parameter when ``v`` is trainable, else a constant, named after ``pname`` when it has one.
        The same (pname, key) gives the same graph tensor."""
        arr = np.asarray(v.array if arr is None else arr)
        if arr.dtype == np.float64 and v.array is not None and v.array.dtype != np.float64:
            arr = arr.astype(v.array.dtype)
        key = (v.view, key)
        if v.pname is not None and (v.pname, key) in self._params:
            return self._params[(v.pname, key)]
        base = v.pname or "const"
        name = base if v.pname and base not in self.g.types else self.fresh(base)
        dtype_of(arr)
        if v.trainable:
            self.g.add_param(name, np.ascontiguousarray(arr))
        else:
            self.g.add_const(name, np.ascontiguousarray(arr))
        if v.pname is not None:
            self._params[(v.pname, key)] = name
        return name

    # ---- layouts --------------------------------------------------------------------------
    def transpose(self, name, perm):
        shape = self.g.types[name].shape
        perm = tuple(perm)
        if perm == tuple(range(len(perm))):
            return name
        if moves_only_ones(shape, perm):
            return self.reshape(name, [shape[p] for p in perm])
        return self.emit("transpose", [name], {"perm": list(perm)}, hint="transpose")

    def reshape(self, name, shape):
        shape = [int(s) for s in shape]
        t = self.g.types[name]
        if list(t.shape) == shape:
            return name
        src = self.g.producer(name)
        if src is not None and src.op == "reshape":   # reshape of a reshape: one node
            name = src.inputs[0]
            if list(self.g.types[name].shape) == shape:
                return name
        return self.emit("reshape", [name], {"shape": shape}, hint="reshape")

    def physical(self, v: V, want_perm=None):
        """A Kiln value P with logical(v) == P.transpose(want_perm) (default: plain, the logical
        array itself). Emits at most a reshape, a transpose and a reshape."""
        want = tuple(range(v.rank)) if want_perm is None else tuple(want_perm)
        if v.is_const:
            arr = np.transpose(v.array, inverse(want))
            return self.tensor(v, arr, key=("perm", want))
        lay = v.lay
        if lay.pure:
            x = self.reshape(v.name, lay.pre)
            return self.transpose(x, [lay.perm[i] for i in inverse(want)])
        x = self.reshape(v.name, lay.pre)
        x = self.transpose(x, lay.perm)
        x = self.reshape(x, lay.shape)
        return self.transpose(x, inverse(want))

    def plain(self, v: V):
        return self.physical(v)

    def layout_perm(self, v: V):
        """The perm of a pure layout (identity for constants and reshaped layouts)."""
        if v.is_const or not v.lay.pure:
            return tuple(range(v.rank))
        return v.lay.perm

    def as_pure(self, v: V):
        """(Kiln name, perm) with logical(v) == name.transpose(perm), emitting no transpose: a
        pure layout's ``pre`` view, or the plain value."""
        if not v.is_const and v.lay.pure:
            return self.reshape(v.name, v.lay.pre), v.lay.perm
        return self.plain(v), tuple(range(v.rank))

    # ---- constant helpers -------------------------------------------------------------------
    def const(self, arr, pname=None, trainable=False):
        return V(array=np.asarray(arr), pname=pname, trainable=trainable)

    def array_of(self, v: V, what):
        if not v.is_const:
            raise ImportError_(f"{what} must be a constant (a parameter, buffer or literal), got a computed "
                               f"value {v.name!r}")
        return v.array

    def broadcast_const(self, v: V, rank, perm, out_shape=None):
        """Constant ``v`` expanded to ``rank`` (leading 1s) and laid out for a value with ``perm``."""
        arr = np.reshape(v.array, (1,) * (rank - v.array.ndim) + v.array.shape)
        arr = np.transpose(arr, inverse(perm))
        return self.tensor(v, arr, key=("bcast", rank, tuple(perm)))

    # ---- finishing -----------------------------------------------------------------------------
    def finish(self, outputs, output_names=None):
        for v in outputs:
            if v.is_const:
                raise ImportError_("a model output is a constant (it does not depend on the inputs); Kiln "
                                   "graphs compute every output from the inputs")
            self.g.outputs.append(self.plain(v))
        if output_names:
            self.g.meta["output_names"] = list(output_names)
        self._drop_dead()
        return self.g.validate()

    def _drop_dead(self):
        """Remove nodes and tensors no output depends on (unused LSTM states, folded chains)."""
        g = self.g
        live = set(g.outputs)
        keep = []
        for n in reversed(g.nodes):
            if n.name in live:
                keep.append(n)
                live.update(n.inputs)
        dead = {n.name for n in g.nodes} - live
        g.nodes = list(reversed(keep))
        for d in (g.params, g.consts):
            for k in [k for k in d if k not in live]:
                del d[k]
                dead.add(k)
        for k in dead:
            g.types.pop(k, None)
        g._producer = {}
        if "batchnorm" in g.meta:
            g.meta["batchnorm"] = [bn for bn in g.meta["batchnorm"] if bn["output"] in live]


def linear_columns(b: Builder, v: V):
    """(Kiln name, column permutation or None) for a Linear over the last logical axis of ``v``:
    when ``v``'s physical rows hold its logical rows with the columns permuted (a flatten of an
    NHWC value), the Kiln value reshaped to the logical shape and ``perm`` with
    ``physical[..., j] == logical[..., perm[j]]``; else the plain value and None."""
    if v.is_const or v.lay.identity:
        return b.plain(v), None
    K = v.shape[-1]
    n = math.prod(v.shape)
    if n > 1 << 24 or K == 0:
        return b.plain(v), None
    idx = np.arange(n, dtype=np.int64).reshape(v.shape)
    phys = v.lay.to_physical(idx, b.g.types[v.name].shape).reshape(-1, K)
    rows = phys // K
    if not np.all(rows == np.arange(len(rows))[:, None]):
        return b.plain(v), None
    cols = phys[0] % K
    if not np.all(phys % K == cols[None, :]):
        return b.plain(v), None
    return b.reshape(v.name, v.shape), cols
