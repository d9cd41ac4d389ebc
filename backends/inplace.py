"""How far below its input a kernel's output may start and still overwrite it safely.

A kernel writes its output in row-major order (the loop order of every schedule here). Output
element ``j`` is written after it has read its inputs; the input bytes it clobbers, placed
``s`` bytes lower, must not be read by any later output element. With ``m(j)`` the lowest
input byte any element after ``j`` reads, the smallest safe shift is
``max_j((j + 1) * out_itemsize - m(j))`` (computed exactly with NumPy from the op's geometry).
"""
from __future__ import annotations

import numpy as np

from kiln.frontend.ops.nn import conv_geometry, pool_geometry
from kiln.frontend.registry import ELEMENTWISE


def _min_shift(min_read_bytes, out_itemsize):
    """min_read_bytes[j]: lowest input byte read by output element j (write order)."""
    r = np.asarray(min_read_bytes, np.int64).ravel()
    n = r.size
    if n == 0:
        return 0
    later = np.minimum.accumulate(r[::-1])[::-1]          # min over j' >= j
    m = np.empty(n, np.int64)
    m[:-1] = later[1:]
    m[-1] = np.iinfo(np.int64).max // 4
    j = np.arange(n, dtype=np.int64)
    return int(max(0, ((j + 1) * out_itemsize - m).max()))


def elementwise_shift(t_in, t_out):
    """Same-shape element-wise op: element j reads input element j."""
    if tuple(t_in.shape) != tuple(t_out.shape):
        return None
    idx = np.arange(int(np.prod(t_out.shape or (1,))), dtype=np.int64) * t_in.itemsize
    return _min_shift(idx, t_out.itemsize)


def window_shift(t_in, t_out, G, per_channel, pool=False):
    """conv2d / depthwise / pooling over NHWC: the lowest input byte of each output element's
    window (in-bounds taps only)."""
    N, OH, OW, O = t_out.shape
    H, W, C = G["H"], G["W"], G["C"]
    oh = np.arange(OH)[:, None]
    ow = np.arange(OW)[None, :]
    h0 = np.clip(oh * G["sh"] - G["pt"], 0, H - 1)
    w0 = np.clip(ow * G["sw"] - G["pl"], 0, W - 1)
    pix = h0 * W + w0                                        # [OH, OW]
    if per_channel:
        mult = max(1, O // C) if not pool else 1
        ch = np.arange(O) // mult
    else:
        ch = np.zeros(O, np.int64)
    n = np.arange(N)[:, None, None, None]
    elem = (n * H * W + pix[None, :, :, None]) * C + ch[None, None, None, :]
    return _min_shift(elem * t_in.itemsize, t_out.itemsize)


def _conv(ts, ty, a):
    G = conv_geometry(ts[0].shape, ts[1].shape, a)
    return window_shift(ts[0], ty, G, G["I"] == 1 and G["g"] == G["C"] and G["g"] > 1, pool=False)


def _pool(ts, ty, a):
    return window_shift(ts[0], ty, pool_geometry(ts[0].shape, a), True, pool=True)


# ops that are not element-wise whose kernel still writes its output in row-major order reading
# only a known part of input 0: the minimum shift of that input
_FIRST_INPUT = {"reshape": lambda ts, ty, a: 0, "conv2d": _conv, "avg_pool2d": _pool, "max_pool2d": _pool}


def hints(op, inputs, in_types, out_type, attrs):
    """{input value: min shift} for one node of ``op`` (an OpDef): an element-wise op (property
    ELEMENTWISE) aliases every input of its output's shape, a reshape copy its input exactly,
    conv2d and the pools their input below the window still to be read."""
    if ELEMENTWISE in op.props:
        out = {}
        for v, t in zip(inputs, in_types):
            s = elementwise_shift(t, out_type)
            if s is not None:
                out[v] = s
        return out
    rule = _FIRST_INPUT.get(op.name)
    return {} if rule is None else {inputs[0]: rule(in_types, out_type, attrs)}
