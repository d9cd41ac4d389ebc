"""The NumPy-like functional API. Each function appends one node (or a few, for sugar built from
primitives) to the graph its operands belong to."""
from __future__ import annotations

import builtins
import contextlib
import math
import threading

import numpy as np

from .errors import ShapeError, TraceError
from .lstm_state import carry_state
from .tensor import Tensor, as_tensor, constant, current_graph, user_location  # noqa: F401


def _graph_of(args):
    for a in args:
        if isinstance(a, Tensor):
            return a.graph
    return current_graph()


_eager = threading.local()


@contextlib.contextmanager
def eager():
    """Run Kiln functions and Modules on NumPy arrays at once, op by op, without tracing (for
    debugging: print and inspect intermediate arrays). Each op computes with its NumPy reference,
    the same rule the executor runs; inside ``kiln.trace`` tracing wins."""
    prev = getattr(_eager, "on", False)
    _eager.on = True
    try:
        yield
    finally:
        _eager.on = prev


def eager_active():
    """Whether ops run eagerly now (inside ``eager()`` and not tracing)."""
    return getattr(_eager, "on", False) and current_graph() is None


def _eager_emit(op, inputs, attrs):
    from .module import Parameter
    from .registry import get_op
    arrays = [a.data if isinstance(a, Parameter) else a for a in inputs]
    like = next((np.asarray(a).dtype for a in arrays if isinstance(a, np.ndarray)), np.dtype("float32"))
    arrays = [np.asarray(a, like) if not isinstance(a, np.ndarray) else a for a in arrays]
    opdef = get_op(op)
    return np.asarray(opdef.rule("ref")(arrays, opdef.normalize_attrs(attrs, f"{op}: ")))


def emit(op, inputs, **attrs) -> Tensor:
    """Append node ``op(inputs; attrs)`` and return its value. Scalars and arrays become constants
    of the dtype of the first tensor operand. In ``eager()`` mode, outside tracing, compute it."""
    g = _graph_of(inputs)
    if g is None and eager_active():
        return _eager_emit(op, inputs, attrs)
    if g is None:
        raise TraceError(f"{op}: no graph is being built (call it inside kiln.trace, or run eagerly inside "
                         f"kiln.eager())")
    like = next((a for a in inputs if isinstance(a, Tensor)), None)
    ts = [as_tensor(a, like=like, graph=g) for a in inputs]
    return Tensor(g, g.add_node(op, [t.name for t in ts], attrs))


def _bin(op):
    def f(a, b):
        return emit(op, [a, b])
    f.__name__ = op
    return f


add, sub, mul, div = _bin("add"), _bin("sub"), _bin("mul"), _bin("div")
maximum, minimum = _bin("maximum"), _bin("minimum")
equal, not_equal, less, less_equal = _bin("equal"), _bin("not_equal"), _bin("less"), _bin("less_equal")
greater, greater_equal = _bin("greater"), _bin("greater_equal")
logical_and, logical_or = _bin("logical_and"), _bin("logical_or")


def _un(op):
    def f(x):
        return emit(op, [x])
    f.__name__ = op
    return f


neg, exp, log, sqrt, tanh, sigmoid = _un("neg"), _un("exp"), _un("log"), _un("sqrt"), _un("tanh"), _un("sigmoid")
relu, relu6, logical_not = _un("relu"), _un("relu6"), _un("logical_not")


def pow(x, exponent):
    if isinstance(exponent, Tensor):
        raise TraceError(f"pow at {user_location()}: the exponent must be a Python number (pow by a constant)")
    return emit("pow", [x], exponent=float(exponent))


def where(cond, a, b):
    g = _graph_of([cond, a, b])
    like = next((t for t in (a, b) if isinstance(t, Tensor)), None)
    if like is None:
        raise TraceError(f"where at {user_location()}: a or b must be a traced tensor")
    a, b = as_tensor(a, like=like, graph=g), as_tensor(b, like=like, graph=g)
    return emit("where", [cond, a, b])


