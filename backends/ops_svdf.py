"""C lowering of the integer SVDF (frontend/ops/svdf.py: TFLite Micro's EvalIntegerSvdfReference).

``svdf_state``: the state shifted one step left per filter, the newest column
``MultiplyByQuantizedMultiplier(sum wf * (x - zx))`` clamped to the state type, plus the state
zero point (a plain C cast: the state type's wrap-around, as TFLite Micro stores it). ``svdf``:
per filter the int32 dot product of the time weights with ``state - z_state``, ``rank`` filters
summed per unit onto the bias, requantised to int8. The multipliers come from the int8
reference's own ``svdf_state_params`` / ``svdf_out_params``. The new state is an ordinary arena
value; the package copies it into the state's own static buffer after the run (docs/c_package.md,
"State"). Float SVDF uses the ops' TE computes.

With Kiln's kernels (``TargetSpec.kernels``) an integer SVDF (int16 state, or TFLite Micro's int8
state) whose weights are constants and whose inputs are kernel arguments is one call per node of
``include/kiln_svdf.h``: ``kiln_svdf_state_s16`` / ``_s8`` (SMLAD on the DSP extension; feature
weights packed by ``schedules.pack_w8``) or, on Helium targets, ``kiln_mve_svdf_state_s16`` /
``_s8`` (VMLADAVA; weights packed by ``ops_mve.pack_gemm``), and ``kiln_svdf_s16`` / ``_s8`` (the
time weights' dot products: SMLAD or VMLADAVA), the zero points folded into biases at compile
time. Everything else (weights computed at run time, inputs fused into the kernel) takes the TE
stages.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from kiln.frontend.ops.svdf import svdf_out_params, svdf_state_params

from .lower import lower_rule
from .ops_dense import fold_bias
from .ops_mve import pack_gemm, requant_table
from .qmath import c, clamp, mbqm
from .schedules import pack_w8

_RANGE = {"int8": (-128, 127), "int16": (-32768, 32767)}


@lower_rule("svdf_state")
def lower_svdf_state(k, node, xs):
    ty = k.type(node.name)
    if ty.quant is None:
        return None
    m, sh, z_x, z_s, dt = svdf_state_params([k.type(v) for v in node.inputs])
    x, wf, st = xs
    y = _state_kernel(k, node, xs, ty, (m, sh, z_x, z_s))
    if y is not None:
        return y
    B, I = (int(s) for s in x.shape)
    F = int(wf.shape[0])
    M = int(st.shape[1]) // F
    k.schedule(_keep_stages)
    r = te.reduce_axis((0, I), "r")
    acc = te.compute((B, F), lambda b, f: te.sum((x[b, r].astype("int32") - c(z_x)) * wf[f, r].astype("int32"),
                                                 axis=r), name="svdf_acc")
    lo, hi = _RANGE[dt]
    col = te.compute((B, F), lambda b, f: (clamp(mbqm(acc[b, f], c(m), sh), lo, hi) + c(z_s)).astype(dt),
                     name="svdf_col")
    return te.compute(ty.shape, lambda b, j: tirx.Select(
        j % M == M - 1, col[b, j // M], st[b, tirx.min(j + 1, F * M - 1)]), name="svdf_state")


@lower_rule("svdf")
def lower_svdf(k, node, xs):
    ty = k.type(node.name)
    if ty.quant is None:
        return None
    m, sh, z_s, z_o = svdf_out_params([k.type(v) for v in node.inputs], ty)
    st, wt, bias = xs
    F, M = (int(s) for s in wt.shape)
    rank = node.attrs["rank"]
    y = _out_kernel(k, node, xs, ty, (m, sh, z_s, z_o))
    if y is not None:
        return y
    k.schedule(_keep_stages)
    j = te.reduce_axis((0, M), "j")
    sc = te.compute((int(st.shape[0]), F), lambda b, f: te.sum(
        wt[f, j].astype("int32") * (st[b, f * M + j].astype("int32") - c(z_s)), axis=j), name="svdf_scratch")
    r = te.reduce_axis((0, rank), "r")
    acc = te.compute(ty.shape, lambda b, u: te.sum(sc[b, u * rank + r], axis=r), name="svdf_sum")
    return te.compute(ty.shape, lambda b, u: clamp(mbqm(acc[b, u] + bias[u], c(m), sh) + c(z_o), -128, 127)
                      .astype("int8"), name="svdf")


def _keep_stages(sch, out_block):
    """Every stage a loop nest of its own (the column and the per-filter sums are computed once)."""
    return None


# ---- the kernels of include/kiln_svdf.h ----------------------------------------------------------
def _kernel_inputs(k, node, xs):
    """The constant weights (inputs[1]) and bias when the kernel applies: Kiln's kernels on, the
    run-time inputs kernel arguments (not fused stages), the weights constants; else None."""
    if not k.target.kernels or not all(isinstance(x.op, te.PlaceholderOp) for x in xs):
        return None
    w = k.value(node.inputs[1])
    return None if w is None else np.asarray(w)


def _suffix(dtype):
    """The kernels' name suffix of a state type: ``s16`` or ``s8``."""
    return {"int16": "s16", "int8": "s8"}[str(dtype)]


