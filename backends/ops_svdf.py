"""C lowering of the integer SVDF (frontend/ops/svdf.py: TFLite Micro's EvalIntegerSvdfReference).

``svdf_state``: the state shifted one step left per filter, the newest column
``MultiplyByQuantizedMultiplier(sum wf * (x - zx))`` clamped to the state type, plus the state
zero point (a plain C cast: the state type's wrap-around, as TFLite Micro stores it). ``svdf``:
per filter the int32 dot product of the time weights with ``state - z_state``, ``rank`` filters
summed per unit onto the bias, requantised to int8. The multipliers come from the int8
reference's own ``svdf_state_params`` / ``svdf_out_params``. The new state is an ordinary arena
value; the package copies it into the state's own static buffer after the run (docs/c_package.md,
"State"). Float SVDF uses the ops' TE computes.
"""
from __future__ import annotations

from tvm import te, tirx

from kiln.frontend.ops.svdf import svdf_out_params, svdf_state_params

from .lower import lower_rule
from .qmath import c, clamp, mbqm

_RANGE = {"int8": (-128, 127), "int16": (-32768, 32767)}


@lower_rule("svdf_state")
def lower_svdf_state(k, node, xs):
    ty = k.type(node.name)
    if ty.quant is None:
        return None
    m, sh, z_x, z_s, dt = svdf_state_params([k.type(v) for v in node.inputs])
    x, wf, st = xs
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
