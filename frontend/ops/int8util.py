"""Small helpers shared by the int8 reference rules: read quantisation parameters from types the
way TFLite stores them (float32 scales, int32 zero points) and raise named errors."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError

QMIN, QMAX = -128, 127


def f32(x) -> float:
    """A scale as TFLite holds it: the nearest float32, returned as a Python float (double)."""
    return float(np.float32(x))


def per_tensor(t, what, op):
    """(scale, zero_point) of a per-tensor quantised int8 value, or a ShapeError naming it."""
    q = t.quant
    if q is None:
        raise ShapeError(f"{op}: {what} {t} has no quantisation parameters (int8 reference needs them)")
    if q.per_channel and len(q.scale) != 1:
        raise ShapeError(f"{op}: {what} must be quantised per tensor, got per-channel {t}")
    return f32(q.scale[0]), int(q.zero_point[0])


def need_int8(t, what, op):
    if t.dtype != "int8":
        raise ShapeError(f"{op}: int8 reference needs an int8 {what}, got {t}")


def int8_io(in_types, out_type, op, n=1):
    """Check that inputs 0..n-1 are per-tensor int8 and return their (scale, zero_point) pairs
    followed by the output's: ``(s_in, z_in), (s_out, z_out) = int8_io(...)``."""
    names = ["input"] if n == 1 else [f"input {k}" for k in range(n)]
    for t, what in zip(in_types, names):
        need_int8(t, what, op)
    return [per_tensor(t, what, op) for t, what in zip(in_types, names)] + [per_tensor(out_type, "output", op)]


def channel_params(t, n, op):
    """Per-output-channel (scales, zero points) of a weight tensor, broadcast to ``n`` channels."""
    q = t.quant
    if q is None:
        raise ShapeError(f"{op}: weights {t} have no quantisation parameters")
    s = np.asarray([f32(v) for v in q.scale], np.float64)
    z = np.asarray(q.zero_point, np.int64)
    if q.per_channel and len(s) > 1:
        if q.axis != 0 or len(s) != n:
            raise ShapeError(f"{op}: per-channel weights must be quantised on axis 0 with {n} scales, got {t}")
        return s, z, True
    return np.full(n, s[0]), np.full(n, z[0]), False


def clamp8(y, lo=QMIN, hi=QMAX):
    return np.clip(y, lo, hi).astype(np.int8)


def trunc_div(a, b):
    """C integer division (truncates toward zero) on int64 arrays."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


def same_quant(t_in, t_out, op):
    si, zi = per_tensor(t_in, "input", op)
    so, zo = per_tensor(t_out, "output", op)
    if zi != zo or abs(si - so) > 1e-6:
        raise ShapeError(f"{op}: TFLite's int8 {op} keeps the quantisation: input {t_in} and output "
                         f"{t_out} must share scale and zero point")
    return si, zi
