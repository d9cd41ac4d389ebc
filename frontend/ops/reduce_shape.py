"""Reductions (sum, mean, max over axes, keepdims), softmax/log_softmax, and data-movement ops.

The ``te`` rules (float lowerings, ``frontend/ops/te_helpers.py``) of sum, mean and softmax accumulate
in float32 when the storage dtype is 16-bit; data movement is dtype-agnostic.
"""
import math

import numpy as np

from .. import fixedpoint as fp
from .. import functional as F
from .. import tflite_checks as chk
from ..errors import ShapeError
from ..limits import check as check_limit
from ..registry import (
    INT16,
    QUANTIZABLE,
    REDUCTION,
    SAME_AS_INPUT,
    SHAPE,
    Attr,
    Quant,
    defrule,
    get_op,
    mark,
    register,
)
from ..types import TensorType
from . import tflite_util as tfl
from ._util import need_float, norm_axes, reduced_shape, tt
from .int8util import clamp8, f32, int8_io, need_int8, per_tensor, same_quant
from .int16util import clamp16, int16_io, is_int16, need_int16, softmax16_rows

_RED = {"axes": Attr("ints", None), "keepdims": Attr("bool", False)}


def _red_infer(name):
    def infer(ts, a):
        axes = norm_axes(a["axes"], ts[0].ndim, name)
        return tt(reduced_shape(ts[0].shape, axes, a["keepdims"]), ts[0].dtype)
    return infer


def _axes(a, x):
    return norm_axes(a["axes"], x.ndim)


def _expand_back(g, x, attrs):
    """Reshape a reduced gradient to keepdims form and broadcast it back to x's shape."""
    axes = norm_axes(attrs["axes"], x.ndim)
    g = F.reshape(g, reduced_shape(x.shape, axes, True))
    return F.broadcast_to(g, x.shape)


def _acc_dtype(x):
    """The accumulator of a float sum or mean: float64, rounded once to the input's dtype at the
    end. NumPy adds float32 values in float32 and, over axes that are not the innermost, one slice
    at a time (no pairwise summation): a BatchNorm statistic or a weight gradient over 147,456
    values then loses ~2^-24 x 147,456 of its scale, which made the float32 reference of
    mobilenet-v1-0.25's training step 6.1% off float64 (1.1% with float64 sums)."""
    return np.float64 if x.dtype.kind == "f" and x.dtype.itemsize < 8 else None


def _sum_ref(xs, a):
    x = xs[0]
    return np.sum(x, axis=_axes(a, x), keepdims=a["keepdims"], dtype=_acc_dtype(x)).astype(x.dtype)


def _mean_ref(xs, a):
    x = xs[0]
    return np.mean(x, axis=_axes(a, x), keepdims=a["keepdims"], dtype=_acc_dtype(x)).astype(x.dtype)


def _max_ref(xs, a):
    return np.max(xs[0], axis=_axes(a, xs[0]), keepdims=a["keepdims"])


def _mean_vjp(n, xs, y, gy):
    x = xs[0]
    count = math.prod(x.shape[i] for i in norm_axes(n.attrs["axes"], x.ndim))
    return [_expand_back(gy, x, n.attrs) * (1.0 / count)]


def _max_vjp(n, xs, y, gy):
    # ties share the gradient equally (as torch.amax does)
    x = xs[0]
    keep = dict(n.attrs, keepdims=True)
    yk = F.broadcast_to(F.reshape(y, reduced_shape(x.shape, norm_axes(n.attrs["axes"], x.ndim), True)), x.shape)
    mask = F.cast(F.equal(x, yk), x.dtype)
    count = F.reduce("sum", mask, keep["axes"], True)
    return [mask * _expand_back(gy, x, n.attrs) / F.broadcast_to(count, x.shape)]


register("sum", attrs=_RED, infer=_red_infer("sum"), ref=_sum_ref,
         vjp=lambda n, xs, y, gy: [_expand_back(gy, xs[0], n.attrs)], props={REDUCTION, QUANTIZABLE}, arity=1,
         doc="sum over axes (None: all)", quant=Quant())
register("mean", attrs=_RED, infer=_red_infer("mean"), ref=_mean_ref, vjp=_mean_vjp,
         props={REDUCTION, QUANTIZABLE}, arity=1, doc="mean over axes (None: all)", quant=Quant())
register("max", attrs=_RED, infer=_red_infer("max"), ref=_max_ref, vjp=_max_vjp, props={REDUCTION, QUANTIZABLE},
         arity=1, doc="max over axes; ties share the gradient equally (torch.amax)", quant=SAME_AS_INPUT)


def _te_reduce(T, x, axes, keepdims, kind, name):
    """(stage, element count): sum (in the accumulation dtype) or max of ``x`` over ``axes``."""
    shape = T.shape(x)
    axes = norm_axes(axes, len(shape), name)
    ad = T.acc_dtype(x.dtype) if kind != "max" else str(x.dtype)
    rax = {ax: T.te.reduce_axis((0, shape[ax]), f"r{ax}") for ax in axes}
    oshape = reduced_shape(shape, axes, keepdims)

    def f(*i):
        it = iter(i)
        idx = []
        for d in range(len(shape)):
            if d in rax:
                idx.append(rax[d])
                if keepdims:
                    next(it)
            else:
                idx.append(next(it))
        v = T.cast(x(*idx), ad)
        r = [rax[d] for d in axes]
        if not r:
            return v
        return T.te.max(v, axis=r) if kind == "max" else T.te.sum(v, axis=r)
    return T.te.compute(oshape, f, name=name), math.prod(shape[d] for d in axes)


