"""One converter per TFLite builtin op Kiln imports: check what TFLite's kernel Prepare() checks
(inputs, options, dtypes, quantisation; :mod:`.tflite_checks`), then emit the Kiln node(s).

A converter is ``fn(imp, k, op, ins, out)``: ``imp`` the importer (its helpers read and check
tensors), ``k`` the operator index, ``op`` the flatbuffer Operator, ``ins`` its input tensor
indices (-1: an absent optional input), ``out`` its output tensor index.
"""
from __future__ import annotations

import math

import numpy as np

from . import tflite_checks as chk
from .errors import ShapeError
from .limits import check as check_limit
from .ops.nn import conv_geometry
from .types import QParams, TensorType

SUPPORTED = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "AVERAGE_POOL_2D", "MAX_POOL_2D", "ADD",
             "MUL", "RESHAPE", "SOFTMAX", "QUANTIZE", "DEQUANTIZE", "PAD", "MEAN", "CONCATENATION",
             "LOGISTIC", "TANH", "RELU", "RELU6")
_ACT = {0: "none", 1: "relu", 3: "relu6"}
_ACT_NAMES = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
_PAD = {0: "same", 1: "valid"}
MAX_RESHAPE_DIMS = 8       # TFLITE_RESHAPE_PARAMS_MAX_DIMENSION_COUNT


def _w(k, name):
    return f"operator {k} ({name})"


def _opts(imp, k, op, opname, cls_name):
    """The operator's builtin options table (None when absent: TFLite then reads zeros). Options of
    another type than the op's own are refused (cls_name None: the op takes none)."""
    import tflite
    tab = op.BuiltinOptions()
    if tab is None:
        return None
    want = getattr(tflite.BuiltinOptions, cls_name) if cls_name else 0
    got = int(op.BuiltinOptionsType())
    if got != want:
        raise imp.err(f"{_w(k, opname)}: builtin_options_type = {got} is out of range: allowed {want} "
                      f"({cls_name or 'NONE'})")
    if cls_name is None:
        return None
    o = getattr(tflite, cls_name)()
    o.Init(tab.Bytes, tab.Pos)
    return o


def _act(imp, k, opname, code):
    code = int(code)
    if code not in _ACT:
        raise imp.err(f"{_w(k, opname)}: fused_activation_function = {_ACT_NAMES.get(code, code)} is not supported "
                      f"(Kiln imports NONE, RELU, RELU6)")
    return _ACT[code]


def _padding(imp, k, opname, code):
    if int(code) not in _PAD:
        raise imp.err(f"{_w(k, opname)}: padding = {int(code)} is out of range: allowed 0 (SAME) or 1 (VALID)")
    return _PAD[int(code)]


