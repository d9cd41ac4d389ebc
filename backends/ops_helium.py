"""Helium (MVE) rules for int8 FULLY_CONNECTED, ADD and MUL on targets with ``TargetSpec.helium``
(the Cortex-M55): each wraps the rule registered before it (``ops_dense.py``,
``ops_elementwise.py``) and takes the nodes its kernel in ``kiln_mve.h`` covers (batch-1 dense
with constant weights: ``kiln_mve_fc_s8``; same-shape add / mul: ``kiln_mve_add_s8`` /
``kiln_mve_mul_s8``, ``ops_mve.lower_binary_mve``); everything else, and every other target, goes
to the previous rule. Imported by ``backends/ops.py`` after the modules whose rules it wraps."""
from __future__ import annotations

import numpy as np

from kiln.frontend.ops.nn import fixed_requant, requantize_params
from kiln.frontend.registry import OPS

from . import ops_dense, ops_elementwise, ops_mve, qmath  # noqa: F401  (ops_dense: the rule wrapped)
from .lower import BACKEND, PENDING, lower_rule
from .ops_mve import pack_gemm


def helium_first(op_name):
    """Decorator: ``fn(k, node, xs)`` lowers ``op_name`` on Helium targets with Kiln kernels when it
    returns a tensor; None (not covered), and other targets, go to the rule registered before."""
    def deco(fn):
        prev = OPS[op_name].lower.get(BACKEND) if op_name in OPS else PENDING.get(op_name)

        def rule(k, node, xs):
            if k.target.kernels and k.target.helium and ops_elementwise._q(k, node):
                y = fn(k, node, xs)
                if y is not None:
                    return y
            return prev(k, node, xs) if prev is not None else None
        rule.__name__ = f"lower_{op_name}_helium_first"
        lower_rule(op_name)(rule)
        return fn
    return deco


def prepare_fc(w, bias, zx, s_in, w_scales, s_out, zy, act, fixed=False):
    """Everything ``kiln_mve_fc_s8`` takes besides the input and output, at compile time: the packed
    weights (``pack_gemm``), the folded bias padded to a multiple of 4, the fast multipliers ``m``
    (padded likewise, or one), the exact constants ``rq`` and ``mstep``, ``c1``, ``c2``, ``lo``,
    ``hi``: LiteRT's reference FULLY_CONNECTED requantisation (``ops_dense.prepare_dense``'s
    constants, whose guard and fast path kiln_mve.h vectorises). ``fixed``: TensorFlow Lite
    Micro's requantisation (``kiln_mve_fc_s8_fx``): "rq" is the conv's table
    (``ops_mve.requant_table``) of the folded bias and the fixed-point multipliers."""
    w = np.asarray(w, np.int8)
    N = w.shape[0]
    Np = -(-N // 4) * 4
    p = ops_dense.prepare_dense(w, bias, zx, s_in, w_scales, s_out, zy, act, fixed=fixed)
    folded = ops_dense.fold_bias(w, np.asarray(bias, np.int64).reshape(N), zx)
    if fixed:
        mult, shift = requantize_params(s_in, np.broadcast_to(np.ravel(w_scales), (N,)), s_out)
        p["rq"] = ops_mve.requant_table(folded, mult, shift)
    m = p["m"] if p["mstep"] == 0 else np.concatenate([p["m"], np.zeros(Np - N, np.int32)])
    return {"w": pack_gemm(w), "bias": np.concatenate([folded, np.zeros(Np - N, np.int32)]), "m": m,
            "rq": p["rq"], "mstep": p["mstep"], "c1": p["c1"], "c2": p["c2"], "lo": p["lo"], "hi": p["hi"]}


def lower_dense_mve(k, node, x):
    """int8 dense with constant weights (and bias), one weight zero point 0 and an input that is a
    kernel argument as one ``kiln_mve_fc_s8`` call; None otherwise."""
    tx, tw, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
    if any(t.dtype != "int8" or t.quant is None for t in (tx, tw, ty)):
        return None
    if any(int(z) for z in tw.quant.zero_point):
        return None
    ops = ops_dense.kernel_operands(k, node, x)
    if ops is None:
        return None
    args, rows, K, N, zy = ops
    fx = fixed_requant(node.attrs)
    p = prepare_fc(*args, fixed=fx)
    consts = [k.const("w_fc_mve", p["w"]), k.const("b_fc_mve", p["bias"]), k.const("m_fc_mve", p["m"]),
              k.const("rq_fc_mve_fx" if fx else "rq_fc_mve", p["rq"])]
    k.schedule(lambda sch, out_block: None)
    return ops_dense.dense_extern("kiln_mve_fc_s8_fx" if fx else "kiln_mve_fc_s8", x, consts, rows, K, N, p, zy,
                                  ty.shape)


@helium_first("dense")
def _dense(k, node, xs):
    return lower_dense_mve(k, node, xs[0])


def _clamp_after(k, node):
    """(lo, hi, clamp node) when the rest of the node's fused group is one relu / relu6 of it on
    the same quantisation (a clamp, TFLite's fused activation), (-128, 127, None) when the node ends
    its group; None when other nodes of the group follow (the kernel would need a scratch buffer)."""
    rest = k.group.nodes[[n.name for n in k.group.nodes].index(node.name) + 1:]
    if not rest:
        return -128, 127, None
    n = rest[0]
    if len(rest) > 1 or n.op not in ("relu", "relu6") or list(n.inputs) != [node.name]:
        return None
    ty, tr = k.type(node.name), k.type(n.name)
    if tr.dtype != "int8" or tr.quant != ty.quant:
        return None
    lo, hi = qmath.activation_range(n.op, float(ty.quant.scale[0]), int(ty.quant.zero_point[0]))
    return lo, hi, n


def _binary(k, node, xs, name):
    after = _clamp_after(k, node)
    if after is None:
        return None
    y = ops_mve.lower_binary_mve(k, node, xs, name, after[0], after[1])
    if y is not None and after[2] is not None:
        k.helium_clamped = {after[2].name: y}      # the clamp node's rule returns y as it is
    return y


@helium_first("add")
def _add(k, node, xs):
    return _binary(k, node, xs, "add")


@helium_first("mul")
def _mul(k, node, xs):
    return _binary(k, node, xs, "mul")


def _clamp_rule(op):
    @helium_first(op)
    def rule(k, node, xs):
        y = getattr(k, "helium_clamped", {}).get(node.name)
        return y if y is not None and y is xs[0] else None
    return rule


for _op in ("relu", "relu6"):
    _clamp_rule(_op)
