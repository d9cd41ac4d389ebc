"""Helpers shared by the op definitions."""

from ..errors import ShapeError
from ..types import TensorType, broadcast_shapes


def same_dtype(ts, opname):
    dts = {t.dtype for t in ts}
    if len(dts) > 1:
        raise ShapeError(f"{opname} needs operands of one dtype, got {', '.join(t.dtype for t in ts)}; "
                         f"insert kiln.cast(...)")
    return ts[0].dtype


def need_float(t, opname):
    """Float ops also accept quantised int8 operands (their int8 reference runs instead)."""
    if not t.is_float and t.quant is None:
        raise ShapeError(f"{opname} needs a float operand, got {t.dtype}")


def norm_axes(axes, ndim, opname="reduction"):
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = [axes]
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ShapeError(f"{opname}: axis {a} out of range for rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"{opname}: repeated axis in {list(axes)}")
    return tuple(sorted(out))


def reduced_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def conv_out_and_pads(size, k, stride, dilation, padding, which):
    """Output length and (before, after) padding on one spatial axis. ``padding`` is 'same',
    'valid' or an explicit [top, bottom, left, right] list; ``which`` is 0 (H) or 1 (W).
    'same' follows TensorFlow/TFLite: out = ceil(in / stride), extra pad goes after."""
    eff = (k - 1) * dilation + 1
    if padding == "valid":
        lo = hi = 0
    elif padding == "same":
        out = -(-size // stride)
        total = max((out - 1) * stride + eff - size, 0)
        lo, hi = total // 2, total - total // 2
    else:
        if len(padding) != 4:
            raise ShapeError(f"explicit padding must be [top, bottom, left, right], got {padding}")
        lo, hi = padding[2 * which], padding[2 * which + 1]
        if lo < 0 or hi < 0:
            raise ShapeError(f"negative padding {padding}")
    out = (size + lo + hi - eff) // stride + 1
    if out <= 0:
        raise ShapeError(f"window of {eff} (kernel {k}, dilation {dilation}) does not fit input {size} "
                         f"with padding {lo}+{hi}")
    return out, lo, hi


def tt(shape, dtype, quant=None):
    return TensorType(tuple(shape), dtype, quant)


def bshape(ts, opname):
    return broadcast_shapes(*[t.shape for t in ts], where=f" in {opname}")
