"""The quantised ``lstm``: TFLite Micro's ``EvalLstm`` (``micro/kernels/lstm_eval.h``,
``lstm_eval_common.cc``) for both its integer instantiations, the one definition of Kiln's int8
and int16 LSTMs (``int8_ref`` and its int16 branch):

- 16x8 ``EvalLstm<int16_t, int8_t, int16_t, int64_t>``: int16 input, output and output state
  (zero point 0), int64 biases; the gate products use int64 accumulators and the 16x8 kernels'
  ``MBQM64``. LiteRT has no 16x8 LSTM, so TFLite Micro's kernel is the definition.
- int8 ``EvalLstm<int8_t, int8_t, int16_t, int32_t>``: int8 input, output and output state (any
  zero point: the FCs' input offset, the output's offset), int32 biases; int32 accumulators and
  the int32 ``MBQM``. LiteRT's int8 kernel (``EvalInteger8x8_16``) differs by 1 in some values
  (docs/int8_ir.md); Kiln follows TFLite Micro.

Both take symmetric int8 weights (one scale per tensor) and an int16 cell state. Per step and
gate (forget, input, cell, output)::

    fx = clamp16(RQ(sum((x - z_x) W_x^T) + b, m_x))   m_x from s_x * s_w_x / 2**-12 (double)
    fh = clamp16(RQ(sum((h - z_h) W_h^T), m_h))       m_h from s_h * s_w_h / 2**-12
    gate = sigmoid16(sat16(fx + fh))            the cell gate: tanh16; both TFLite's int16
                                                LOGISTIC / TANH tables on Q3.12
    c = sat16(clamp16(MBQM(f * c, m_fc)) + clamp16(MBQM(i * g, m_ig)))   (clipped when cell_clip > 0)
    h = clamp(MBQM(tanh16(c) * o, m_h_out) + z_h)    (to int8 or int16)

``RQ`` is ``MBQM64`` (int16; its int64 result converted to int32, keeping the low 32 bits, before
the clamp: ``int16util.wrap32``) or ``MBQM`` (int8), ``MBQM`` the int32 requantisation of the
element-wise multiplications; the multipliers come from double scales: ``m_fc`` from
``2**-15 * s_c / s_c``, ``m_ig`` from ``2**-30 / s_c``, ``m_h_out`` from ``2**-30 / s_h``. The cell
tanh reads the cell as Q(15 + log2 s_c).(-log2 s_c) (log2 rounded as TFLite's ``CheckedLog2``).
Peephole, projection, layer-norm and CIFG LSTMs are not supported by TFLite Micro's kernel; the
importer refuses them.
"""
from __future__ import annotations

import numpy as np

from .. import fixedpoint as fp
from ..errors import ShapeError
from ..registry import defrule
from .int8util import per_tensor
from .int16util import INT16, checked_log2, int16_branch, logistic16, mbqm64, tanh16
from .recurrent import GATES, LSTM_INPUTS

GATE_IN_SCALE = np.float32(2.0 ** -12)          # Q3.12, the activations' input
GATE_OUT_SCALE = np.float32(2.0 ** -15)         # Q0.15, the activations' output


def _sat16(v):
    return np.clip(v, -32768, 32767)


def _check_types(in_types, out_type):
    act = in_types[0].dtype
    if act not in ("int8", INT16):
        raise ShapeError(f"lstm: the quantised LSTM takes int8 or int16 activations, got input x {in_types[0]}")
    bias = "int32" if act == "int8" else "int64"
    want = {0: act, 13: act, 14: INT16}
    want.update({j: "int8" for j in range(1, 9)})
    want.update({j: bias for j in range(9, 13)})
    for j, d in want.items():
        if in_types[j].dtype != d:
            raise ShapeError(f"lstm: the {act} LSTM takes {act} activations and output state, an int16 cell state, "
                             f"int8 weights and {bias} biases; {LSTM_INPUTS[j]} is {in_types[j]}")
    if out_type.dtype != act:
        raise ShapeError(f"lstm: the {act} LSTM's output is {act}, got {out_type}")
    symmetric = ((14, "cell state c0"),) if act == "int8" else ((0, "input x"), (13, "output state h0"),
                                                                (14, "cell state c0"))
    for j, what in symmetric:
        if per_tensor(in_types[j], what, "lstm")[1] != 0:
            raise ShapeError(f"lstm: the {act} LSTM's {what} must have zero point 0 (symmetric), got {in_types[j]}")
    if per_tensor(out_type, "output", "lstm") != per_tensor(in_types[13], "output state h0", "lstm"):
        raise ShapeError(f"lstm: the output state h0 {in_types[13]} and the output {out_type} must share "
                         f"quantisation (the output state is the previous step's output)")


def _fc_multiplier(s_in, t_w, what):
    s_w, z_w = per_tensor(t_w, what, "lstm")
    if z_w != 0:
        raise ShapeError(f"lstm: {what} must be symmetric int8 (zero point 0), got {t_w}")
    # CalculateOpDataFullyConnected -> GetQuantizedConvolutionMultipler: double product and quotient
    return fp.quantize_multiplier(float(np.float32(s_in)) * float(np.float32(s_w)) / float(GATE_IN_SCALE))


def _mul_multiplier(s1, s2, s_out):
    """CreateInterGateMulParams: the double product of two float scales over a float scale."""
    return fp.quantize_multiplier(float(np.float32(s1)) * float(np.float32(s2)) / float(np.float32(s_out)))


