"""What the TFLite import converters share (each converter lives with its op, in frontend/ops):
reading builtin options, fused activations and paddings, checking input counts, dequantising
constant weights of hybrid models, bias operands and window attributes. A converter is
``fn(imp, k, op, ins, out)``: ``imp`` the importer (frontend/tflite_import.py: its helpers read
and check tensors and emit nodes), ``k`` the operator index, ``op`` the flatbuffer Operator,
``ins`` its input tensor indices (-1: an absent optional input), ``out`` its output tensor index.
TFLite's own Prepare() checks are in frontend/tflite_checks.py.
"""
from __future__ import annotations

import math

import numpy as np

from .. import tflite_checks as chk
from ..errors import KilnError
from ..limits import check as check_limit
from ..registry import TFLITE_IMPORTERS, TFLiteExport, get_op

ACT = {0: "none", 1: "relu", 3: "relu6"}
ACT_NAMES = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
PAD = {0: "same", 1: "valid"}
MAX_RESHAPE_DIMS = 8       # TFLITE_RESHAPE_PARAMS_MAX_DIMENSION_COUNT
# export side: Kiln's names -> TFLite enum values
ACT_CODES = {"none": 0, "relu": 1, "relu6": 3}
PAD_CODES = {"same": 0, "valid": 1}


def importer(*builtins):
    """Decorator: ``fn`` converts the TFLite builtin op(s) ``builtins`` (the importer's table)."""
    def deco(fn):
        for b in builtins:
            if b in TFLITE_IMPORTERS:
                raise ValueError(f"TFLite builtin {b} has two import converters")
            TFLITE_IMPORTERS[b] = fn
        return fn
    return deco


def exporter(*ops, versions=None, fuses_activation=False):
    """Decorator: ``fn(e, node, act, out, int8)`` writes the Kiln op(s) ``ops`` to a .tflite."""
    def deco(fn):
        for name in ops:
            get_op(name).tflite = TFLiteExport(fn, dict(versions or {}), fuses_activation)
        return fn
    return deco


class ExportError(KilnError):
    """A graph uses something the .tflite exporter cannot express."""


def where(k, name):
    return f"operator {k} ({name})"


def options(imp, k, op, opname, cls_name):
    """The operator's builtin options table (None when absent: TFLite then reads zeros). Options of
    another type than the op's own are refused (cls_name None: the op takes none)."""
    import tflite
    tab = op.BuiltinOptions()
    if tab is None:
        return None
    want = getattr(tflite.BuiltinOptions, cls_name) if cls_name else 0
    got = int(op.BuiltinOptionsType())
    if got != want:
        raise imp.err(f"{where(k, opname)}: builtin_options_type = {got} is out of range: allowed {want} "
                      f"({cls_name or 'NONE'})")
    if cls_name is None:
        return None
    o = getattr(tflite, cls_name)()
    o.Init(tab.Bytes, tab.Pos)
    return o


def activation(imp, k, opname, code):
    code = int(code)
    if code not in ACT:
        raise imp.err(f"{where(k, opname)}: fused_activation_function = {ACT_NAMES.get(code, code)} is not supported "
                      f"(Kiln imports NONE, RELU, RELU6)")
    return ACT[code]


def padding(imp, k, opname, code):
    if int(code) not in PAD:
        raise imp.err(f"{where(k, opname)}: padding = {int(code)} is out of range: allowed 0 (SAME) or 1 (VALID)")
    return PAD[int(code)]


def need(imp, k, opname, ins, n_min, n_max=None, optional=()):
    """n_min..n_max inputs; only the positions in ``optional`` may be -1 (absent)."""
    n_max = n_min if n_max is None else n_max
    if not n_min <= len(ins) <= n_max or any(v < 0 for j, v in enumerate(ins) if j not in optional):
        raise imp.err(f"{where(k, opname)} has inputs {ins}; expected {n_min}{'' if n_max == n_min else '-' + str(n_max)}"
                      f" tensors{' (' + ', '.join(f'input {j} may be -1' for j in optional) + ')' if optional else ''}")


def dequantized(imp, i, k, opname, what):
    """Constant tensor i (int8 with scales, or float16) as float32, as TFLite's DEQUANTIZE computes
    it: float32(scale * (q - zero_point)), per channel along the quantised axis."""
    t = imp.tensors[i]
    data = imp.const(i, k, opname, what)
    if data.dtype == np.float32:
        return data
    imp.g.meta.setdefault("dequantized_weights", []).append(t["name"])
    if t["dtype"] == "float16":
        return np.asarray(data, np.float32)
    q = t["quant"]
    if t["dtype"] != "int8" or q is None:
        raise imp.err(f"{where(k, opname)}: {what} {imp.label(i)} is {t['dtype']}"
                      f"{' without quantisation parameters' if q is None else ''}; a float op takes float32 "
                      f"weights or int8 weights with scales (dynamic-range quantisation)")
    s = np.asarray(q.scale, np.float64)
    z = np.asarray(q.zero_point, np.float64)
    if len(s) > 1:
        shape = [1] * data.ndim
        shape[q.axis] = len(s)
        s, z = s.reshape(shape), z.reshape(shape)
    return (s * (data.astype(np.float64) - z)).astype(np.float32)


def symmetric(imp, k, name, i):
    """TFLite's hybrid (float input, int8 weight) kernels ignore the weights' zero points."""
    q = imp.tensors[i]["quant"]
    bad = [z for z in (q.zero_point if q is not None else ()) if z != 0]
    if bad:
        raise imp.err(f"{where(k, name)}: int8 weight {imp.label(i)} zero_point {bad[0]} is out of range: allowed 0 "
                      f"(TFLite's dynamic-range kernels assume symmetric weights)")


def check_work(imp, k, name, out_shape, taps):
    """The reference and the generated code visit every window tap of every output element."""
    check_limit("max_tensor_elements", math.prod(out_shape) * taps, f"{imp.where} {where(k, name)} (window taps)")


def window_attrs(imp, k, name, o, dilated=True):
    w = where(k, name)
    attrs = dict(stride=[chk.window(imp.err, w, "stride_h", o.StrideH()), chk.window(imp.err, w, "stride_w", o.StrideW())],
                 padding=padding(imp, k, name, o.Padding()))
    if dilated:
        attrs["dilation"] = [chk.window(imp.err, w, "dilation_h_factor", o.DilationHFactor()),
                             chk.window(imp.err, w, "dilation_w_factor", o.DilationWFactor())]
    return attrs


def bias(imp, k, name, ins, out_dtype, channels):
    """The bias operand (or None): int32 for int8 ops, float32 for float ones, `channels` long."""
    if len(ins) < 3 or ins[2] < 0:
        return None
    b = imp.tensors[ins[2]]
    want = {"int8": "int32", "int16": "int64"}.get(out_dtype, "float32")
    if out_dtype == "int16" and b["dtype"] == "int32":     # TFLite's 16x8 kernels also take an int32 bias
        want = "int32"
    if b["dtype"] != want or math.prod(b["shape"]) != channels:
        raise imp.err(f"{where(k, name)}: bias {imp.label(ins[2])} is {b['dtype']}{list(b['shape'])}; TFLite needs "
                      f"{want}[{channels}]")
    return imp.value(ins[2], k, name)


