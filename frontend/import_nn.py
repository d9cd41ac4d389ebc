"""Layer blocks of the importers: convolution (1-D as 2-D with a (k, 1) kernel), linear/matmul,
batch normalisation, pooling, adaptive pooling, reductions, nearest upsampling, LSTM and GRU.

Weights are re-laid out once, at import: conv OIHW -> OHWI (OIK -> OK1I for 1-D), a Linear's
columns permuted when it reads a flattened NHWC value; the re-laid-out tensor keeps the
framework's parameter name (docs/import.md lists the layouts).
"""
from __future__ import annotations

import hashlib

import numpy as np

from . import import_blocks as B
from .import_blocks import UnsupportedError
from .import_layout import Builder, Layout, V, channels_last, linear_columns


def pad_pairs(pads, nsp):
    """[(lo, hi)] per spatial axis from an int, nsp ints (symmetric, torch), 2*nsp ints (ONNX:
    all begins, then all ends) or pairs."""
    if isinstance(pads, (int, np.integer)):
        return [(int(pads), int(pads))] * nsp
    pads = list(pads)
    if pads and isinstance(pads[0], (tuple, list)):
        return [(int(lo), int(hi)) for lo, hi in pads]
    p = [int(v) for v in pads] or [0]
    p = p * nsp if len(p) == 1 else p
    if len(p) == nsp:
        return [(q, q) for q in p]
    if len(p) == 2 * nsp:
        return [(p[i], p[i + nsp]) for i in range(nsp)]
    raise UnsupportedError(f"padding {pads} for {nsp} spatial axes")


def _ints(v, n):
    v = [int(v)] * n if isinstance(v, (int, np.integer)) else [int(t) for t in v]
    return v * n if len(v) == 1 else v