def cast(x, dtype):
    dtype = np.dtype(dtype).name if dtype != "bfloat16" else dtype
    if isinstance(x, Tensor) and x.dtype == dtype:
        return x
    return emit("cast", [x], dtype=dtype)


def abs(x):
    """|x| (the ``abs`` op, TFLite ABS): the gradient at 0 is 0, as torch.abs (sign(0) = 0)."""
    return emit("abs", [x])


def square(x):
    """x * x."""
    return x * x


# ---- reductions -----------------------------------------------------------------------------
def _axes(axis):
    if axis is None:
        return None
    return [axis] if isinstance(axis, int) else list(axis)


def reduce(op, x, axis=None, keepdims=False):
    """Emit reduction op ``op`` (sum, mean, max) over ``axis`` (an int, a list, or None: all)."""
    return emit(op, [x], axes=_axes(axis), keepdims=bool(keepdims))


def sum(x, axis=None, keepdims=False):
    return reduce("sum", x, axis, keepdims)


def mean(x, axis=None, keepdims=False):
    return reduce("mean", x, axis, keepdims)


def max(x, axis=None, keepdims=False):
    return reduce("max", x, axis, keepdims)


def softmax(x, axis=-1):
    return emit("softmax", [x], axis=axis)


def log_softmax(x, axis=-1):
    return emit("log_softmax", [x], axis=axis)


# ---- shapes ---------------------------------------------------------------------------------
def reshape(x, shape):
    shape = [int(s) for s in shape]
    if isinstance(x, np.ndarray) and eager_active():
        return x.reshape(shape)
    if isinstance(x, Tensor) and shape.count(-1) == 1 and x.size:
        rest = math.prod(s for s in shape if s != -1)
        if rest and x.size % rest == 0:
            shape[shape.index(-1)] = x.size // rest     # resolve -1 so a no-op reshape emits nothing
    if isinstance(x, Tensor) and list(x.shape) == shape:
        return x
    return emit("reshape", [x], shape=shape)


def transpose(x, perm=None):
    return emit("transpose", [x], perm=None if perm is None else [int(p) for p in perm])


