"""C lowering of the quantised ``lstm``, int8 and 16x8 (TFLite Micro's ``EvalLstm``,
``frontend/ops/recurrent_16x8.py``): portable C from TE, the reference's own multipliers.

The input-to-gate products of every step in one stage: for int16 input (int32 accumulators when
the input depth cannot overflow them, else int64) requantised with the int64
``MultiplyByQuantizedMultiplier`` of the 16x8 kernels to int16 in a second stage; for int8 input
int32 accumulators, the bias and the input offset ``-z_x * rowsum(W_x)`` added and the int32
``MultiplyByQuantizedMultiplier`` applied where the gates read them. Then per step: the recurrent
products of the 4 gates, the activated gates (saturating add, TFLite's int16 sigmoid / tanh
table), the new cell and the new hidden state (int8 with the output zero point, or int16). Every
stage stays a loop nest of its own (no inlining). A stateful LSTM's cell twin (its final cell
state, ``output="cell"``) is written by the same kernel, from the last step's cell stage
(``ops_recurrent.cell_twin``). Float LSTMs keep their rule (``backends/ops_recurrent.py``).
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from kiln.frontend.ops.int16util import SIGMOID_TABLE_U16
from kiln.frontend.ops.recurrent_16x8 import lstm_16x8_params

from .ops_elementwise import _lut16_tail
from .ops_int16 import int16_first
from .ops_recurrent import cell_twin  # (and the int8 / float rule int16_first wraps)
from .qmath import c, clamp, let, mbqm
from .tirc import SCRATCH_MIN_BYTES

I64 = "int64"
U64 = "uint64"


def _reduced(m):
    """The 16-bit multiplier of the int64 MultiplyByQuantizedMultiplier."""
    return int((m + (1 << 15)) >> 16) if m < 0x7FFF0000 else 0x7FFF


def _fc_consts(k, mults, tag):
    """Per-gate (reduced multiplier, total shift) constants: [4] int32 each."""
    red = np.asarray([_reduced(m) for m, _ in mults], np.int32)
    tot = np.asarray([15 - s for _, s in mults], np.int32)
    return k.const(f"{tag}_m", red), k.const(f"{tag}_s", tot)


def _u64(v):
    return v if str(getattr(v, "ty", "")) == U64 else v.astype(I64).astype(U64)


def _rq64(acc, red, tot):
    """clamp16(int32((acc * red + 2**(tot - 1)) >> tot)) on an int64 accumulator, as TFLite Micro
    computes it: the product and rounding term modulo 2**64 (in uint64, where C defines the wrap
    that TFLM's int64 arithmetic does in practice), the arithmetic shift, then the int32
    conversion that keeps the low 32 bits (frontend/ops/int16util.wrap32)."""
    sh = tot.astype(U64)
    v = tirx.reinterpret(I64, _u64(acc) * red.astype(U64) + (c(1, U64) << (sh - c(1, U64)))) >> sh.astype(I64)
    return clamp(v.astype("int32"), -32768, 32767)


def _lut(name, x, mult, shift, table):
    """TFLite's int16 LOGISTIC / TANH (reference_integer_ops) of the int32 expression x."""
    if mult == 0:
        mult, shift = 3 << shift, 0
    rnd = (1 << (shift - 1)) if shift > 0 else 0
    frac = 9 if name == "sigmoid" else 8
    return let("lv", (x * c(mult) + c(rnd)) >> c(shift), lambda v: let(
        "la", tirx.Select(v < c(0), -v, v), lambda a: _lut16_tail(name, v, a, a >> c(frac), table, frac)))


def _rq32(k, mults, tag):
    """(accumulator, gate) -> clamp16(MBQM(accumulator, m[gate], shift[gate])): the int32
    requantisation of TFLite Micro's int8 -> int16 FullyConnected."""
    m = k.const(f"{tag}_m", np.asarray([v for v, _ in mults], np.int32))
    left = k.const(f"{tag}_l", np.asarray([max(s, 0) for _, s in mults], np.int32))
    right = k.const(f"{tag}_r", np.asarray([max(-s, 0) for _, s in mults], np.int32))
    return lambda acc, g: clamp(mbqm(acc, m[g], (left[g], right[g])), -32768, 32767)


def _requant(k, p, w, z, bias, which):
    """(accumulator, gate, unit) -> the int16 gate product: int16 activations requantise with the
    int64 MBQM of the 16x8 kernels (the bias added by ``_bias`` before); int8 ones add the bias
    and ``-z * rowsum(W)`` (the input offset) in int32 and requantise with the int32 MBQM."""
    tag = f"lstm16_{which}"
    if p["dtype"] == "int16":
        red, tot = _fc_consts(k, p[f"m{which}"], tag)
        return lambda acc, g, j: _rq64(acc, red[g], tot[g])
    rq = _rq32(k, p[f"m{which}"], tag)
    off = -z * w.astype(np.int64).sum(axis=2) + (0 if bias is None else bias)
    if not off.any():
        return lambda acc, g, j: rq(acc, g)
    wrapped = ((off + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)   # TFLM's int32 accumulator
    offc = k.const(f"{tag}_off", wrapped)
    return lambda acc, g, j: rq(acc + offc[g, j], g)


def _acc_type(depth):
    return "int32" if depth * 32768 * 128 < (1 << 31) else I64


def _step(P, fx, h, cst, wh, t):
    N, H = int(h.shape[0]), int(wh.shape[2])            # h may be a step's widened buffer
    rh = te.reduce_axis((0, H), "rh")
    at = _acc_type(H)
    rec = te.compute((4, N, H), lambda g, n, j: te.sum(h[n, rh].astype(at) * wh[g, j, rh].astype(at), axis=rh),
                     name=f"lstm16_rec{t}")
    tab = P["table"]

    def gate(g, n, j):
        pre = clamp(fx(g, n, t, j) + P["rq_h"](rec[g, n, j], g, j), -32768, 32767)
        return let("pre", pre, lambda v: tirx.Select(g == 2, _lut("tanh", v, 0, 0, tab).astype("int32"),
                                                      _lut("sigmoid", v, 0, 0, tab).astype("int32")))
    gates = te.compute((4, N, H), gate, name=f"lstm16_gates{t}")
    (mfc, sfc), (mig, sig), (mho, sho) = P["fc"], P["ig"], P["ho"]

    def cell(n, j):
        fc = clamp(mbqm(gates[1, n, j] * cst[n, j].astype("int32"), c(mfc), sfc), -32768, 32767)
        ig = clamp(mbqm(gates[0, n, j] * gates[2, n, j], c(mig), sig), -32768, 32767)
        lim = P["clip"] if P["clip"] > 0 else 32767
        v = clamp(fc + ig, -32768, 32767)
        return (clamp(v, -lim, lim) if P["clip"] > 0 else v).astype("int16")
    c2 = te.compute((N, H), cell, name=f"lstm16_cell{t}")

    def hidden(n, j):
        tc = _lut("tanh", c2[n, j].astype("int32"), *P["tanh"], tab).astype("int32")
        lo, hi = P["range"]
        v = clamp(mbqm(tc * gates[3, n, j], c(mho), sho) + c(P["z_h"]), lo, hi).astype(P["dtype"])
        return v if P["width"] == H else tirx.if_then_else(j < c(H), v, tirx.const(0, P["dtype"]))
    return te.compute((N, P["width"]), hidden, name=f"lstm16_hidden{t}"), c2


def _bias(k, b, at, depth):
    """(accumulator, gate, unit) -> accumulator + bias: in int32 when neither can overflow it,
    else in int64 (int32 constants when every bias fits, else high and low halves)."""
    if at == "int32" and np.abs(b).max(initial=0) < (1 << 31) - depth * 32768 * 128:
        bt = k.const("lstm16_b", b.astype(np.int32))
        return lambda a, g, j: a + bt[g, j]
    if np.abs(b).max(initial=0) < (1 << 31):
        bt = k.const("lstm16_b", b.astype(np.int32))
        return lambda a, g, j: a.astype(I64) + bt[g, j].astype(I64)
    hi, lo = k.const("lstm16_bhi", (b >> 32).astype(np.int32)), k.const("lstm16_blo", (b & 0xFFFFFFFF).astype(np.uint32))
    # modulo 2**64 (uint64) as TFLM's int64 accumulator wraps for a bias within the products of +-2**63
    return lambda a, g, j: (_u64(a) + (_u64(hi[g, j]) << c(32, U64)) + lo[g, j].astype(U64))


def hidden_width(N, H, T, itemsize, budget=2048):
    """Columns of each step's hidden-state buffer. All T of them live until the output is
    gathered; buffers under the backend's scratch threshold (tirc.SCRATCH_MIN_BYTES) stay on the
    stack, so when T of them would take more than ``budget`` bytes of stack each is widened to
    the threshold (the padding columns hold 0) and lives in the arena instead."""
    if N * H * itemsize >= SCRATCH_MIN_BYTES or T * N * H * itemsize <= budget:
        return H
    return -(-SCRATCH_MIN_BYTES // (N * itemsize))


def _keep_stages(sch, out_block):
    return None


@int16_first("lstm", claims=lambda t0, ty: ty.quant is not None and ty.dtype in ("int8", "int16"), hints=False)
def lower_lstm_16x8(k, node, xs):
    cell = node.attrs.get("output") == "cell"    # the final cell state (a stateful LSTM's next c0)
    ty = k.type(node.inputs[13]) if cell else k.type(node.name)
    arrays = [k.value(v) for v in node.inputs]
    if any(arrays[j] is None for j in range(1, 13)):
        k.fail("the quantised LSTM needs constant weights and biases")
    k.schedule(_keep_stages)
    p = lstm_16x8_params([k.type(v) for v in node.inputs], ty, node.attrs["cell_clip"])
    P = dict(p, table=k.const("sigtab", SIGMOID_TABLE_U16.astype(np.int32)))
    info = np.iinfo(p["dtype"])
    P["range"] = (int(info.min), int(info.max))
    x = xs[0]
    tm = node.attrs["time_major"]
    Tn, N, I = (int(s) for s in x.shape) if tm else (int(x.shape[1]), int(x.shape[0]), int(x.shape[2]))
    H = int(xs[13].shape[1])
    P["width"] = hidden_width(N, H, Tn, info.bits // 8)
    wxa = np.stack([np.asarray(a, np.int8) for a in arrays[1:5]])
    wha = np.stack([np.asarray(a, np.int8) for a in arrays[5:9]])
    wx, wh = k.const("lstm16_wx", wxa), k.const("lstm16_wh", wha)
    b = np.stack([np.asarray(a, np.int64) for a in arrays[9:13]])
    P["rq_h"] = _requant(k, p, wha, p["z_h"], None, "h")
    rq_x = _requant(k, p, wxa, p["z_x"], b, "x")
    at = _acc_type(I)
    ri = te.reduce_axis((0, I), "ri")

    def xacc(g, n, t, j):
        xv = x[t, n, ri] if tm else x[n, t, ri]
        return te.sum(xv.astype(at) * wx[g, j, ri].astype(at), axis=ri)
    acc = te.compute((4, N, Tn, H), xacc, name="lstm16_xacc")
    bias = _bias(k, b, at, I) if p["dtype"] == "int16" else (lambda a, g, j: a)
    if p["dtype"] == "int8":      # requantised where the gates read it: no int16 copy in the arena
        def fx(g, n, t, j):
            return rq_x(acc[g, n, t, j], g, j)
    else:
        fx16 = te.compute((4, N, Tn, H), lambda g, n, t, j: rq_x(bias(acc[g, n, t, j], g, j), g, j)
                          .astype("int16"), name="lstm16_xproj")

        def fx(g, n, t, j):
            return fx16[g, n, t, j].astype("int32")
    h, cst = xs[13], xs[14]
    hs = []
    for t in range(Tn):
        h, cst = _step(P, fx, h, cst, wh, t)
        hs.append(h)
    if cell:
        return te.compute(tuple(int(v) for v in cst.shape), lambda n, j: cst[n, j], name="lstm16_c")
    twin = cell_twin(k, node)
    if twin is not None:
        k.also_writes(twin, cst)            # the final cell state: the last step's cell stage itself

    def gather(*i):
        n, t, j = (i[1], i[0], i[2]) if tm else i
        v = hs[-1][n, j]
        for s in range(Tn - 2, -1, -1):
            v = tirx.Select(t == s, hs[s][n, j], v)
        return v
    return te.compute(ty.shape, gather, name="lstm16")
