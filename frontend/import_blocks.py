"""The building blocks both importers map framework ops onto (see import_layout for the layout
rules). Each takes and returns :class:`~.import_layout.V` values in the framework's logical
layout and emits Kiln ops on the physical (NHWC) values.

Ops that Kiln has no single op for are composed from Kiln's primitives here, so that they are
differentiable and, where every primitive has an int8 kernel, quantisable:

- hardswish ``x * relu6(x + 3) / 6``, hardsigmoid ``relu6(alpha*6 x + beta*6) / 6``, SiLU
  ``x * sigmoid(x)``, LeakyReLU ``relu(x) - a relu(-x)``, GELU (exact: ``x * Phi(x)`` with an erf of
  absolute error < 1.5e-7, float only; tanh approximation: as torch writes it);
- nearest upsampling by integer factors: reshape + concat;
- LSTM and GRU unrolled over time: one dense for the input projection of every step, one dense
  of the hidden state per step, gate slices, sigmoid/tanh, mul/add (``1 - z`` is ``-1 * z + 1``).
"""
from __future__ import annotations

import math

import numpy as np

from .import_layout import Builder, ImportError_, Layout, V

NUMPY_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
             "minimum": np.minimum, "greater_equal": np.greater_equal, "greater": np.greater, "less": np.less,
             "equal": np.equal, "where": np.where}


class UnsupportedError(ImportError_):
    """A model uses an op, or an op's option, that Kiln cannot import."""


def _dtype_like(arr, like_dtype):
    arr = np.asarray(arr)
    if arr.dtype != like_dtype and arr.dtype.kind in "fiub" and np.dtype(like_dtype).kind == "f":
        return arr.astype(like_dtype)
    return arr


# ---- elementwise ---------------------------------------------------------------------------------
def unary(b: Builder, op, x: V, **attrs):
    if x.is_const and not x.trainable:
        from .registry import get_op
        return b.const(np.asarray(get_op(op).ref([x.array], get_op(op).normalize_attrs(attrs))))
    name = b.physical(x) if x.is_const else x.name
    return V(b.emit(op, [name], attrs or None, hint=op), x.lay if not x.is_const else Layout.plain(x.shape))


def binary(b: Builder, op, x: V, y: V):
    """Elementwise ``op`` with NumPy broadcasting on the logical shapes (see ``elementwise``);
    ``sub``/``div`` by a constant become ``add``/``mul`` (the forms with int8 kernels)."""
    if op == "sub" and y.is_const and not y.trainable and not x.is_const:
        op, y = "add", b.const(-y.array)
    elif (op == "div" and y.is_const and not y.trainable and not x.is_const and y.array.dtype.kind == "f"
          and np.all(y.array != 0)):
        op, y = "mul", b.const((1.0 / y.array.astype(np.float64)).astype(y.array.dtype))
    return elementwise(b, op, x, y)


def elementwise(b: Builder, op, *vs):
    """Elementwise ``op`` of any arity (NumPy broadcasting on the logical shapes). The layout of a
    runtime operand of the output's rank is kept and the others follow it (constants re-laid out
    in NumPy); constants alone are folded."""
    if all(v.is_const and not v.trainable for v in vs):
        return b.const(NUMPY_OPS[op](*[v.array for v in vs]))
    shape = tuple(np.broadcast_shapes(*[v.shape for v in vs]))
    r = len(shape)
    runtime = [v for v in vs if not v.is_const]
    lead = next((v for v in runtime if v.shape == shape), None) or next((v for v in runtime if v.rank == r), None)
    perm = b.layout_perm(lead) if lead is not None else tuple(range(r))
    like = next((v for v in runtime if b.g.types[v.name].dtype != "bool"), None)
    dt = np.dtype(b.g.types[like.name].dtype) if like is not None else np.float32
    names = []
    for v in vs:
        if v.is_const:
            arr = v.array if v.array.dtype == np.bool_ else _dtype_like(v.array, dt)
            names.append(b.broadcast_const(V(array=arr, pname=v.pname, trainable=v.trainable, view=v.view), r, perm))
        elif v.rank == r:
            names.append(b.physical(v, perm))
        else:
            names.append(b.physical(V(b.plain(v), Layout.plain(v.shape).reshaped((1,) * (r - v.rank) + v.shape)),
                                    perm))
    return b.wrap(b.emit(op, names, hint=op), perm)


