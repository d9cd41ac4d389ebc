"""Helpers of the ops' TE computes, handed to every ``te`` rule as ``T``.

An op's float lowering is its ``te`` rule, defined next to the op in ``frontend/ops``:
``rule(T, xs, attrs, out) -> te.Tensor`` where ``T`` is this module, ``xs`` the op's inputs as TE
tensors (scalar constants arrive as constant stages, so a rule never sees a Python number) and
``out`` the node's output type with the storage dtype already chosen (float32, or float16 /
bfloat16 when a server target stores in half precision). Reductions accumulate in float32 when
the storage dtype is 16-bit.

This module imports TVM; the op modules do not (they reach TVM only through ``T``, so importing
Kiln's frontend never loads TVM). The backends import it and pass it in.
"""
from __future__ import annotations

import math

from tvm import te, tirx

HALF = ("float16", "bfloat16")


def c(value, dtype):
    """A constant of ``dtype``."""
    return tirx.const(value, str(dtype))


def acc_dtype(dtype):
    """Accumulation dtype for reductions: float32 for 16-bit storage, the dtype itself otherwise."""
    dtype = str(dtype)
    return "float32" if dtype in HALF else dtype


def bidx(x, out_shape, idx):
    """Index ``x`` at output position ``idx`` under NumPy broadcasting (right-aligned, size-1 dims
    read index 0)."""
    nd = len(x.shape)
    lead = len(out_shape) - nd
    sub = [0 if int(x.shape[k]) == 1 else idx[lead + k] for k in range(nd)]
    return x(*sub)


def dt(v):
    """dtype of a PrimExpr (TVM 0.27 exposes it as ``.ty``; TE slices as ``.dtype``)."""
    ty = getattr(v, "ty", None)
    return str(ty) if ty is not None else str(v.dtype)


def cast(v, dtype):
    return v if dt(v) == dtype else v.astype(dtype)


def act(v, kind):
    """A fused activation ('none', 'relu', 'relu6') applied to ``v``."""
    if kind == "relu":
        return te.max(v, c(0, dt(v)))
    if kind == "relu6":
        return te.min(te.max(v, c(0, dt(v))), c(6, dt(v)))
    return v


def shape(t):
    return tuple(int(s) for s in t.shape)


def to_out(y, out, name):
    """``y``, or a stage casting it to the output's storage dtype when they differ."""
    if str(y.dtype) == str(out.dtype):
        return y
    return te.compute(out.shape, lambda *i: y(*i).astype(out.dtype), name=name)


def in_bounds(h, w, H, W):
    return tirx.all(h >= 0, h < H, w >= 0, w < W)


def tap(pos, k, pad, dil, stride, n_out):
    """For input position ``pos`` and kernel tap ``k``: (valid, output index) of the window that
    reads ``pos`` through tap ``k`` (the transpose of the strided window)."""
    t = pos + pad - k * dil
    q = tirx.floordiv(t, stride)
    valid = tirx.all(t >= 0, tirx.floormod(t, stride) == 0, q < n_out)
    return valid, q


def lowest(dtype):
    """The smallest value of ``dtype`` (-inf for floats)."""
    dtype = str(dtype)
    return tirx.min_value(dtype) if "float" not in dtype else c(-math.inf, dtype)


def unravel(flat, shape_):
    """Row-major multi-index of the flat position ``flat`` in ``shape_``."""
    idx = []
    for s in reversed(shape_):
        idx.append(tirx.floormod(flat, s) if s != 1 else 0)
        flat = tirx.floordiv(flat, s) if s != 1 else flat
    return list(reversed(idx))