def _need(imp, k, opname, ins, n_min, n_max=None, optional=()):
    """n_min..n_max inputs; only the positions in ``optional`` may be -1 (absent)."""
    n_max = n_min if n_max is None else n_max
    if not n_min <= len(ins) <= n_max or any(v < 0 for j, v in enumerate(ins) if j not in optional):
        raise imp.err(f"{_w(k, opname)} has inputs {ins}; expected {n_min}{'' if n_max == n_min else '-' + str(n_max)}"
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
        raise imp.err(f"{_w(k, opname)}: {what} {imp.label(i)} is {t['dtype']}"
                      f"{' without quantisation parameters' if q is None else ''}; a float op takes float32 "
                      f"weights or int8 weights with scales (dynamic-range quantisation)")
    s = np.asarray(q.scale, np.float64)
    z = np.asarray(q.zero_point, np.float64)
    if len(s) > 1:
        shape = [1] * data.ndim
        shape[q.axis] = len(s)
        s, z = s.reshape(shape), z.reshape(shape)
    return (s * (data.astype(np.float64) - z)).astype(np.float32)


def _symmetric(imp, k, name, i):
    """TFLite's hybrid (float input, int8 weight) kernels ignore the weights' zero points."""
    q = imp.tensors[i]["quant"]
    bad = [z for z in (q.zero_point if q is not None else ()) if z != 0]
    if bad:
        raise imp.err(f"{_w(k, name)}: int8 weight {imp.label(i)} zero_point {bad[0]} is out of range: allowed 0 "
                      f"(TFLite's dynamic-range kernels assume symmetric weights)")


def _check_work(imp, k, name, out_shape, taps):
    """The reference and the generated code visit every window tap of every output element."""
    check_limit("max_tensor_elements", math.prod(out_shape) * taps, f"{imp.where} {_w(k, name)} (window taps)")


def _window_attrs(imp, k, name, o, dilated=True):
    w = _w(k, name)
    attrs = dict(stride=[chk.window(imp.err, w, "stride_h", o.StrideH()), chk.window(imp.err, w, "stride_w", o.StrideW())],
                 padding=_padding(imp, k, name, o.Padding()))
    if dilated:
        attrs["dilation"] = [chk.window(imp.err, w, "dilation_h_factor", o.DilationHFactor()),
                             chk.window(imp.err, w, "dilation_w_factor", o.DilationWFactor())]
    return attrs


def _bias(imp, k, name, ins, out_dtype, channels):
    """The bias operand (or None): int32 for int8 ops, float32 for float ones, `channels` long."""
    if len(ins) < 3 or ins[2] < 0:
        return None
    b = imp.tensors[ins[2]]
    want = "int32" if out_dtype == "int8" else "float32"
    if b["dtype"] != want or math.prod(b["shape"]) != channels:
        raise imp.err(f"{_w(k, name)}: bias {imp.label(ins[2])} is {b['dtype']}{list(b['shape'])}; TFLite needs "
                      f"{want}[{channels}]")
    return imp.value(ins[2], k, name)


def _conv_geometry(imp, k, name, xshape, wshape, attrs):
    try:
        G = conv_geometry(xshape, wshape, attrs)
    except ShapeError as e:
        raise imp.err(f"{_w(k, name)}: {e}") from None
    check_limit("max_tensor_elements", G["N"] * (G["H"] + G["pt"] + G["pb"]) * (G["W"] + G["pl"] + G["pr"]) * G["C"],
                f"{imp.where} {_w(k, name)} (padded input)")
    _check_work(imp, k, name, (G["N"], G["oh"], G["ow"], G["O"]), G["KH"] * G["KW"] * G["I"])
    return G


def _filter(imp, k, name, ins):
    """(input value, input dtype, filter array, filter QParams or None) for a conv: float32 filters
    for float inputs (int8 ones dequantised: a hybrid model), int8 for int8 inputs."""
    w = _w(k, name)
    x_i, w_i = ins[0], ins[1]
    xt = imp.activation_type(x_i, w)
    wt = imp.tensors[w_i]
    wdata = imp.const(w_i, k, name, "the filter")
    if len(xt["shape"]) != 4 or wdata.ndim != 4 or min(xt["shape"][1:]) < 1 or min(wdata.shape) < 1:
        raise imp.err(f"{w}: input {list(xt['shape'])} and filter {list(wdata.shape)} must be 4-D with every "
                      f"dimension >= 1 (batch may be 0)")
    if xt["dtype"] == "float32":
        if wt["dtype"] not in ("int8", "float32"):
            raise imp.err(f"{w}: float input with a {wt['dtype']} filter {imp.label(w_i)}; TFLite needs float32 "
                          f"or (dynamic-range quantisation) int8")
        if wt["dtype"] == "int8":
            _symmetric(imp, k, name, w_i)
        return imp.operand(x_i, k, name), "float32", dequantized(imp, w_i, k, name, "the filter"), None
    if wt["dtype"] != "int8":
        raise imp.err(f"{w}: int8 input with a {wt['dtype']} filter {imp.label(w_i)}; TFLite needs an int8 filter")
    return imp.operand(x_i, k, name), "int8", wdata, wt["quant"]


def _conv(imp, k, op, ins, out):
    name = "CONV_2D"
    _need(imp, k, name, ins, 3)          # TFLite's CONV_2D requires the bias
    o = _opts(imp, k, op, name, "Conv2DOptions")
    if o is None:
        raise imp.err(f"{_w(k, name)} has no Conv2DOptions (TFLite then reads strides of 0 and rejects it)")
    attrs = _window_attrs(imp, k, name, o)
    act = _act(imp, k, name, o.FusedActivationFunction())
    x, dtype, wdata, wq = _filter(imp, k, name, ins)
    xt = imp.g.types[x]
    C, I, O = xt.shape[3], wdata.shape[3], wdata.shape[0]
    if C % I or O % (C // I):
        raise imp.err(f"{_w(k, name)}: input channels {C} and filter {list(wdata.shape)} do not match (need input "
                      f"channels divisible by filter channels and output channels by the groups)")
    attrs["groups"] = C // I
    _conv_geometry(imp, k, name, xt.shape, wdata.shape, attrs)
    if dtype == "int8":
        chk.conv_quant(imp.err, _w(k, name), xt.quant, wq, imp.tensors[ins[2]]["quant"], imp.tensors[out]["quant"],
                       wdata.shape, O, act, lambda axis: axis == 0)
    wname = imp._vname(imp.tensors[ins[1]]["name"])
    imp.g.add_const(wname, wdata, wq)
    inputs = [x, wname] + [b for b in [_bias(imp, k, name, ins, dtype, O)] if b is not None]
    imp.values[out] = imp.emit(k, name, "conv2d", inputs, dict(attrs, activation=act), out)


def _depthwise(imp, k, op, ins, out):
    name = "DEPTHWISE_CONV_2D"
    _need(imp, k, name, ins, 2, 3)
    o = _opts(imp, k, op, name, "DepthwiseConv2DOptions")
    if o is None:
        raise imp.err(f"{_w(k, name)} has no DepthwiseConv2DOptions (TFLite then reads strides of 0 and rejects it)")
    attrs = _window_attrs(imp, k, name, o)
    act = _act(imp, k, name, o.FusedActivationFunction())
    x, dtype, wdata, wq = _filter(imp, k, name, ins)
    xt = imp.g.types[x]
    C = xt.shape[3]
    if wdata.shape[0] != 1 or wdata.shape[3] % C:
        raise imp.err(f"{_w(k, name)}: filter {list(wdata.shape)} does not fit input {list(xt.shape)} "
                      f"(expected [1, KH, KW, C*M])")
    O = wdata.shape[3]
    if dtype == "int8":
        chk.conv_quant(imp.err, _w(k, name), xt.quant, wq, imp.tensors[ins[2]]["quant"] if len(ins) == 3 else None,
                       imp.tensors[out]["quant"], wdata.shape, O, act, lambda axis: axis == 3)
        if wq.per_channel and len(wq.scale) > 1:
            wq = QParams(wq.scale, wq.zero_point, 0)
    attrs["groups"] = C
    w_ohwi = np.ascontiguousarray(np.transpose(wdata, (3, 1, 2, 0)))
    _conv_geometry(imp, k, name, xt.shape, w_ohwi.shape, attrs)
    wname = imp._vname(imp.tensors[ins[1]]["name"] + "_ohwi")
    imp.g.add_const(wname, w_ohwi, wq)
    inputs = [x, wname] + [b for b in [_bias(imp, k, name, ins, dtype, O)] if b is not None]
    imp.values[out] = imp.emit(k, name, "conv2d", inputs, dict(attrs, activation=act), out)


def _fc(imp, k, op, ins, out):
    name = "FULLY_CONNECTED"
    w = _w(k, name)
    _need(imp, k, name, ins, 2, 3, optional=(2,))
    o = _opts(imp, k, op, name, "FullyConnectedOptions")
    if o is not None and int(o.WeightsFormat()) != 0:
        raise imp.err(f"{w}: weights_format = {int(o.WeightsFormat())} is out of range: Kiln imports 0 (DEFAULT)")
    act = _act(imp, k, name, o.FusedActivationFunction() if o else 0)
    keep = bool(o.KeepNumDims()) if o else False
    xt = imp.activation_type(ins[0], w)
    wt = imp.tensors[ins[1]]
    wdata = imp.const(ins[1], k, name, "the weights")
    if wdata.ndim != 2 or min(wdata.shape) < 1 or math.prod(xt["shape"]) % wdata.shape[1]:
        raise imp.err(f"{w}: weights {list(wdata.shape)} do not fit input {list(xt['shape'])} (need [N, K], K "
                      f"dividing the input's elements)")
    N = wdata.shape[0]
    wq = None
    if xt["dtype"] == "float32":
        if wt["dtype"] == "int8":
            _symmetric(imp, k, name, ins[1])
        elif wt["dtype"] != "float32":
            raise imp.err(f"{w}: float input with {wt['dtype']} weights {imp.label(ins[1])}; TFLite needs float32 "
                          f"or (dynamic-range quantisation) int8")
        wdata = dequantized(imp, ins[1], k, name, "the weights")
    elif wt["dtype"] != "int8":
        raise imp.err(f"{w}: int8 input with {wt['dtype']} weights {imp.label(ins[1])}; TFLite needs int8 weights")
    else:
        wq = wt["quant"]
        bq = imp.tensors[ins[2]]["quant"] if len(ins) == 3 and ins[2] >= 0 else None
        if wq is not None and len(wq.scale) > 1:
            chk.conv_quant(imp.err, w, xt["quant"], wq, bq, imp.tensors[out]["quant"], wdata.shape, N, act,
                           lambda axis: axis == 0)
        else:
            chk.fc_per_tensor(imp.err, w, xt["quant"], wq, len(ins) == 3 and ins[2] >= 0, bq,
                              imp.tensors[out]["quant"], act)
    x = imp.operand(ins[0], k, name)
    wname = imp._vname(wt["name"])
    imp.g.add_const(wname, wdata, wq)
    xtt = imp.g.types[x]
    _check_work(imp, k, name, imp.tensors[out]["shape"], wdata.shape[1])
    if not keep and len(xtt.shape) != 2:
        flat = imp._vname(x + "_flat")
        imp.g.add_node("reshape", [x], {"shape": [xtt.size // wdata.shape[1], wdata.shape[1]]}, name=flat,
                       out_type=TensorType((xtt.size // wdata.shape[1], wdata.shape[1]), xtt.dtype, xtt.quant))
        x = flat
    inputs = [x, wname] + [b for b in [_bias(imp, k, name, ins, xt["dtype"], N)] if b is not None]
    imp.values[out] = imp.emit(k, name, "dense", inputs, {"activation": act}, out)


def _pool(kop, name):
    def conv(imp, k, op, ins, out):
        _need(imp, k, name, ins, 1)
        o = _opts(imp, k, op, name, "Pool2DOptions")
        if o is None:
            raise imp.err(f"{_w(k, name)} has no Pool2DOptions (TFLite then reads strides of 0 and rejects it)")
        w = _w(k, name)
        attrs = _window_attrs(imp, k, name, o, dilated=False)
        attrs["pool"] = [chk.window(imp.err, w, "filter_height", o.FilterHeight()),
                         chk.window(imp.err, w, "filter_width", o.FilterWidth())]
        act = _act(imp, k, name, o.FusedActivationFunction())
        x = imp.operand(ins[0], k, name)
        if imp.g.types[x].dtype == "int8":
            chk.same_quant(imp.err, w, imp.g.types[x].quant, imp.tensors[out]["quant"], "the input's")
            chk.activation_range(imp.err, w, act, imp.tensors[out]["quant"].scale[0])
        _check_work(imp, k, name, imp.tensors[out]["shape"], attrs["pool"][0] * attrs["pool"][1])
        imp.finish(k, name, kop, [x], attrs, out, act)
    return conv


def _binary(kop, name, opts_cls):
    def conv(imp, k, op, ins, out):
        _need(imp, k, name, ins, 2)
        o = _opts(imp, k, op, name, opts_cls)
        act = _act(imp, k, name, o.FusedActivationFunction() if o else 0)
        xs = [imp.operand(i, k, name) for i in ins]
        ts = [imp.g.types[v] for v in xs]
        if ts[0].dtype == "int8" and ts[1].dtype == "int8":
            check = chk.add_quant if kop == "add" else chk.mul_quant
            check(imp.err, _w(k, name), ts[0].quant, ts[1].quant, imp.tensors[out]["quant"], act)
        imp.finish(k, name, kop, xs, {}, out, act)
    return conv


def _unary(kop, name):
    def conv(imp, k, op, ins, out):
        _need(imp, k, name, ins, 1)
        _opts(imp, k, op, name, None)
        x = imp.operand(ins[0], k, name)
        xt, oq, w = imp.g.types[x], imp.tensors[out]["quant"], _w(k, name)
        if xt.dtype == "int8":
            if kop == "sigmoid":
                chk.logistic_quant(imp.err, w, xt.quant, oq)
            elif kop == "tanh":
                chk.per_tensor(imp.err, w, xt.quant, "the input")
                chk.per_tensor(imp.err, w, oq, "the output")
            else:
                chk.ratio_quant(imp.err, w, xt.quant, oq)
                chk.activation_range(imp.err, w, kop, oq.scale[0])
        imp.values[out] = imp.emit(k, name, kop, [x], {}, out)
    return conv


def _reshape(imp, k, op, ins, out):
    name = "RESHAPE"
    w = _w(k, name)
    _need(imp, k, name, ins, 1, 2, optional=(1,))
    x = imp.operand(ins[0], k, name)
    xt = imp.g.types[x]
    if len(ins) == 2 and ins[1] >= 0 and len(imp.tensors[ins[1]]["shape"]) == 1 \
            and imp.tensors[ins[1]]["dtype"] == "int32":
        new = [int(v) for v in imp.const(ins[1], k, name, "the shape tensor")]
    else:
        o = _opts(imp, k, op, name, "ReshapeOptions")
        new = [int(v) for v in o.NewShapeAsNumpy()] if o is not None and o.NewShapeLength() else []
        if len(new) > MAX_RESHAPE_DIMS:
            raise imp.err(f"{w}: new_shape has {len(new)} dimensions; allowed at most {MAX_RESHAPE_DIMS}")
        if new == [0]:
            new = []
    want = chk.reshape_shape(imp.err, w, xt.shape, new)
    if tuple(want) != tuple(imp.tensors[out]["shape"]):
        raise imp.err(f"{w}: output {imp.label(out)} has shape {list(imp.tensors[out]['shape'])} but TFLite reshapes "
                      f"to {want}")
    if xt.dtype == "int8":
        chk.same_quant(imp.err, w, xt.quant, imp.tensors[out]["quant"], "the input's")
    imp.values[out] = imp.emit(k, name, "reshape", [x], {"shape": list(want)}, out)


def _softmax(imp, k, op, ins, out):
    name = "SOFTMAX"
    _need(imp, k, name, ins, 1)
    o = _opts(imp, k, op, name, "SoftmaxOptions")
    beta = float(o.Beta()) if o else 0.0
    if beta != 1.0:
        raise imp.err(f"{_w(k, name)}: beta = {beta} is out of range: Kiln's softmax has beta 1")
    x = imp.operand(ins[0], k, name)
    xt = imp.g.types[x]
    if not xt.shape:
        raise imp.err(f"{_w(k, name)}: the input is a scalar; TFLite's softmax needs rank >= 1")
    if xt.dtype == "int8":
        chk.softmax_quant(imp.err, _w(k, name), xt.quant, imp.tensors[out]["quant"])
    imp.values[out] = imp.emit(k, name, "softmax", [x], {"axis": -1}, out)


def _quantize(imp, k, op, ins, out):
    name = "QUANTIZE"
    w = _w(k, name)
    _need(imp, k, name, ins, 1)
    _opts(imp, k, op, name, "QuantizeOptions")
    x = imp.operand(ins[0], k, name)
    ot = imp.tensors[out]
    if ot["dtype"] != "int8":
        raise imp.err(f"{w}: output {imp.label(out)} is {ot['dtype']}; Kiln's QUANTIZE produces int8")
    chk.per_tensor(imp.err, w, ot["quant"], f"output {imp.label(out)}")
    q = ot["quant"]
    if imp.g.types[x].dtype == "int8":
        chk.ratio_quant(imp.err, w, imp.g.types[x].quant, q)
    attrs = {"scale": list(q.scale), "zero_point": list(q.zero_point), "dtype": "int8"}
    imp.values[out] = imp.emit(k, name, "quantize", [x], attrs, out)


def _dequantize(imp, k, op, ins, out):
    """A DEQUANTIZE of a constant (fp16 or int8 weights) folds into a float32 constant; of an int8
    activation it is a dequantize node."""
    name = "DEQUANTIZE"
    w = _w(k, name)
    _need(imp, k, name, ins, 1)
    _opts(imp, k, op, name, "DequantizeOptions")
    ot = imp.tensors[out]
    it = imp.tensors[ins[0]]
    if ot["dtype"] != "float32" or tuple(ot["shape"]) != tuple(it["shape"]):
        raise imp.err(f"{w}: output {imp.label(out)} is {ot['dtype']}{list(ot['shape'])}; TFLite's DEQUANTIZE "
                      f"writes float32{list(it['shape'])}")
    if ins[0] in imp.folded or it["data"] is not None:
        imp.folded[out] = dequantized(imp, ins[0], k, name, "the input")
        return
    x = imp.operand(ins[0], k, name)
    if imp.g.types[x].dtype != "int8":
        raise imp.err(f"{w}: input {imp.label(ins[0])} is {imp.g.types[x].dtype}; TFLite's DEQUANTIZE reads int8 "
                      f"(or constant float16) tensors")
    chk.per_tensor(imp.err, w, imp.g.types[x].quant, "the input")
    imp.values[out] = imp.emit(k, name, "dequantize", [x], {"dtype": "float32"}, out)


def _pad(imp, k, op, ins, out):
    name = "PAD"
    w = _w(k, name)
    _need(imp, k, name, ins, 2)
    _opts(imp, k, op, name, "PadOptions")
    x = imp.operand(ins[0], k, name)
    pt = imp.tensors[ins[1]]
    if pt["dtype"] not in ("int32", "int64"):
        raise imp.err(f"{w}: paddings {imp.label(ins[1])} are {pt['dtype']}; TFLite needs int32 or int64")
    p = np.asarray(imp.const(ins[1], k, name, "paddings"), np.int64)
    nd = len(imp.g.types[x].shape)
    if nd > chk.PAD_MAX_RANK:
        raise imp.err(f"{w}: input rank {nd} is out of range: TFLite pads up to rank {chk.PAD_MAX_RANK}")
    if p.shape != (nd, 2) or np.any(p < 0):
        raise imp.err(f"{w}: paddings {p.tolist()} must be non-negative with shape [{nd}, 2]")
    if imp.g.types[x].dtype == "int8":
        chk.same_quant(imp.err, w, imp.g.types[x].quant, imp.tensors[out]["quant"], "the input's")
    check_limit("max_tensor_elements", math.prod(int(d) + int(a) + int(b) for d, (a, b) in
                                                 zip(imp.g.types[x].shape, p)), f"{imp.where} {w}")
    imp.values[out] = imp.emit(k, name, "pad", [x], {"pads": [int(v) for v in p.ravel()], "value": 0.0}, out)


def _mean(imp, k, op, ins, out):
    name = "MEAN"
    w = _w(k, name)
    _need(imp, k, name, ins, 2)
    x = imp.operand(ins[0], k, name)
    if imp.tensors[ins[1]]["dtype"] != "int32":
        raise imp.err(f"{w}: axes {imp.label(ins[1])} are {imp.tensors[ins[1]]['dtype']}; TFLite needs int32")
    ax = np.atleast_1d(np.asarray(imp.const(ins[1], k, name, "axes"), np.int64)).ravel()
    nd = len(imp.g.types[x].shape)
    if ax.size == 0 or np.any(ax < -nd) or np.any(ax >= nd):
        raise imp.err(f"{w}: axes {ax.tolist()} are out of range: allowed one or more of {-nd}..{nd - 1}")
    axes = sorted({int(a) % nd for a in ax})
    o = _opts(imp, k, op, name, "ReducerOptions")
    keep = bool(o.KeepDims()) if o else False
    if imp.g.types[x].dtype == "int8":
        chk.ratio_quant(imp.err, w, imp.g.types[x].quant, imp.tensors[out]["quant"])
    imp.values[out] = imp.emit(k, name, "mean", [x], {"axes": axes, "keepdims": keep}, out)


def _concat(imp, k, op, ins, out):
    name = "CONCATENATION"
    w = _w(k, name)
    if not ins or any(i < 0 for i in ins):
        raise imp.err(f"{w} needs at least one input and no absent ones, got {ins}")
    o = _opts(imp, k, op, name, "ConcatenationOptions")
    act = _act(imp, k, name, o.FusedActivationFunction() if o else 0)
    if act != "none":
        raise imp.err(f"{w}: fused_activation_function = {act.upper()} is out of range: TFLite's CONCATENATION "
                      f"allows NONE")
    xs = [imp.operand(i, k, name) for i in ins]
    nd = len(imp.g.types[xs[0]].shape)
    axis = int(o.Axis()) if o else 0
    if not -nd <= axis < nd:
        raise imp.err(f"{w}: axis = {axis} is out of range: allowed {-nd}..{nd - 1}")
    for v in xs:
        if imp.g.types[v].dtype == "int8":
            chk.same_quant(imp.err, w, imp.g.types[v].quant, imp.tensors[out]["quant"], f"input {v!r}")
    imp.values[out] = imp.emit(k, name, "concat", xs, {"axis": axis % nd}, out)


_CONVERT = {
    "CONV_2D": _conv, "DEPTHWISE_CONV_2D": _depthwise, "FULLY_CONNECTED": _fc,
    "AVERAGE_POOL_2D": _pool("avg_pool2d", "AVERAGE_POOL_2D"), "MAX_POOL_2D": _pool("max_pool2d", "MAX_POOL_2D"),
    "ADD": _binary("add", "ADD", "AddOptions"), "MUL": _binary("mul", "MUL", "MulOptions"),
    "RESHAPE": _reshape, "SOFTMAX": _softmax, "QUANTIZE": _quantize, "DEQUANTIZE": _dequantize, "PAD": _pad,
    "MEAN": _mean, "CONCATENATION": _concat, "LOGISTIC": _unary("sigmoid", "LOGISTIC"),
    "TANH": _unary("tanh", "TANH"), "RELU": _unary("relu", "RELU"), "RELU6": _unary("relu6", "RELU6"),
}