def swap_last(x):
    """Transpose the last two axes."""
    perm = list(range(x.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return transpose(x, perm)


def concat(xs, axis=0):
    return emit("concat", list(xs), axis=axis)


def pad(x, pads, value=0.0):
    """pads: flat [lo0, hi0, lo1, hi1, ...] or a list of (lo, hi) pairs, one per axis."""
    if pads and isinstance(pads[0], (tuple, list)):
        pads = [int(v) for p in pads for v in p]
    return emit("pad", [x], pads=[int(p) for p in pads], value=float(value))


def slice(x, begin, end, strides=None):
    return emit("slice", [x], begin=[int(b) for b in begin], end=[int(e) for e in end],
                strides=None if strides is None else [int(s) for s in strides])


def slice_grad(g, shape, attrs):
    return emit("slice_grad", [g], shape=list(shape), begin=attrs["begin"], end=attrs["end"],
                strides=attrs["strides"])


def broadcast_to(x, shape):
    shape = [int(s) for s in shape]
    if isinstance(x, Tensor) and list(x.shape) == shape:
        return x
    return emit("broadcast_to", [x], shape=shape)


def unbroadcast(g, shape):
    """Sum a broadcast gradient back to ``shape`` (NumPy broadcasting undone)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    nlead = g.ndim - len(shape)
    axes = list(range(nlead)) + [nlead + i for i, s in enumerate(shape) if s == 1 and g.shape[nlead + i] != 1]
    if axes:
        g = sum(g, axes)
    return reshape(g, shape)


def getitem(x, idx):
    """Basic indexing with ints and slices (positive steps); ints drop their axis."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if any(i is Ellipsis for i in idx):
        k = idx.index(Ellipsis)
        idx = idx[:k] + (np.s_[:],) * (x.ndim - len(idx) + 1) + idx[k + 1:]
    begin, end, strides, drop = [], [], [], []
    for ax in range(x.ndim):
        i = idx[ax] if ax < len(idx) else np.s_[:]
        n = x.shape[ax]
        if isinstance(i, Tensor):
            raise TraceError(f"use as an index of traced value {i.name!r} at {user_location()}: the index is not "
                             f"known while tracing; use a static index or kiln.where")
        if isinstance(i, (int, np.integer)):
            i = int(i) + (n if i < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"index {idx[ax]} out of range for axis {ax} of size {n}")
            begin.append(i), end.append(i + 1), strides.append(1), drop.append(ax)
        elif isinstance(i, type(np.s_[:])):
            b, e, s = i.indices(n)
            if s <= 0:
                raise TraceError(f"negative slice steps are not supported (at {user_location()})")
            begin.append(b), end.append(builtins.max(b, e)), strides.append(s)
        else:
            raise TraceError(f"unsupported index {i!r} at {user_location()}: use ints, slices and ...")
    y = slice(x, begin, end, strides)
    if drop:
        y = reshape(y, [s for a, s in enumerate(y.shape) if a not in drop])
    return y


# ---- linear / window ops --------------------------------------------------------------------
def matmul(a, b):
    return emit("matmul", [a, b])


def dense(x, w, b=None, activation="none"):
    return emit("dense", [x, w] + ([b] if b is not None else []), activation=activation)


def _pair(v):
    return [int(v), int(v)] if isinstance(v, (int, np.integer)) else [int(t) for t in v]


def _padding(p):
    if isinstance(p, str):
        return p
    if isinstance(p, (int, np.integer)):
        return [int(p)] * 4
    p = [int(v) for v in p]
    if len(p) == 2:
        return [p[0], p[0], p[1], p[1]]
    return p


def conv2d(x, w, b=None, stride=1, padding="valid", dilation=1, groups=1, activation="none"):
    return emit("conv2d", [x, w] + ([b] if b is not None else []), stride=_pair(stride),
                padding=_padding(padding), dilation=_pair(dilation), groups=int(groups), activation=activation)


def conv1d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, activation="none"):
    """1-D convolution of x [N, L, C] (channels last) with w [O, K, C / groups]: a conv2d with a
    (K, 1) kernel. ``padding``: an int (both ends, as PyTorch), (lo, hi), 'same' or 'valid'."""
    n, length, c = x.shape
    k = w.shape[1]
    pad = padding if isinstance(padding, str) else (
        [int(padding)] * 2 if isinstance(padding, (int, np.integer)) else [int(p) for p in padding])
    pad = pad if isinstance(pad, str) else pad + [0, 0]
    w4 = reshape(w, (w.shape[0], k, 1, w.shape[2]))
    y = conv2d(reshape(x, (n, length, 1, c)), w4, b, (int(stride), 1), pad, (int(dilation), 1), groups, activation)
    return reshape(y, (n, y.shape[1], y.shape[3]))


def conv2d_grad_input(gy, w, input_shape, stride, padding, dilation, groups):
    return emit("conv2d_grad_input", [gy, w], stride=stride, padding=padding, dilation=dilation,
                groups=groups, input_shape=list(input_shape))


def conv2d_grad_weight(x, gy, weight_shape, stride, padding, dilation, groups):
    return emit("conv2d_grad_weight", [x, gy], stride=stride, padding=padding, dilation=dilation,
                groups=groups, weight_shape=list(weight_shape))


def avg_pool2d(x, pool=2, stride=None, padding="valid", count_include_pad=False):
    return emit("avg_pool2d", [x], pool=_pair(pool), stride=None if stride is None else _pair(stride),
                padding=_padding(padding), count_include_pad=count_include_pad)


def avg_pool2d_grad(gy, input_shape, pool, stride, padding, count_include_pad=False):
    return emit("avg_pool2d_grad", [gy], pool=pool, stride=stride, padding=padding,
                count_include_pad=count_include_pad, input_shape=list(input_shape))


def max_pool2d(x, pool=2, stride=None, padding="valid"):
    return emit("max_pool2d", [x], pool=_pair(pool), stride=None if stride is None else _pair(stride),
                padding=_padding(padding))


def max_pool2d_grad(x, gy, pool, stride, padding):
    return emit("max_pool2d_grad", [x, gy], pool=pool, stride=stride, padding=padding)


def max_pool2d_gather(x, g, pool, stride, padding):
    return emit("max_pool2d_gather", [x, g], pool=pool, stride=stride, padding=padding)


def dropout(x, key, rate=0.5, salt=0):
    return emit("dropout", [x, key], rate=float(rate), salt=int(salt))


# ---- TFLite's element-wise and activation family (frontend/ops/activations.py) ---------------
rsqrt, sin, cos, elu, hard_swish = _un("rsqrt"), _un("sin"), _un("cos"), _un("elu"), _un("hard_swish")
floor, ceil = _un("floor"), _un("ceil")
squared_difference, prelu = _bin("squared_difference"), _bin("prelu")
floor_div, floor_mod = _bin("floor_div"), _bin("floor_mod")


def round(x):  # noqa: A001  (torch.round: half to even)
    return emit("round", [x])


def leaky_relu(x, alpha=0.2):
    """x if x > 0 else alpha * x (TFLite LEAKY_RELU; torch's negative_slope)."""
    return emit("leaky_relu", [x], alpha=float(alpha))


def add_n(xs):
    """x0 + x1 + ... of same-shaped tensors (TFLite ADD_N)."""
    return emit("add_n", list(xs))

# ---- recurrent (frontend/ops/recurrent.py) --------------------------------------------------
def lstm(x, w_x, w_h, b, h0, c0, time_major=False, cell_clip=0.0, stateful=False):
    """One-layer LSTM over a sequence (TFLite's UNIDIRECTIONAL_SEQUENCE_LSTM). ``w_x``, ``w_h``,
    ``b``: the input weights [H, I], recurrent weights [H, H] and biases [H] of the gates, each a
    list in the order input, forget, cell, output; ``h0``, ``c0`` [N, H]. Returns every step's
    hidden state, [N, T, H] ([T, N, H] when ``time_major``). ``stateful``: ``h0`` and ``c0``
    (arrays: their reset values) become graph states (``graph.states``) that each run leaves at its
    last step's hidden and cell state for the next run (a streaming LSTM, TFLite's variable
    tensors); call it inside kiln.trace."""
    if not (len(w_x) == len(w_h) == len(b) == 4):
        raise TraceError("lstm: w_x, w_h and b are lists of the 4 gates' tensors (input, forget, cell, output)")
    if not stateful:
        return emit("lstm", [x, *w_x, *w_h, *b, h0, c0], time_major=bool(time_major), cell_clip=float(cell_clip))
    g = _graph_of([x])
    if g is None or not all(isinstance(v, np.ndarray) for v in (h0, c0)):
        raise TraceError("lstm(stateful=True): a stateful op; call it inside kiln.trace with h0 and c0 as arrays "
                         "(the states' reset values)")
    hs = [Tensor(g, g.add_const(g.fresh(s), np.asarray(v, np.float32))) for s, v in (("lstm_h", h0), ("lstm_c", c0))]
    y = emit("lstm", [x, *w_x, *w_h, *b, *hs], time_major=bool(time_major), cell_clip=float(cell_clip))
    try:
        carry_state(g, y.name)
    except ShapeError as e:
        raise TraceError(f"lstm(stateful=True): {e}") from None
    return y


def l2_pool2d(x, pool=2, stride=None, padding="valid", activation="none"):
    """TFLite's L2_POOL_2D on NHWC: sqrt of the mean of squares over each window's in-image taps."""
    return emit("l2_pool2d", [x], pool=_pair(pool), stride=None if stride is None else _pair(stride),
                padding=_padding(padding), activation=activation)


def transpose_conv2d(x, w, output_shape, b=None, stride=1, padding="same", activation="none"):
    """TFLite's TRANSPOSE_CONV on NHWC: x [N, h, w, C_in], w [C_out, KH, KW, C_in], optional bias
    [C_out]; ``output_shape`` [N, H, W, C_out] is the size whose ``padding`` conv gives x's."""
    return emit("transpose_conv2d", [x, w] + ([b] if b is not None else []), output_shape=[int(v) for v in output_shape],
                stride=_pair(stride), padding=padding, activation=activation)

# ---- data movement and reductions (frontend/ops: gather.py, resize.py, reductions.py) -------
def min(x, axis=None, keepdims=False):
    return reduce("min", x, axis, keepdims)


def gather(x, indices, axis=0):
    """``np.take(x, indices, axis)``: ``indices`` an int32 tensor or array (TFLite GATHER)."""
    if not isinstance(indices, Tensor):
        indices = np.asarray(indices, np.int32)
    return emit("gather", [x, indices], axis=int(axis))


def resize(x, size, mode="nearest", align_corners=False, half_pixel_centers=False):
    """Resize an NHWC image to ``size = (height, width)``: mode 'nearest' or 'bilinear', with
    TFLite's align_corners / half_pixel_centers (RESIZE_NEAREST_NEIGHBOR, RESIZE_BILINEAR)."""
    return emit("resize", [x], size=[int(s) for s in size], mode=mode, align_corners=bool(align_corners),
                half_pixel_centers=bool(half_pixel_centers))


def argmax(x, axis=-1, dtype="int32"):
    """Index of the first largest value along ``axis`` (TFLite ARG_MAX)."""
    return emit("argmax", [x], axis=int(axis), dtype=dtype)


def argmin(x, axis=-1, dtype="int32"):
    """Index of the first smallest value along ``axis`` (TFLite ARG_MIN)."""
    return emit("argmin", [x], axis=int(axis), dtype=dtype)


def cumsum(x, axis=0, exclusive=False, reverse=False):
    """Cumulative sum along ``axis`` (TFLite CUMSUM)."""
    return emit("cumsum", [x], axis=int(axis), exclusive=bool(exclusive), reverse=bool(reverse))


def l2_normalize(x):
    """x / max(||x||, 1e-6) along the last axis (TFLite L2_NORMALIZATION)."""
    return emit("l2_normalize", [x])


def _start(start):
    return start if isinstance(start, Tensor) else np.asarray(start, np.int32)


def dynamic_update_slice(x, update, start):
    """``x`` with ``update`` written at ``start`` (int32, may be a run-time tensor), clamped into
    ``x`` (TFLite DYNAMIC_UPDATE_SLICE)."""
    if not isinstance(update, Tensor):
        update = np.asarray(update)
    if not isinstance(x, Tensor):
        x = np.asarray(x)
    return emit("dynamic_update_slice", [x, update, _start(start)])


def dynamic_slice(x, start, size):
    """The block of ``size`` at ``start`` (int32, may be a run-time tensor), clamped into ``x``."""
    return emit("dynamic_slice", [x, _start(start)], size=[int(n) for n in size])


def reduce_all(x, axes=None, keepdims=False):
    """Logical AND of a bool tensor over ``axes`` (TFLite REDUCE_ALL)."""
    return emit("reduce_all", [x], axes=None if axes is None else [int(a) for a in np.atleast_1d(axes)],
                keepdims=bool(keepdims))



# ---- SVDF (frontend/ops/svdf.py) ---------------------------------------------------------------
def svdf(x, weights_feature, weights_time, bias, rank=1, activation="none"):
    """TFLite's SVDF over x [B, I]: ``weights_feature`` [F, I], ``weights_time`` [F, memory],
    ``bias`` [F / rank]. A stateful op: the activation state [B, F * memory] (zeros at first) is a
    graph state (``graph.states``) that each run shifts one step and the next run reads; run a
    stream with ``run_stateful`` or a compiled package."""
    g = _graph_of([x])
    if g is None:
        raise TraceError("svdf: a stateful op; call it inside kiln.trace (its state lives in the traced graph)")
    wf, wt = (as_tensor(a, like=x, graph=g) for a in (weights_feature, weights_time))
    state = Tensor(g, g.add_const(g.fresh("svdf_state"), np.zeros((x.shape[0], wt.shape[0] * wt.shape[1]),
                                                                    np.float32)))
    new = emit("svdf_state", [x, wf, state])
    g.states[state.name] = new.name
    return emit("svdf", [new, wt, bias], rank=int(rank), activation=activation)