@defrule("sum", "te")
def _sum_te(T, xs, a, out):
    return T.to_out(_te_reduce(T, xs[0], a["axes"], a["keepdims"], "sum", "sum")[0], out, "sum_cast")


@defrule("mean", "te")
def _mean_te(T, xs, a, out):
    y, count = _te_reduce(T, xs[0], a["axes"], a["keepdims"], "sum", "mean_sum")
    return T.te.compute(out.shape, lambda *i: T.cast(y(*i) / T.c(count, y.dtype), out.dtype), name="mean")


@defrule("max", "te")
def _max_te(T, xs, a, out):
    return _te_reduce(T, xs[0], a["axes"], a["keepdims"], "max", "max")[0]


# ---- softmax --------------------------------------------------------------------------------
def _sm_infer(ts, a):
    need_float(ts[0], "softmax")
    norm_axes([a["axis"]], ts[0].ndim, "softmax")
    if a.get("out_dtype") is not None:
        if ts[0].dtype != "int8" or ts[0].quant is None:
            raise ShapeError(f"softmax: out_dtype {a['out_dtype']} is for a quantised int8 input, got {ts[0]}")
        return TensorType(ts[0].shape, a["out_dtype"])
    return ts[0]


def _softmax_ref(xs, a):
    x = xs[0]
    e = np.exp(x - np.max(x, axis=a["axis"], keepdims=True))
    return (e / np.sum(e, axis=a["axis"], keepdims=True)).astype(x.dtype)


def _log_softmax_ref(xs, a):
    x = xs[0]
    s = x - np.max(x, axis=a["axis"], keepdims=True)
    return (s - np.log(np.sum(np.exp(s), axis=a["axis"], keepdims=True))).astype(x.dtype)


def _softmax_vjp(n, xs, y, gy):
    ax = n.attrs["axis"]
    s = F.broadcast_to(F.sum(gy * y, ax, keepdims=True), y.shape)
    return [y * (gy - s)]


def _log_softmax_vjp(n, xs, y, gy):
    ax = n.attrs["axis"]
    s = F.broadcast_to(F.sum(gy, ax, keepdims=True), y.shape)
    return [gy - F.exp(y) * s]


# out_dtype "int16": an int8 input with an int16 output (scale 1/65536, zero point -32768), as TFLite allows
register("softmax", attrs={"axis": Attr("int", -1), "out_dtype": Attr("str", None, (None, "int16"))}, infer=_sm_infer, ref=_softmax_ref, vjp=_softmax_vjp,
         props={QUANTIZABLE}, arity=1, doc="softmax along axis (max-subtracted)", quant=Quant("fixed", (1.0 / 256, -128)))
register("log_softmax", attrs={"axis": Attr("int", -1)}, infer=_sm_infer, ref=_log_softmax_ref,
         vjp=_log_softmax_vjp, arity=1, doc="log of softmax along axis (stable)")


def _te_softmax_parts(T, x, axis):
    """The max-subtracted pieces of (log_)softmax: shape, accumulation dtype, the row maximum,
    the row sum of exp(x - max) (both keepdims) and the index map to a row's keepdims entry."""
    shape = T.shape(x)
    ax = axis % len(shape)
    ad = T.acc_dtype(x.dtype)
    m, _ = _te_reduce(T, x, [ax], True, "max", "softmax_max")

    def kidx(i):
        return [0 if d == ax else i[d] for d in range(len(shape))]
    rk = T.te.reduce_axis((0, shape[ax]), "rk")

    def at_k(i):
        return [rk if d == ax else i[d] for d in range(len(shape))]
    s = T.te.compute(m.shape, lambda *i: T.te.sum(T.te.exp(T.cast(x(*at_k(i)), ad) - T.cast(m(*i), ad)), axis=rk),
                     name="softmax_expsum")
    return shape, ad, m, s, kidx


@defrule("softmax", "te")
def _softmax_te(T, xs, a, out):
    x = xs[0]
    shape, ad, m, s, kidx = _te_softmax_parts(T, x, a["axis"])
    return T.te.compute(shape, lambda *i: T.cast(T.te.exp(T.cast(x(*i), ad) - T.cast(m(*kidx(i)), ad)) / s(*kidx(i)),
                                                 out.dtype), name="softmax")


@defrule("log_softmax", "te")
def _log_softmax_te(T, xs, a, out):
    x = xs[0]
    shape, ad, m, s, kidx = _te_softmax_parts(T, x, a["axis"])
    return T.te.compute(shape, lambda *i: T.cast((T.cast(x(*i), ad) - T.cast(m(*kidx(i)), ad)) - T.te.log(s(*kidx(i))),
                                                 out.dtype), name="log_softmax")


# ---- shape ops ------------------------------------------------------------------------------
def resolve_shape(shape, size):
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: at most one -1 allowed, got {shape}")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or size % rest:
            raise ShapeError(f"reshape: cannot infer -1 in {shape} for {size} elements")
        shape[shape.index(-1)] = size // rest
    if math.prod(shape) != size or any(s < 0 for s in shape):
        raise ShapeError(f"reshape: {size} elements cannot take shape {shape}")
    return tuple(shape)


