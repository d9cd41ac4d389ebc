"""C kernels of the int8 matrix ops that are not convolutions: ``matmul`` (TFLite BATCH_MATMUL)
and ``transpose_conv2d`` (TFLite TRANSPOSE_CONV), bit for bit as their int8 references
(frontend/ops/batch_matmul.py, frontend/ops/transpose_conv.py). Float is the op's TE compute.

- matmul: ``sum_k (a - z_a) * (b - z_b)`` in int32 (batch dimensions broadcast),
  ``MultiplyByQuantizedMultiplier`` by ``float32(s_a * s_b) / s_out``, + z_out, clamped to int8.
- transpose_conv2d: the transposed convolution (``conv2d_grad_input``'s TE compute) of
  ``x - z_x`` with the int8 filter in int32, + bias, then the conv's per-channel requantisation
  epilogue (``ops_nn.requant_epilogue``: the same multipliers as the reference's
  ``requantize_params``) with the fused activation clamp.
"""
from __future__ import annotations

import numpy as np
from tvm import te

from kiln.frontend import fixedpoint as fp
from kiln.frontend.ops import te_helpers as T
from kiln.frontend.ops.int8util import per_tensor
from kiln.frontend.ops.transpose_conv import cgi_attrs
from kiln.frontend.registry import get_op
from kiln.frontend.types import TensorType

from . import qmath
from .lower import lower_rule
from .ops_nn import _check_int8, quantized, requant_epilogue
from .qmath import c

I32 = "int32"


def _batch_index(t, bi, nb):
    """Index of operand ``t`` at the output's batch position ``bi`` (NumPy broadcasting)."""
    lead = nb - (len(t.shape) - 2)
    return [0 if int(t.shape[j]) == 1 else bi[lead + j] for j in range(len(t.shape) - 2)]


@lower_rule("matmul")
def lower_matmul(k, node, xs):
    if not quantized(k, node) or k.type(node.inputs[0]).dtype != "int8":
        return None                          # float: the TE compute; int16: no C kernel (named by lower_te)
    _check_int8(k, node, [node.inputs[0], node.inputs[1], node.name])
    ta, tb, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
    (sa, za), (sb, zb), (so, zo) = (per_tensor(t, w, "matmul") for t, w in ((ta, "lhs"), (tb, "rhs"), (ty, "output")))
    mult, shift = fp.quantize_multiplier(float(np.float32(np.float32(sa) * np.float32(sb))) / float(np.float32(so)))
    a, b = xs
    shape = tuple(int(s) for s in ty.shape)
    nb = len(shape) - 2
    kk = te.reduce_axis((0, int(ta.shape[-1])), "k")

    def dot(*i):
        ai = _batch_index(ta, i[:nb], nb) + [i[-2], kk]
        bi = _batch_index(tb, i[:nb], nb) + [kk, i[-1]]
        return te.sum((a(*ai).astype(I32) - c(za)) * (b(*bi).astype(I32) - c(zb)), axis=kk)
    acc = te.compute(shape, dot, name="acc")
    return te.compute(shape, lambda *i: qmath.clamp(qmath.mbqm(acc(*i), c(int(mult)), int(shift)) + c(zo), -128, 127)
                      .astype("int8"), name="requant")


@lower_rule("transpose_conv2d")
def lower_transpose_conv2d(k, node, xs):
    if not quantized(k, node) or k.type(node.inputs[0]).dtype != "int8":
        return None                          # float: the TE compute; int16: no C kernel (named by lower_te)
    _check_int8(k, node, [node.inputs[0], node.inputs[1], node.name])
    tx, tw, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
    if any(int(z) != 0 for z in tw.quant.zero_point):
        k.fail("int8 transpose_conv2d needs symmetric filters (zero point 0), as TFLite's TRANSPOSE_CONV")
    zx = int(tx.quant.zero_point[0])
    x, w = xs[0], xs[1]
    O, KH, KW, I = (int(s) for s in tw.shape)
    x32 = te.compute(x.shape, lambda *i: x(*i).astype(I32) - c(zx), name="xz")
    w32 = te.compute((I, KH, KW, O), lambda i, kh, kw, o: w[o, kh, kw, i].astype(I32), name="w_ohwi")
    acc = get_op("conv2d_grad_input").te(T, [x32, w32], cgi_attrs(node.attrs), TensorType(tuple(ty.shape), I32))
    if len(xs) == 3:
        bias = xs[2]
        acc = te.compute(acc.shape, lambda n, h, ww, o: acc[n, h, ww, o] + bias[o].astype(I32), name="bias")
    return requant_epilogue(k, node, acc, ty, O, lambda idx: idx[3], node.attrs["activation"])