def same_pads(size, k, s, d, lower=False):
    """(lo, hi) of 'same' padding (output = ceil(size / s)); the odd pixel goes to hi (torch,
    ONNX SAME_UPPER) or to lo (SAME_LOWER)."""
    out = -(-size // s)
    total = max((out - 1) * s + d * (k - 1) + 1 - size, 0)
    lo = total // 2 if not lower else total - total // 2
    return lo, total - lo


# ---- convolution ---------------------------------------------------------------------------------
def conv(b: Builder, x: V, w: V, bias: V | None, stride=1, pads=0, dilation=1, groups=1, padding_mode="zeros"):
    """torch/ONNX convolution: x [N, C, *S] (1 or 2 spatial axes), w [O, C/groups, *K]; pads
    [(lo, hi)] per spatial axis, or 'same' / 'valid'."""
    nsp = x.rank - 2
    if nsp not in (1, 2):
        raise UnsupportedError(f"{nsp}-D convolution (Kiln imports Conv1d and Conv2d)")
    W = b.array_of(w, "the convolution weight")
    ks = list(W.shape[2:])
    stride, dilation = _ints(stride, nsp), _ints(dilation, nsp)
    if isinstance(pads, str):
        pads = ([same_pads(x.shape[2 + i], ks[i], stride[i], dilation[i]) for i in range(nsp)]
                if pads == "same" else [(0, 0)] * nsp)
    else:
        pads = pad_pairs(pads, nsp)
    if padding_mode not in ("zeros", "constant") and any(lo or hi for lo, hi in pads):
        x = B.pad_mode(b, x, [(0, 0), (0, 0)] + list(pads), padding_mode)
        pads = [(0, 0)] * nsp
    P = b.physical(x, channels_last(x.rank))
    if nsp == 1:
        N, L, C = b.g.types[P].shape
        P = b.reshape(P, [N, L, 1, C])
        wk = np.transpose(W, (0, 2, 1))[:, :, None, :]
        stride, dilation, pads = stride + [1], dilation + [1], list(pads) + [(0, 0)]
    else:
        wk = np.transpose(W, (0, 2, 3, 1))
    ins = [P, b.tensor(w, wk, key="ohwi")]
    if bias is not None:
        ins.append(b.tensor(bias))
    padding = [int(v) for lo_hi in pads for v in lo_hi]
    y = b.emit("conv2d", ins, {"stride": stride, "padding": padding, "dilation": dilation, "groups": int(groups)},
               hint="conv")
    if nsp == 1:        # [N, L, 1, O] read as [N, O, L]: no reshape until a consumer needs one
        n, l2, _, o = b.g.types[y].shape
        return V(y, Layout.permuted((n, l2, 1, o), (0, 3, 1, 2)).reshaped((n, o, l2)))
    return b.wrap(y, channels_last(x.rank))


# ---- linear --------------------------------------------------------------------------------------
def linear(b: Builder, x: V, w: V, bias: V | None = None, w_transposed=False):
    """x @ w.T + bias over the last axis (``w_transposed``: w is [K, O], as ONNX MatMul/Gemm)."""
    if not w.is_const:
        wt = w if w_transposed else B.permute(b, w, (1, 0))
        y = V(b.emit("matmul", [b.plain(x), b.plain(wt)], hint="matmul"), None)
        y = b.wrap(y.name)
        return B.binary(b, "add", y, bias) if bias is not None else y
    W = np.asarray(w.array)
    W = W.T if w_transposed else W
    key = "T" if w_transposed else "as_is"
    lay = None if x.is_const else x.lay
    if lay is not None and lay.pure and not lay.identity and lay.perm[-1] == x.rank - 1:
        # the last axis stays last physically: dense on the physical value, same layout
        ins = [b.reshape(x.name, lay.pre), b.tensor(w, W, key=key)]
        y = b.wrap(b.emit("dense", ins, hint="dense"), lay.perm)
        return B.binary(b, "add", y, bias) if bias is not None else y
    name, cols = linear_columns(b, x)
    if cols is not None:
        W = W[:, cols]
        key = (key, "cols", hashlib.sha1(np.ascontiguousarray(cols).tobytes()).hexdigest())
    ins = [name, b.tensor(w, W, key=key)]
    if bias is not None:
        if bias.is_const and bias.array.shape == (W.shape[0],):
            ins.append(b.tensor(bias))
        else:
            y = b.wrap(b.emit("dense", ins, hint="dense"))
            return B.binary(b, "add", y, bias)
    return b.wrap(b.emit("dense", ins, hint="dense"))


def matmul(b: Builder, x: V, y: V):
    if y.is_const and y.rank == 2 and x.rank >= 1:
        return linear(b, x, y, None, w_transposed=True)
    if x.rank < 2 or y.rank < 2:
        raise UnsupportedError(f"matmul of shapes {x.shape} and {y.shape} (Kiln's matmul takes rank >= 2)")
    return b.wrap(b.emit("matmul", [b.plain(x), b.plain(y)], hint="matmul"))


# ---- normalisation -------------------------------------------------------------------------------
def batch_norm(b: Builder, x: V, weight: V | None, bias: V | None, mean: V, var: V, eps=1e-5, momentum=0.1):
    """Eval-mode batch normalisation over axis 1: ``x * scale + (bias - mean * scale)`` with
    ``scale = weight / sqrt(var + eps)``, computed in the graph from the parameters and the
    running-statistics buffers (what kiln quantize folds into the preceding conv or dense)."""
    C = x.shape[1]
    perm = channels_last(x.rank)
    lay = None if x.is_const else x.lay
    if lay is not None and lay.pure and lay.perm[1] == len(lay.pre) - 1 and b.g.types[x.name].shape[-1] == C:
        P, perm = x.name, None      # channels already last physically (a conv's output): no reshape
    else:
        P = b.physical(x, perm)
    g = b.g
    var_n, mean_n = b.tensor(var), b.tensor(mean)
    std = b.emit("sqrt", [b.emit("add", [var_n, b.tensor(B.scalar(b, eps, var))], hint="bn_var_eps")],
                 hint="bn_std")
    inv = b.emit("div", [b.tensor(B.scalar(b, 1.0, var)), std], hint="bn_inv")
    scale = b.emit("mul", [inv, b.tensor(weight)], hint="bn_scale") if weight is not None else inv
    shift = b.emit("mul", [mean_n, scale], hint="bn_mean_scale")
    shift = (b.emit("sub", [b.tensor(bias), shift], hint="bn_shift") if bias is not None
             else b.emit("neg", [shift], hint="bn_shift"))
    y = b.emit("add", [b.emit("mul", [P, scale], hint="bn_mul"), shift], hint="bn")
    g.meta.setdefault("batchnorm", []).append({
        "input": P, "output": y, "channels": int(C), "eps": float(eps), "momentum": float(momentum),
        "weight": g.producer(scale).inputs[1] if weight is not None else None,
        "bias": b.tensor(bias) if bias is not None else None, "running_mean": mean_n, "running_var": var_n})
    return V(y, lay) if perm is None else b.wrap(y, perm)


# ---- pooling -------------------------------------------------------------------------------------
def _ceil_extra(size, k, s, lo, hi, d=1):
    """Extra high padding of ceil_mode (torch: the last window starts inside the input or the
    low padding)."""
    span = size + lo + hi - d * (k - 1) - 1
    out = -(-span // s) + 1
    if (out - 1) * s >= size + lo:
        out -= 1
    return max((out - 1) * s + d * (k - 1) + 1 - (size + lo + hi), 0)


def pool(b: Builder, kind, x: V, kernel, stride=None, pads=0, ceil_mode=False, count_include_pad=True,
         dilation=1):
    """max/avg pooling over the 1 or 2 spatial axes of x [N, C, *S]."""
    nsp = x.rank - 2
    if nsp not in (1, 2):
        raise UnsupportedError(f"{nsp}-D pooling (Kiln imports 1-D and 2-D pooling)")
    k = _ints(kernel, nsp)
    s = _ints(stride, nsp) if stride not in (None, [], ()) else list(k)
    if any(d != 1 for d in _ints(dilation, nsp)):
        raise UnsupportedError("dilated pooling")
    pads = pad_pairs(pads, nsp)
    if kind == "avg" and count_include_pad and any(lo or hi for lo, hi in pads):
        x = B.pad_const(b, x, [(0, 0), (0, 0)] + list(pads))
        pads = [(0, 0)] * nsp
    sizes = x.shape[2:]
    if ceil_mode:
        pads = [(lo, hi + _ceil_extra(sizes[i], k[i], s[i], lo, hi)) for i, (lo, hi) in enumerate(pads)]
    P = b.physical(x, channels_last(x.rank))
    if nsp == 1:
        N, L, C = b.g.types[P].shape
        P = b.reshape(P, [N, L, 1, C])
        k, s, pads = k + [1], s + [1], list(pads) + [(0, 0)]
    attrs = {"pool": k, "stride": s, "padding": [int(v) for lh in pads for v in lh]}
    y = b.emit("max_pool2d" if kind == "max" else "avg_pool2d", [P], attrs, hint=f"{kind}pool")
    if nsp == 1:
        n, l2, _, c = b.g.types[y].shape
        return V(y, Layout.permuted((n, l2, 1, c), (0, 3, 1, 2)).reshaped((n, c, l2)))
    return b.wrap(y, channels_last(x.rank))


def adaptive_pool(b: Builder, kind, x: V, out_size):
    nsp = x.rank - 2
    sizes = list(x.shape[2:])
    out = [sizes[i] if o is None else int(o) for i, o in enumerate(_ints(out_size, nsp) if out_size is not None
                                                                      else [None] * nsp)]
    if all(o == 1 for o in out):
        return reduce(b, "mean" if kind == "avg" else "max", x, list(range(2, x.rank)), keepdims=True)
    if any(sz % o for sz, o in zip(sizes, out)):
        raise UnsupportedError(f"adaptive {kind} pooling from {sizes} to {out}: Kiln imports output sizes that "
                               f"divide the input")
    k = [sz // o for sz, o in zip(sizes, out)]
    return pool(b, kind, x, k, k, 0, count_include_pad=False)


def reduce(b: Builder, op, x: V, axes, keepdims=False):
    r = x.rank
    axes = sorted({int(a) % r for a in (range(r) if axes is None else axes)})
    name, perm = b.as_pure(x)
    phys_axes = sorted(perm[a] for a in axes)
    y = b.emit(op, [name], {"axes": phys_axes, "keepdims": bool(keepdims)}, hint=op)
    if keepdims:
        return b.wrap(y, perm)
    rem = [perm[i] for i in range(r) if i not in axes]
    order = sorted(rem)
    return b.wrap(y, [order.index(p) for p in rem])


def upsample_nearest(b: Builder, x: V, scales):
    sc = [float(s) for s in scales]
    if any(s != int(s) or s < 1 for s in sc):
        raise UnsupportedError(f"nearest upsampling by {scales}: Kiln imports whole-number scale factors")
    P = b.physical(x, channels_last(x.rank))
    for i, s in enumerate(int(v) for v in sc):
        if s == 1:
            continue
        shape = list(b.g.types[P].shape)
        ax = 1 + i
        Q = b.reshape(P, shape[:ax + 1] + [1] + shape[ax + 1:])
        Q = b.emit("concat", [Q] * s, {"axis": ax + 1}, hint="upsample")
        shape[ax] *= s
        P = b.reshape(Q, shape)
    return b.wrap(P, channels_last(x.rank))