register("reshape", attrs={"shape": Attr("ints", ())},
         infer=lambda ts, a: tt(resolve_shape(a["shape"], ts[0].size), ts[0].dtype, ts[0].quant),
         ref=lambda xs, a: np.reshape(xs[0], resolve_shape(a["shape"], xs[0].size)),
         vjp=lambda n, xs, y, gy: [F.reshape(gy, xs[0].shape)], props={SHAPE, QUANTIZABLE}, arity=1,
         doc="row-major reshape; one -1 is inferred", quant=SAME_AS_INPUT)


@defrule("reshape", "te")
def _reshape_te(T, xs, a, out):
    x = xs[0]
    ishape = T.shape(x)
    oshape = resolve_shape(a["shape"], math.prod(ishape))

    def f(*i):
        flat = 0
        for d, s in zip(i, oshape):
            flat = flat * s + d
        return x(*T.unravel(flat, ishape))
    return T.te.compute(oshape, f, name="reshape")


def _perm(a, ndim):
    p = a["perm"]
    if p is None:
        return tuple(reversed(range(ndim)))
    if sorted(p) != list(range(ndim)):
        raise ShapeError(f"transpose: {p} is not a permutation of {ndim} axes")
    return tuple(p)


register("transpose", attrs={"perm": Attr("ints", None)},
         infer=lambda ts, a: tt([ts[0].shape[i] for i in _perm(a, ts[0].ndim)], ts[0].dtype, ts[0].quant),
         ref=lambda xs, a: np.transpose(xs[0], _perm(a, xs[0].ndim)),
         vjp=lambda n, xs, y, gy: [F.transpose(gy, list(np.argsort(_perm(n.attrs, xs[0].ndim))))],
         props={SHAPE, QUANTIZABLE}, arity=1, doc="permute axes (perm None: reverse)", quant=SAME_AS_INPUT)


@defrule("transpose", "te")
def _transpose_te(T, xs, a, out):
    x = xs[0]
    perm = _perm(a, len(x.shape))

    def f(*i):
        idx = [None] * len(perm)
        for o, p in enumerate(perm):
            idx[p] = i[o]
        return x(*idx)
    return T.te.compute(out.shape, f, name="transpose")


def _concat_infer(ts, a):
    nd = ts[0].ndim
    ax = norm_axes([a["axis"]], nd, "concat")[0]
    for t in ts[1:]:
        if t.ndim != nd or t.dtype != ts[0].dtype or any(t.shape[i] != ts[0].shape[i] for i in range(nd) if i != ax):
            raise ShapeError(f"concat on axis {ax}: incompatible {ts[0]} and {t}")
    shape = list(ts[0].shape)
    shape[ax] = sum(t.shape[ax] for t in ts)
    return tt(shape, ts[0].dtype)


def _concat_vjp(n, xs, y, gy):
    ax = n.attrs["axis"] % y.ndim
    out, off = [], 0
    for x in xs:
        begin = [0] * y.ndim
        end = list(y.shape)
        begin[ax], end[ax] = off, off + x.shape[ax]
        out.append(F.slice(gy, begin, end))
        off += x.shape[ax]
    return out


register("concat", attrs={"axis": Attr("int", 0)}, infer=_concat_infer,
         ref=lambda xs, a: np.concatenate(xs, axis=a["axis"]), vjp=_concat_vjp, props={SHAPE, QUANTIZABLE},
         doc="join along axis (any number of inputs)", quant=Quant(inputs="requantize"))


@defrule("concat", "te")
def _concat_te(T, xs, a, out):
    ax = a["axis"] % len(out.shape)
    offs = np.cumsum([0] + [int(x.shape[ax]) for x in xs]).tolist()

    def f(*i):
        v = None
        for k in reversed(range(len(xs))):   # innermost select: the last operand
            idx = list(i)
            idx[ax] = i[ax] - offs[k]
            val = xs[k](*idx)
            v = val if v is None else T.tirx.if_then_else(i[ax] < offs[k + 1], val, v)
        return v
    return T.te.compute(out.shape, f, name="concat")


def _pads(a, ndim):
    p = a["pads"]
    if len(p) != 2 * ndim or any(v < 0 for v in p):
        raise ShapeError(f"pad: pads must be 2*rank={2 * ndim} non-negative ints [lo0, hi0, lo1, hi1, ...], got {p}")
    return [(p[2 * i], p[2 * i + 1]) for i in range(ndim)]


register("pad", attrs={"pads": Attr("ints", ()), "value": Attr("float", 0.0)},
         infer=lambda ts, a: tt([s + lo + hi for s, (lo, hi) in zip(ts[0].shape, _pads(a, ts[0].ndim))], ts[0].dtype, ts[0].quant),
         ref=lambda xs, a: np.pad(xs[0], _pads(a, xs[0].ndim), constant_values=np.asarray(a["value"]).astype(xs[0].dtype)),
         vjp=lambda n, xs, y, gy: [F.slice(gy, [lo for lo, hi in _pads(n.attrs, y.ndim)],
                                           [lo + s for (lo, hi), s in zip(_pads(n.attrs, y.ndim), xs[0].shape)])],
         props={SHAPE, QUANTIZABLE}, arity=1, doc="constant padding, pads = [lo0, hi0, lo1, hi1, ...]", quant=SAME_AS_INPUT)