def lstm_16x8_params(in_types, out_type, clip):
    """What TFLite Micro's Prepare computes: the 8 FC multipliers, the 3 element-wise multiplication
    multipliers, the cell tanh's input multiplier and shift, the quantised cell clip; the input and
    hidden zero points (0 for int16) and the activation dtype."""
    _check_types(in_types, out_type)
    s_x, z_x = per_tensor(in_types[0], "input x", "lstm")
    s_h, z_h = per_tensor(in_types[13], "output state h0", "lstm")
    s_c = per_tensor(in_types[14], "cell state c0", "lstm")[0]
    p = {"mx": [_fc_multiplier(s_x, in_types[1 + k], f"input weights of gate {GATES[k]}") for k in range(4)],
         "mh": [_fc_multiplier(s_h, in_types[5 + k], f"recurrent weights of gate {GATES[k]}") for k in range(4)],
         "fc": _mul_multiplier(GATE_OUT_SCALE, s_c, s_c),
         "ig": _mul_multiplier(GATE_OUT_SCALE, GATE_OUT_SCALE, s_c),
         "ho": _mul_multiplier(GATE_OUT_SCALE, GATE_OUT_SCALE, s_h),
         "z_x": z_x, "z_h": z_h, "dtype": in_types[0].dtype}
    power = checked_log2(s_c)[1]                     # TFLite Micro does not require a power of two
    if not -27 <= power <= 0:
        raise ShapeError(f"lstm: cell state scale {s_c} (about 2**{power}) is out of range: the 16x8 kernel's tanh "
                         f"shifts the cell by 12 + log2 scale, which int32 holds for 2**-27 .. 2**0")
    shift = 15 + power - 3
    p["tanh"] = (0, shift) if shift >= 0 else (3, -shift)
    p["power"] = power
    # CreateLstmCellStateInfo: static_cast<int16_t>(min(max(double clip / double scale, -32768), 32767))
    p["clip"] = int(min(max(float(np.float32(clip)) / float(np.float32(s_c)), -32768.0), 32767.0)) if clip > 0 else 0
    return p


def _fc(p, v, z, w, bias, m):
    """TFLite Micro's integer FullyConnected to int16: int64 accumulator and MBQM64 for int16
    input, int32 accumulator, input offset ``-z`` and the int32 MBQM for int8 input."""
    acc = (v - z) @ w.astype(np.int64).T
    if bias is not None:
        acc = acc + bias
    if p["dtype"] == "int8":
        return _sat16(fp.multiply_by_quantized_multiplier(acc, *m))
    return _sat16(mbqm64(acc, *m))


def _mul(a, b, m):
    return _sat16(fp.multiply_by_quantized_multiplier(a * b, *m))


def step_16x8(p, xt, h, c, wx, wh, b):
    """One time step on int64 arrays [N, I], [N, H], [N, H]: (new h, new c)."""
    gates = []
    for k in range(4):
        pre = _sat16(_fc(p, xt, p["z_x"], wx[k], b[k], p["mx"][k]) + _fc(p, h, p["z_h"], wh[k], None, p["mh"][k]))
        gates.append(tanh16(pre, 0, 0) if k == 2 else logistic16(pre, 0, 0))
    i, f, g, o = (v.astype(np.int64) for v in gates)
    c = _sat16(_mul(f, c, p["fc"]) + _mul(i, g, p["ig"]))
    if p["clip"] > 0:
        c = np.clip(c, -p["clip"], p["clip"])
    tc = tanh16(c, *p["tanh"]).astype(np.int64)
    info = np.iinfo(p["dtype"])
    h = np.clip(fp.multiply_by_quantized_multiplier(tc * o, *p["ho"]) + p["z_h"], info.min, info.max)
    return h, c


def lstm_16x8_states(xs, attrs, in_types, out_type):
    """The integer recurrence run once: (every step's output in the output's layout and dtype, the
    final int16 cell state). ``out_type`` is the sequence output's type (or, for a cell twin, the
    output state h0's: the two share quantisation). A stateful LSTM's two nodes share one run."""
    p = lstm_16x8_params(in_types, out_type, attrs["cell_clip"])
    x = xs[0].astype(np.int64)
    xb = np.swapaxes(x, 0, 1) if attrs["time_major"] else x
    wx, wh = xs[1:5], xs[5:9]
    b = [v.astype(np.int64) for v in xs[9:13]]
    h, c = xs[13].astype(np.int64), xs[14].astype(np.int64)
    out = np.zeros(xb.shape[:2] + (wx[0].shape[0],), np.int64)
    for t in range(xb.shape[1]):
        h, c = step_16x8(p, xb[:, t], h, c, wx, wh, b)
        out[:, t] = h
    out = np.swapaxes(out, 0, 1) if attrs["time_major"] else out
    return np.ascontiguousarray(out).astype(p["dtype"]), c.astype(INT16)


def lstm_16x8(xs, attrs, in_types, out_type):
    if attrs.get("output") == "cell":           # the final cell state (a stateful LSTM's next c0)
        return lstm_16x8_states(xs, attrs, in_types, in_types[13])[1]
    return lstm_16x8_states(xs, attrs, in_types, out_type)[0]


defrule("lstm", "int8_ref")(lstm_16x8)
int16_branch("lstm", lstm_16x8)