def scalar(b, value, like: V):
    dt = like.array.dtype if like.is_const else np.dtype(b.g.types[like.name].dtype)
    return b.const(np.asarray(value, dtype=dt if dt.kind == "f" else np.float32))


def affine(b, x, mul=None, add=None):
    if mul is not None and mul != 1:
        x = binary(b, "mul", x, scalar(b, mul, x))
    if add is not None and add != 0:
        x = binary(b, "add", x, scalar(b, add, x))
    return x


def relu(b, x):
    return unary(b, "relu", x)


def clip(b, x, lo, hi):
    lo = -math.inf if lo is None else float(lo)
    hi = math.inf if hi is None else float(hi)
    if lo == 0 and hi == 6:
        return unary(b, "relu6", x)
    if lo == 0 and hi == math.inf:
        return unary(b, "relu", x)
    if lo > -math.inf:
        x = binary(b, "maximum", x, scalar(b, lo, x))
    if hi < math.inf:
        x = binary(b, "minimum", x, scalar(b, hi, x))
    return x


def hardsigmoid(b, x, alpha=1.0 / 6, beta=0.5):
    """max(0, min(1, alpha x + beta)) = relu6(6 alpha x + 6 beta) / 6."""
    return affine(b, unary(b, "relu6", affine(b, x, 6 * alpha, 6 * beta)), 1.0 / 6)


def hardswish(b, x):
    return binary(b, "mul", x, hardsigmoid(b, x))


def silu(b, x):
    return binary(b, "mul", x, unary(b, "sigmoid", x))


def leaky_relu(b, x, slope=0.01):
    pos = unary(b, "relu", x)
    neg = unary(b, "relu", affine(b, x, -1.0))
    return binary(b, "add", pos, affine(b, neg, -float(slope)))


# Abramowitz & Stegun 7.1.26: erf(z) = 1 - t (a1 + t (a2 + ...)) exp(-z^2), t = 1 / (1 + p z), z >= 0
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def gelu(b, x, approximate="none"):
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        inner = binary(b, "add", x, affine(b, binary(b, "mul", binary(b, "mul", x, x), x), 0.044715))
        t = unary(b, "tanh", affine(b, inner, c))
        return binary(b, "mul", affine(b, x, 0.5), affine(b, t, 1.0, 1.0))
    return binary(b, "mul", affine(b, x, 0.5), affine(b, erf(b, affine(b, x, 1 / math.sqrt(2))), 1.0, 1.0))


def erf(b, x):
    """erf(x) = sign(x) (1 - t P(t) exp(-x^2)), t = 1 / (1 + p |x|) (A&S 7.1.26, |error| < 1.5e-7)."""
    z = binary(b, "add", unary(b, "relu", x), unary(b, "relu", affine(b, x, -1.0)))
    t = binary(b, "div", scalar(b, 1.0, x), affine(b, z, _AS_P, 1.0))
    poly = scalar(b, _AS_A[-1], x)
    for a in reversed(_AS_A[:-1]):
        poly = affine(b, binary(b, "mul", poly, t), 1.0, a)
    e = unary(b, "exp", affine(b, binary(b, "mul", z, z), -1.0))
    one_minus = affine(b, binary(b, "mul", binary(b, "mul", poly, t), e), -1.0, 1.0)
    pos = elementwise(b, "greater_equal", x, scalar(b, 0.0, x))
    return elementwise(b, "where", pos, one_minus, affine(b, one_minus, -1.0))


def softmax(b, x, axis, log=False):
    name, perm = b.as_pure(x)
    axis = axis % x.rank
    out = b.emit("log_softmax" if log else "softmax", [name], {"axis": perm[axis]}, hint="softmax")
    return b.wrap(out, perm)


# ---- shapes --------------------------------------------------------------------------------------
def resolve_shape(shape, size):
    shape = [int(s) for s in shape]
    if shape.count(-1) == 1:
        rest = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = size // rest if rest else 0
    if math.prod(shape) != size:
        raise UnsupportedError(f"cannot reshape {size} elements to {shape}")
    return tuple(shape)