@defrule("pad", "te")
def _pad_te(T, xs, a, out):
    x = xs[0]
    p = a["pads"]
    shape = T.shape(x)
    value = T.c(a["value"], x.dtype) if str(x.dtype) != "bool" else T.tirx.const(bool(a["value"]), "bool")

    def f(*i):
        src = [i[d] - p[2 * d] for d in range(len(shape))]
        ok = T.tirx.all(*[T.tirx.all(s >= 0, s < n) for s, n in zip(src, shape)]) if shape else T.tirx.const(True, "bool")
        return T.tirx.if_then_else(ok, x(*src), value)
    return T.te.compute(out.shape, f, name="pad")


def _slice_params(a, shape):
    """Per-axis Python slices of ``slice``'s attributes. An axis takes the indices
    ``range(begin, end, stride)``: a positive stride needs ``0 <= begin <= end <= size``, a
    negative one ``-1 <= end <= begin < size`` (end -1: down to index 0 included)."""
    nd = len(shape)
    b, e = list(a["begin"]), list(a["end"])
    st = list(a["strides"] or [1] * nd)
    if not (len(b) == len(e) == len(st) == nd):
        raise ShapeError(f"slice: begin/end/strides need {nd} entries, got {b}, {e}, {st}")
    out = []
    for i in range(nd):
        if st[i] == 0:
            raise ShapeError(f"slice: strides must be non-zero, got {st}")
        if st[i] > 0 and not (0 <= b[i] <= shape[i] and b[i] <= e[i] <= shape[i]):
            raise ShapeError(f"slice: [{b[i]}:{e[i]}] out of range for axis {i} of size {shape[i]}")
        if st[i] < 0 and not (-1 <= e[i] <= b[i] < shape[i] or (e[i] == b[i] == -1 and shape[i] == 0)):
            raise ShapeError(f"slice: [{b[i]}:{e[i]}:{st[i]}] out of range for axis {i} of size {shape[i]} "
                             f"(a negative stride needs -1 <= end <= begin < size)")
        if not len(range(b[i], e[i], st[i])):
            out.append(slice(0, 0, 1))
        else:
            out.append(slice(b[i], None if e[i] < 0 else e[i], st[i]) if st[i] < 0 else slice(b[i], e[i], st[i]))
    return tuple(out)


def _slice_len(s, n):
    return len(range(*s.indices(n)))


def _slice_infer(ts, a):
    idx = _slice_params(a, ts[0].shape)
    return tt([_slice_len(s, n) for s, n in zip(idx, ts[0].shape)], ts[0].dtype, ts[0].quant)


def _slice_vjp(n, xs, y, gy):
    idx = _slice_params(n.attrs, xs[0].shape)
    if all(s.step == 1 for s in idx):
        pads = []
        for s, d in zip(idx, xs[0].shape):
            pads += [s.start, d - s.stop]
        return [F.pad(gy, pads)]
    return [F.slice_grad(gy, xs[0].shape, n.attrs)]


register("slice", attrs={"begin": Attr("ints", ()), "end": Attr("ints", ()), "strides": Attr("ints", None)},
         infer=_slice_infer, ref=lambda xs, a: xs[0][_slice_params(a, xs[0].shape)].copy(),
         vjp=_slice_vjp, props={SHAPE, QUANTIZABLE}, arity=1, doc="x[begin:end:strides] per axis (a negative stride walks down to end, exclusive; end -1: to index 0)",
         quant=SAME_AS_INPUT)


def _te_slice_spec(a, shape):
    return list(a["begin"]), list(a["strides"] or [1] * len(shape))


@defrule("slice", "te")
def _slice_te(T, xs, a, out):
    x = xs[0]
    b, st = _te_slice_spec(a, T.shape(x))
    return T.te.compute(out.shape, lambda *i: x(*[b[d] + i[d] * st[d] for d in range(len(i))]), name="slice")


def _slice_grad_ref(xs, a):
    out = np.zeros(a["shape"], xs[0].dtype)
    out[_slice_params(a, a["shape"])] = xs[0]
    return out


register("slice_grad",
         attrs={"shape": Attr("ints", ()), "begin": Attr("ints", ()), "end": Attr("ints", ()), "strides": Attr("ints", None)},
         infer=lambda ts, a: tt(a["shape"], ts[0].dtype), ref=_slice_grad_ref,
         vjp=lambda n, xs, y, gy: [F.slice(gy, n.attrs["begin"], n.attrs["end"], n.attrs["strides"])],
         props={SHAPE}, arity=1, doc="scatter a strided slice back into zeros of `shape` (transpose of slice)")


@defrule("slice_grad", "te")
def _slice_grad_te(T, xs, a, out):
    x = xs[0]
    shape = tuple(a["shape"])
    b, st = _te_slice_spec(a, shape)
    n = T.shape(x)

    def f(*i):
        t = [i[d] - b[d] for d in range(len(shape))]
        q = [T.tirx.floordiv(t[d], st[d]) for d in range(len(shape))]
        ok = T.tirx.all(*[T.tirx.all(q[d] >= 0, T.tirx.floormod(t[d], st[d]) == 0, q[d] < n[d])
                          for d in range(len(shape))])
        return T.tirx.if_then_else(ok, x(*q), T.c(0, x.dtype))
    return T.te.compute(out.shape, f, name="slice_grad")


def _bt_infer(ts, a):
    shape = tuple(a["shape"])
    try:
        if np.broadcast_shapes(ts[0].shape, shape) != shape:
            raise ValueError
    except ValueError:
        raise ShapeError(f"broadcast_to: {ts[0].shape} cannot broadcast to {shape}") from None
    return tt(shape, ts[0].dtype)