def _shifts(sh):
    """(left shift, minus the right shift) of a TFLite multiplier's shift."""
    return max(int(sh), 0), min(int(sh), 0)


def pack_features(wf, helium):
    """(F, I) int8 feature weights -> the layout of ``kiln_mve_svdf_state_s16`` (``pack_gemm``) or
    of ``kiln_svdf_state_s16``: ``pack_w8`` blocks of 4 filters, then the F % 4 others one each."""
    wf = np.asarray(wf, np.int8)
    if helium:
        return pack_gemm(wf).reshape(-1)
    F4 = wf.shape[0] // 4 * 4
    return np.concatenate([pack_w8(wf[:F4], 4).reshape(-1), pack_w8(wf[F4:], 1).reshape(-1)])


def _state_kernel(k, node, xs, ty, params):
    wf = _kernel_inputs(k, node, xs)
    if wf is None:
        return None
    m, sh, z_x, z_s = params
    x, _, st = xs
    B, I = (int(s) for s in x.shape)
    F = int(wf.shape[0])
    M = int(st.shape[1]) // F
    bias = fold_bias(wf, np.zeros(F, np.int64), z_x)
    lsh, rneg = _shifts(sh)
    helium = k.target.helium
    w = k.const("w_svdf", pack_features(wf, helium))
    if helium:
        consts = [w, k.const("rq_svdf", requant_table(bias, np.full(F, m), np.full(F, sh)))]
        fn, scalars = "kiln_mve_svdf_state_", []
    else:
        consts = [w, k.const("b_svdf", bias)]
        fn, scalars = "kiln_svdf_state_", [c(m), c(lsh), c(rneg)]
    fn += _suffix(st.dtype)
    k.schedule(lambda sch, out_block: None)

    def fcompute(ins, outs):
        xb, sb = ins[0], ins[1]
        return tirx.Evaluate(tirx.call_extern(
            "void", fn, xb.access_ptr("r"), c(B), c(I), c(F), c(M), *[b.access_ptr("r") for b in ins[2:]], *scalars,
            c(z_s), sb.access_ptr("r"), outs[0].access_ptr("w")))
    return _extern([x, st] + consts, fcompute, tuple(ty.shape), str(st.dtype), "svdf_state")


def _out_kernel(k, node, xs, ty, params):
    wt = _kernel_inputs(k, node, xs)
    b = k.value(node.inputs[2])
    if wt is None or b is None:
        return None
    m, sh, z_s, z_o = params
    st = xs[0]
    F, M = (int(s) for s in wt.shape)
    rank = node.attrs["rank"]
    U, n = F // rank, rank * M
    # sum wt * (state - z_s) over a unit's rank * M values = sum wt * state - z_s * sum wt (mod 2^32)
    bias = fold_bias(wt.reshape(U, n), np.asarray(b, np.int64).reshape(U), z_s)
    lsh, rneg = _shifts(sh)
    consts = [xs[1], k.const("b_svdf", np.concatenate([bias, np.zeros(-U % 4, np.int32)]))]
    k.schedule(lambda sch, out_block: None)
    B = int(st.shape[0])
    fn = "kiln_svdf_" + _suffix(st.dtype)

    def fcompute(ins, outs):
        sb, wb, bb = ins
        return tirx.Evaluate(tirx.call_extern(
            "void", fn, sb.access_ptr("r"), c(B), c(U), c(n), wb.access_ptr("r"), bb.access_ptr("r"),
            c(m), c(lsh), c(rneg), c(z_o), outs[0].access_ptr("w")))
    return _extern([st] + consts, fcompute, tuple(ty.shape), "int8", "svdf")


def _extern(ins, fcompute, shape, dtype, name):
    bufs = [tirx.decl_buffer(t.shape, t.dtype, name=t.op.name, elem_offset=0) for t in ins]
    yb = tirx.decl_buffer(shape, dtype, name=name, elem_offset=0)
    return te.extern(shape, ins, fcompute, name=name, dtype=dtype, in_buffers=bufs, out_buffers=[yb])