def reshape(b, x: V, shape):
    shape = resolve_shape(shape, math.prod(x.shape))
    if x.is_const:
        return V(array=x.array.reshape(shape), pname=x.pname, trainable=x.trainable,
                 view=x.view + (("reshape", shape),))
    return V(x.name, x.lay.reshaped(shape))


def permute(b, x: V, perm):
    perm = tuple(int(p) % x.rank for p in perm)
    if x.is_const:
        return V(array=np.transpose(x.array, perm), pname=x.pname, trainable=x.trainable,
                 view=x.view + (("permute", perm),))
    if not x.lay.pure:
        x = b.wrap(b.plain(x))
    lay = x.lay
    return V(x.name, Layout(lay.pre, tuple(lay.perm[p] for p in perm), tuple(lay.shape[p] for p in perm)))


def concat(b, xs, axis):
    axis = axis % xs[0].rank
    if all(x.is_const and not x.trainable for x in xs):
        return b.const(np.concatenate([x.array for x in xs], axis))
    lead = next(x for x in xs if not x.is_const)
    perm = b.layout_perm(lead)
    names = [b.physical(x, perm) for x in xs]
    return b.wrap(b.emit("concat", names, {"axis": perm[axis]}, hint="concat"), perm)


def slice_(b, x: V, axis, start, end, step=1):
    axis = axis % x.rank
    n = x.shape[axis]
    start, end, step = slice(start, end, step).indices(n)
    if step <= 0:
        raise UnsupportedError(f"slice with step {step}: Kiln slices with positive steps")
    if x.is_const and not x.trainable:
        idx = [slice(None)] * x.rank
        idx[axis] = slice(start, end, step)
        return b.const(x.array[tuple(idx)])
    name, perm = b.as_pure(x) if not x.is_const else (b.tensor(x), tuple(range(x.rank)))
    shape = b.g.types[name].shape
    pa = perm[axis]
    begin, stop = [0] * len(shape), list(shape)
    strides = [1] * len(shape)
    begin[pa], stop[pa], strides[pa] = start, max(start, end), step
    if (begin[pa], stop[pa], strides[pa]) == (0, shape[pa], 1):
        return V(name, Layout.permuted(shape, perm))
    out = b.emit("slice", [name], {"begin": begin, "end": stop, "strides": strides if step != 1 else None},
                 hint="slice")
    return b.wrap(out, perm)


def select(b, x, axis, index):
    axis = axis % x.rank
    index = index + x.shape[axis] if index < 0 else index
    y = slice_(b, x, axis, index, index + 1)
    return reshape(b, y, [s for i, s in enumerate(y.shape) if i != axis])


def pad_const(b, x: V, pads, value=0.0):
    """pads: [(lo, hi)] per logical axis (from the first)."""
    name, perm = b.as_pure(x)
    phys = [0] * (2 * x.rank)
    for i, (lo, hi) in enumerate(pads):
        if lo < 0 or hi < 0:
            raise UnsupportedError("negative padding (cropping) is not supported")
        phys[2 * perm[i]], phys[2 * perm[i] + 1] = int(lo), int(hi)
    if not any(phys):
        return x
    return b.wrap(b.emit("pad", [name], {"pads": phys, "value": float(value)}, hint="pad"), perm)


def pad_mode(b, x: V, pads, mode):
    """reflect / replicate / circular padding from slices and a concat per axis."""
    if mode in ("constant", "zeros"):
        return pad_const(b, x, pads)
    for axis, (lo, hi) in enumerate(pads):
        if not (lo or hi):
            continue
        n = x.shape[axis]
        if mode == "reflect":
            left = [abs(i) for i in range(lo, 0, -1)]
            right = [n - 2 - i for i in range(hi)]
        elif mode == "replicate":
            left, right = [0] * lo, [n - 1] * hi
        elif mode == "circular":
            left, right = [(i % n) for i in range(-lo, 0)], [i % n for i in range(hi)]
        else:
            raise UnsupportedError(f"padding mode {mode!r} (Kiln imports zeros, reflect, replicate, circular)")
        if min(left + right, default=0) < 0 or max(left + right, default=0) >= n:
            raise UnsupportedError(f"{mode} padding of {lo}/{hi} needs more than the axis size {n}")
        parts = [slice_(b, x, axis, i, i + 1) for i in left] + [x] + [slice_(b, x, axis, i, i + 1) for i in right]
        x = concat(b, parts, axis)
    return x