register("broadcast_to", attrs={"shape": Attr("ints", ())}, infer=_bt_infer,
         ref=lambda xs, a: np.broadcast_to(xs[0], a["shape"]).copy(),
         vjp=lambda n, xs, y, gy: [F.unbroadcast(gy, xs[0].shape)], props={SHAPE}, arity=1,
         doc="NumPy broadcast to shape (materialised)")


@defrule("broadcast_to", "te")
def _broadcast_to_te(T, xs, a, out):
    x = xs[0]
    return T.te.compute(out.shape, lambda *i: T.bidx(x, out.shape, i), name="broadcast_to")


# ---- int8 references: mean and data movement --------------------------------------------------------
# int8 reference rules for pooling, mean and data movement (TFLite reference kernels):
#
# - (pooling: frontend/ops/nn.py) ``avg_pool2d``: sum of the raw values of the in-image taps, divided with rounding half away from
#   zero: ``(sum +- count/2) / count`` (C division); input and output share scale and zero point.
# - ``max_pool2d``, ``reshape``: on the raw int8 values.
# - ``mean``: reference_ops::QuantizedMeanOrSum: raw sum, ``1/count`` folded into the multiplier of
#   ``in_scale / out_scale``.
# - ``pad``: fills with the quantised pad value (the zero point for value 0).
# - ``concat``: TFLite int8 requires every input to share the output's scale and zero point.
# - ``transpose``, ``slice``: on the raw int8 values, quantisation kept (TFLite TRANSPOSE and
#   STRIDED_SLICE); the model importers emit them (an NCHW input's transpose, LSTM gate slices).

@defrule("reshape", "int8_ref")
def reshape_int8(xs, attrs, in_types, out_type):
    return get_op("reshape").ref(xs, attrs)


def mean_params(in_scale, out_scale, count):
    """(multiplier, shift) of reference_ops::QuantizedMeanOrSum with 1/count folded in."""
    m, s = fp.quantize_multiplier(f32(in_scale) / f32(out_scale))
    k = int(count).bit_length() - 1
    k = min(k, 32, 31 + s)
    m = int((m << k) // int(count))
    return m, s - k


@defrule("mean", "int8_ref")
def mean_int8(xs, attrs, in_types, out_type):
    if is_int16(in_types[0]):
        return mean_int16(xs, attrs, in_types, out_type)
    (si, zi), (so, zo) = int8_io(in_types, out_type, "mean")
    x = xs[0].astype(np.int64)
    axes = norm_axes(attrs["axes"], x.ndim, "mean")
    count = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    total = fp.wrap_int32(x.sum(axis=axes, keepdims=attrs["keepdims"]))
    if count == 0:
        return np.zeros(out_type.shape, np.int8)
    m, s = mean_params(si, so, count)
    y = fp.multiply_by_quantized_multiplier(fp.wrap_int32(total - zi * count), m, s) + zo
    return clamp8(y)


@defrule("pad", "int8_ref")
def pad_int8(xs, attrs, in_types, out_type):
    if is_int16(in_types[0]):
        return pad_int16(xs, attrs, in_types, out_type)
    need_int8(in_types[0], "input", "pad")
    so, zo = same_quant(in_types[0], out_type, "pad")
    value = int(np.clip(fp.quantize_value(attrs["value"], so, zo), -128, 127))
    a = dict(attrs, value=float(value))
    return get_op("pad").ref(xs, a)


def _data_movement_int8(op):
    def rule(xs, attrs, in_types, out_type):
        if not is_int16(in_types[0]):
            need_int8(in_types[0], "input", op)
        same_quant(in_types[0], out_type, op)
        return get_op(op).ref(xs, attrs)
    return rule


defrule("transpose", "int8_ref")(_data_movement_int8("transpose"))
defrule("slice", "int8_ref")(_data_movement_int8("slice"))


@defrule("concat", "int8_ref")
def concat_int8(xs, attrs, in_types, out_type):
    if is_int16(in_types[0]):
        return concat_int16(xs, attrs, in_types, out_type)
    for k, t in enumerate(in_types):
        need_int8(t, f"input {k}", "concat")
        same_quant(t, out_type, "concat")
    return np.concatenate(xs, axis=attrs["axis"])


# ---- int8 softmax (TFLite's reference_ops::Softmax, gemmlowp fixed point) ----------------------
SOFTMAX_SCALED_DIFF_INTEGER_BITS = 5
SOFTMAX_ACCUMULATION_INTEGER_BITS = 12


def softmax_params(input_scale, beta=1.0):
    """(input_multiplier, input_left_shift, diff_min) of TFLite's int8 reference softmax."""
    m, s = fp.preprocess_softmax_scaling(beta, f32(input_scale), SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    diff_min = -fp.calculate_input_radius(SOFTMAX_SCALED_DIFF_INTEGER_BITS, s)
    return m, s, diff_min


def softmax_int8_rows(x, input_scale, beta=1.0, out_dtype="int8"):
    """reference_ops::Softmax for int8 -> int8 (output scale 1/256, zero point -128) over the
    last axis of ``x``; ``out_dtype`` "int16": int8 -> int16 (scale 1/65536, zero point -32768)."""
    mult, left_shift, diff_min = softmax_params(input_scale, beta)
    x = np.asarray(x, np.int64)
    diff = x - x.max(axis=-1, keepdims=True)
    use = diff >= diff_min
    rescaled = fp.multiply_by_quantized_multiplier_greater_than_one(diff, mult, left_shift)
    e = fp.exp_on_negative_values(rescaled, SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    terms = np.where(use, fp.saturating_rounding_multiply_by_pot(e, -SOFTMAX_ACCUMULATION_INTEGER_BITS), 0)
    # the C loop adds in int32 (no saturation); a row never comes close to overflowing
    total = fp.wrap_int32(terms.sum(axis=-1, keepdims=True))
    scale, bits_over_unit = fp.get_reciprocal(total, SOFTMAX_ACCUMULATION_INTEGER_BITS)
    bits = 16 if out_dtype == "int16" else 8
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    exponent = bits_over_unit + 31 - bits
    out = fp.rounding_divide_by_pot(fp.saturating_rounding_doubling_high_mul(scale, e), exponent) + lo
    return np.where(use, np.clip(out, lo, hi), lo).astype(out_dtype)


@defrule("softmax", "int8_ref")
def softmax_int8(xs, attrs, in_types, out_type):
    if is_int16(in_types[0]):
        return softmax_int16(xs, attrs, in_types, out_type)
    if out_type.dtype == "int16" and in_types[0].dtype == "int8":
        return _softmax_int8_to_int16(xs, attrs, in_types, out_type)
    (si, _), (so, zo) = int8_io(in_types, out_type, "softmax")
    if zo != -128 or abs(so - 1.0 / 256) > 0.001 / 256:
        raise ShapeError(f"softmax: TFLite's int8 softmax needs output scale 1/256 and zero point -128, "
                         f"got {out_type}")
    x = xs[0]
    ax = attrs["axis"] % x.ndim
    if ax != x.ndim - 1:
        return np.moveaxis(softmax_int8_rows(np.moveaxis(x, ax, -1), si), -1, ax)
    return softmax_int8_rows(x, si)


def _softmax_int8_to_int16(xs, attrs, in_types, out_type):
    """reference_ops::Softmax<int8_t, int16_t> (TFLite and TFLite Micro): the int8 softmax's
    arithmetic with 16 output bits."""
    si, _ = per_tensor(in_types[0], "input", "softmax")
    so, zo = per_tensor(out_type, "output", "softmax")
    if zo != -32768 or abs(so - 1.0 / 65536) > 0.001 / 65536:
        raise ShapeError(f"softmax: TFLite's int8 -> int16 softmax needs output scale 1/65536 and zero point "
                         f"-32768, got {out_type}")
    x = np.moveaxis(xs[0], attrs["axis"] % xs[0].ndim, -1)
    return np.moveaxis(softmax_int8_rows(x, si, out_dtype="int16"), -1, attrs["axis"] % xs[0].ndim)


# ---- TFLite import ----------------------------------------------------------
# RESHAPE, SOFTMAX (beta 1), PAD, MEAN, CONCATENATION
@tfl.importer("RESHAPE")
def _tfl_reshape(imp, k, op, ins, out):
    name = "RESHAPE"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 1, 2, optional=(1,))
    raw = imp.tensors[ins[0]]["dtype"] in ("bool", "int32")     # masks and indices reshape as they are
    x = imp.value(ins[0], k, name) if raw else imp.operand(ins[0], k, name)
    xt = imp.g.types[x]
    if len(ins) == 2 and ins[1] >= 0 and len(imp.tensors[ins[1]]["shape"]) == 1 \
            and imp.tensors[ins[1]]["dtype"] == "int32":
        new = [int(v) for v in imp.const(ins[1], k, name, "the shape tensor")]
    else:
        o = tfl.options(imp, k, op, name, "ReshapeOptions")
        new = [int(v) for v in o.NewShapeAsNumpy()] if o is not None and o.NewShapeLength() else []
        if len(new) > tfl.MAX_RESHAPE_DIMS:
            raise imp.err(f"{w}: new_shape has {len(new)} dimensions; allowed at most {tfl.MAX_RESHAPE_DIMS}")
        if new == [0]:
            new = []
    want = chk.reshape_shape(imp.err, w, xt.shape, new)
    if tuple(want) != tuple(imp.tensors[out]["shape"]):
        raise imp.err(f"{w}: output {imp.label(out)} has shape {list(imp.tensors[out]['shape'])} but TFLite reshapes "
                      f"to {want}")
    if xt.dtype in ("int8", "int16"):
        chk.same_quant(imp.err, w, xt.quant, imp.tensors[out]["quant"], "the input's")
    imp.values[out] = imp.emit(k, name, "reshape", [x], {"shape": list(want)}, out)


@tfl.importer("SOFTMAX")
def _tfl_softmax(imp, k, op, ins, out):
    name = "SOFTMAX"
    tfl.need(imp, k, name, ins, 1)
    o = tfl.options(imp, k, op, name, "SoftmaxOptions")
    beta = float(o.Beta()) if o else 0.0
    if beta != 1.0:
        raise imp.err(f"{tfl.where(k, name)}: beta = {beta} is out of range: Kiln's softmax has beta 1")
    x = imp.operand(ins[0], k, name)
    xt = imp.g.types[x]
    if not xt.shape:
        raise imp.err(f"{tfl.where(k, name)}: the input is a scalar; TFLite's softmax needs rank >= 1")
    attrs = {"axis": -1}
    if xt.dtype == "int8" and imp.tensors[out]["dtype"] == "int16":
        sc, zp = chk.per_tensor(imp.err, tfl.where(k, name), imp.tensors[out]["quant"], "the output")
        if zp != -32768 or abs(sc - 1.0 / 65536) > 0.001 / 65536:
            raise imp.err(f"{tfl.where(k, name)}: output scale {sc} zero point {zp} are out of range: TFLite's "
                          f"int8 -> int16 softmax needs 1/65536 and -32768")
        attrs["out_dtype"] = "int16"
    elif xt.dtype == "int8":
        chk.softmax_quant(imp.err, tfl.where(k, name), xt.quant, imp.tensors[out]["quant"])
    elif xt.dtype == "int16":
        softmax16_quant(imp.err, tfl.where(k, name), xt.quant, imp.tensors[out]["quant"])
    imp.values[out] = imp.emit(k, name, "softmax", [x], attrs, out)


@tfl.importer("PAD")
def _tfl_pad(imp, k, op, ins, out):
    name = "PAD"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 2)
    tfl.options(imp, k, op, name, "PadOptions")
    x = imp.operand(ins[0], k, name)
    pt = imp.tensors[ins[1]]
    if pt["dtype"] not in ("int32", "int64"):
        raise imp.err(f"{w}: paddings {imp.label(ins[1])} are {pt['dtype']}; TFLite needs int32 or int64")
    p = np.asarray(imp.const(ins[1], k, name, "paddings"), np.int64)
    nd = len(imp.g.types[x].shape)
    if nd > chk.PAD_MAX_RANK:
        raise imp.err(f"{w}: input rank {nd} is out of range: TFLite pads up to rank {chk.PAD_MAX_RANK}")
    if p.shape != (nd, 2) or np.any(p < 0):
        raise imp.err(f"{w}: paddings {p.tolist()} must be non-negative with shape [{nd}, 2]")
    if imp.g.types[x].dtype in ("int8", "int16"):
        chk.same_quant(imp.err, w, imp.g.types[x].quant, imp.tensors[out]["quant"], "the input's")
    check_limit("max_tensor_elements", math.prod(int(d) + int(a) + int(b) for d, (a, b) in
                                                 zip(imp.g.types[x].shape, p)), f"{imp.where} {w}")
    imp.values[out] = imp.emit(k, name, "pad", [x], {"pads": [int(v) for v in p.ravel()], "value": 0.0}, out)


@tfl.importer("MEAN")
def _tfl_mean(imp, k, op, ins, out):
    name = "MEAN"
    w = tfl.where(k, name)
    tfl.need(imp, k, name, ins, 2)
    x = imp.operand(ins[0], k, name)
    if imp.tensors[ins[1]]["dtype"] != "int32":
        raise imp.err(f"{w}: axes {imp.label(ins[1])} are {imp.tensors[ins[1]]['dtype']}; TFLite needs int32")
    ax = np.atleast_1d(np.asarray(imp.const(ins[1], k, name, "axes"), np.int64)).ravel()
    nd = len(imp.g.types[x].shape)
    if ax.size == 0 or np.any(ax < -nd) or np.any(ax >= nd):
        raise imp.err(f"{w}: axes {ax.tolist()} are out of range: allowed one or more of {-nd}..{nd - 1}")
    axes = sorted({int(a) % nd for a in ax})
    o = tfl.options(imp, k, op, name, "ReducerOptions")
    keep = bool(o.KeepDims()) if o else False
    if imp.g.types[x].dtype in ("int8", "int16"):
        chk.ratio_quant(imp.err, w, imp.g.types[x].quant, imp.tensors[out]["quant"])
    imp.values[out] = imp.emit(k, name, "mean", [x], {"axes": axes, "keepdims": keep}, out)


@tfl.importer("CONCATENATION")
def _tfl_concat(imp, k, op, ins, out):
    name = "CONCATENATION"
    w = tfl.where(k, name)
    if not ins or any(i < 0 for i in ins):
        raise imp.err(f"{w} needs at least one input and no absent ones, got {ins}")
    o = tfl.options(imp, k, op, name, "ConcatenationOptions")
    act = tfl.activation(imp, k, name, o.FusedActivationFunction() if o else 0)
    if act != "none":
        raise imp.err(f"{w}: fused_activation_function = {act.upper()} is out of range: TFLite's CONCATENATION "
                      f"allows NONE")
    xs = [imp.operand(i, k, name) for i in ins]
    nd = len(imp.g.types[xs[0]].shape)
    axis = int(o.Axis()) if o else 0
    if not -nd <= axis < nd:
        raise imp.err(f"{w}: axis = {axis} is out of range: allowed {-nd}..{nd - 1}")
    for v in xs:
        if imp.g.types[v].dtype in ("int8", "int16"):
            chk.same_quant(imp.err, w, imp.g.types[v].quant, imp.tensors[out]["quant"], f"input {v!r}")
    imp.values[out] = imp.emit(k, name, "concat", xs, {"axis": axis % nd}, out)


# ---- TFLite export ------------------------------------------------------------------------------
def _export_io(e, n, out):
    return [e.value(i) for i in n.inputs], e.g.types[out], e.tensor(out, e.g.types[out])


@tfl.exporter("concat", versions={"CONCATENATION": 2}, fuses_activation=True)
def _tfl_export_concat(e, n, act, out, int8):
    xs, ot, y = _export_io(e, n, out)
    e.op("CONCATENATION", xs, [y], "ConcatenationOptions", int8, Axis=n.attrs["axis"] % len(ot.shape),
         FusedActivationFunction=tfl.ACT_CODES[act])


@tfl.exporter("reshape")
def _tfl_export_reshape(e, n, act, out, int8):
    xs, ot, y = _export_io(e, n, out)
    # a scalar's shape tensor would be empty (no buffer data): new_shape alone says it
    shp = [e.const(out + "/shape", np.asarray(ot.shape, np.int32))] if ot.shape else []
    e.op("RESHAPE", xs + shp, [y], "ReshapeOptions", int8, NewShape=list(ot.shape))


@tfl.exporter("softmax", versions={"SOFTMAX": 2})
def _tfl_export_softmax(e, n, act, out, int8):
    xs, ot, y = _export_io(e, n, out)
    if n.attrs["axis"] % len(ot.shape) != len(ot.shape) - 1:
        raise tfl.ExportError(f"node {n.name!r}: TFLite's SOFTMAX works on the last axis")
    e.op("SOFTMAX", xs, [y], "SoftmaxOptions", int8, Beta=1.0)


@tfl.exporter("pad", versions={"PAD": 2, "PADV2": 2})
def _tfl_export_pad(e, n, act, out, int8):
    xs, ot, y = _export_io(e, n, out)
    it = e.g.types[n.inputs[0]]
    p = np.asarray(n.attrs["pads"], np.int32).reshape(len(it.shape), 2)
    if n.attrs["value"] == 0.0:
        e.op("PAD", xs + [e.const(out + "/paddings", p)], [y], "PadOptions", int8)
        return
    # PADV2: the fill value as a scalar of the input's type (int8: quantised with its parameters)
    if it.quant is not None:
        q = it.quant
        v = np.asarray(np.clip(fp.quantize_value(n.attrs["value"], q.scale[0], q.zero_point[0]), -128, 127), np.int8)
        cv = e.const(out + "/constant_values", v, q)
    else:
        cv = e.const(out + "/constant_values", np.asarray(n.attrs["value"], it.dtype))
    e.op("PADV2", xs + [e.const(out + "/paddings", p), cv], [y], "PadV2Options", int8)


@tfl.exporter("mean", versions={"MEAN": 2})
def _tfl_export_mean(e, n, act, out, int8):
    xs, ot, y = _export_io(e, n, out)
    it = e.g.types[n.inputs[0]]
    axes = n.attrs["axes"] if n.attrs["axes"] is not None else list(range(len(it.shape)))
    e.op("MEAN", xs + [e.const(out + "/axes", np.asarray(axes, np.int32))], [y], "ReducerOptions", int8,
         KeepDims=bool(n.attrs["keepdims"]))


# ---- int16 ----------------------------------------------------------------------------------------
# TFLite's 16x8 MEAN, PAD, CONCATENATION and SOFTMAX: mean and pad are the int8 arithmetic in int16;
# CONCATENATION copies raw int16 values (every input shares the output's scale, zero point 0).
def mean_int16(xs, attrs, in_types, out_type):
    (si, zi), (so, zo) = int16_io(in_types, out_type, "mean", symmetric=False)
    x = xs[0].astype(np.int64)
    axes = norm_axes(attrs["axes"], x.ndim, "mean")
    count = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    total = fp.wrap_int32(x.sum(axis=axes, keepdims=attrs["keepdims"]))
    if count == 0:
        return np.zeros(out_type.shape, np.int16)
    m, s = mean_params(si, so, count)
    return clamp16(fp.multiply_by_quantized_multiplier(fp.wrap_int32(total - zi * count), m, s) + zo)


def pad_int16(xs, attrs, in_types, out_type):
    so, zo = same_quant(in_types[0], out_type, "pad")
    value = int(np.clip(fp.quantize_value(attrs["value"], so, zo), -32768, 32767))
    return get_op("pad").ref(xs, dict(attrs, value=float(value)))


def concat_int16(xs, attrs, in_types, out_type):
    for k, t in enumerate(in_types):
        need_int16(t, f"input {k}", "concat")
        same_quant(t, out_type, "concat")
    return np.concatenate(xs, axis=attrs["axis"])


def softmax16_quant(err, where, qi, qo):
    """TFLite's int16 SOFTMAX Prepare: input and output zero point 0, output scale 1/32768."""
    chk.per_tensor(err, where, qi, "the input")
    so, zo = chk.per_tensor(err, where, qo, "the output")
    if qi.zero_point[0] != 0 or zo != 0:
        raise err(f"{where}: int16 softmax needs zero points of 0, got input {qi.zero_point[0]} and output {zo}")
    if abs(so - 1.0 / 32768) > 0.001 / 32768:
        raise err(f"{where}: output scale {so!r} is out of range: allowed 1/32768 (TFLite's int16 softmax)")


def softmax_int16(xs, attrs, in_types, out_type):
    (si, _), (so, _) = int16_io(in_types, out_type, "softmax")
    if abs(so - 1.0 / 32768) > 0.001 / 32768:
        raise ShapeError(f"softmax: TFLite's int16 softmax needs output scale 1/32768, got {out_type}")
    x = xs[0]
    ax = attrs["axis"] % x.ndim
    if ax != x.ndim - 1:
        return np.moveaxis(softmax16_rows(np.moveaxis(x, ax, -1), si), -1, ax)
    return softmax16_rows(x, si)


mark(INT16, "mean", "softmax", "pad", "concat")   # the 16x8 rules above
