"""TFLite import and export of the element-wise and activation builtins beyond ADD, MUL, LOGISTIC,
TANH, RELU, RELU6 (those are in ``elementwise.py``): one table, builtin -> (Kiln op, options
table, operand count). SUB and DIV carry a fused activation (a following relu/relu6 node);
LEAKY_RELU its alpha. An int8 operand is accepted only where Kiln has the op's int8 reference
(``elementwise_int8.py``); otherwise the import names the operator and the op.
"""
from .. import tflite_checks as chk
from ..registry import get_op
from . import tflite_util as tfl

# builtin -> (kiln op, options table or None, number of inputs (None: 1 or more))
BUILTINS = {
    "ABS": ("abs", "AbsOptions", 1), "NEG": ("neg", "NegOptions", 1), "SQRT": ("sqrt", None, 1),
    "RSQRT": ("rsqrt", None, 1), "LOG": ("log", None, 1), "EXP": ("exp", "ExpOptions", 1),
    "SQUARE": ("square", "SquareOptions", 1), "SIN": ("sin", None, 1), "COS": ("cos", "CosOptions", 1),
    "FLOOR": ("floor", None, 1), "CEIL": ("ceil", None, 1), "ROUND": ("round", None, 1), "ELU": ("elu", None, 1),
    "HARD_SWISH": ("hard_swish", "HardSwishOptions", 1), "LEAKY_RELU": ("leaky_relu", "LeakyReluOptions", 1),
    "LOGICAL_NOT": ("logical_not", "LogicalNotOptions", 1),
    "SUB": ("sub", "SubOptions", 2), "DIV": ("div", "DivOptions", 2),
    "MAXIMUM": ("maximum", "MaximumMinimumOptions", 2), "MINIMUM": ("minimum", "MaximumMinimumOptions", 2),
    "SQUARED_DIFFERENCE": ("squared_difference", "SquaredDifferenceOptions", 2), "PRELU": ("prelu", None, 2),
    "EQUAL": ("equal", "EqualOptions", 2), "NOT_EQUAL": ("not_equal", "NotEqualOptions", 2),
    "LESS": ("less", "LessOptions", 2), "LESS_EQUAL": ("less_equal", "LessEqualOptions", 2),
    "GREATER": ("greater", "GreaterOptions", 2), "GREATER_EQUAL": ("greater_equal", "GreaterEqualOptions", 2),
    "LOGICAL_AND": ("logical_and", "LogicalAndOptions", 2), "LOGICAL_OR": ("logical_or", "LogicalOrOptions", 2),
    "FLOOR_DIV": ("floor_div", "FloorDivOptions", 2), "FLOOR_MOD": ("floor_mod", "FloorModOptions", 2),
    "SELECT_V2": ("where", "SelectV2Options", 3), "ADD_N": ("add_n", "AddNOptions", None),
}
_FUSED = ("SUB", "DIV")
# op version LiteRT registers for the int8 kernel
INT8_VERSIONS = {"SUB": 2, "MAXIMUM": 2, "MINIMUM": 2, "SQUARED_DIFFERENCE": 2, "LEAKY_RELU": 2, "HARD_SWISH": 1,
                 "PRELU": 1, "ABS": 2, "RSQRT": 2, "EXP": 2, "ELU": 1, "NEG": 1, "EQUAL": 2, "NOT_EQUAL": 2,
                 "LESS": 2, "LESS_EQUAL": 2, "GREATER": 2, "GREATER_EQUAL": 2, "SELECT_V2": 1, "DIV": 2, "LOG": 2, "SQRT": 2}


def _check_int8(imp, k, name, kop, xs, out):
    ts = [imp.g.types[v] for v in xs]
    quantised = [t for t in ts if t.quant is not None] + ([imp.tensors[out]["quant"]]
                                                          if imp.tensors[out]["quant"] is not None else [])
    if not quantised:
        return
    w = tfl.where(k, name)
    if get_op(kop).int8_ref is None:
        raise imp.err(f"{w}: int8 {name} is not supported (Kiln has no int8 reference for '{kop}'; TFLite "
                      f"computes it in float32): dequantise around it or keep the model float")
    for j, t in enumerate(ts):
        if t.quant is not None:
            chk.per_tensor(imp.err, w, t.quant, f"input {j}")
    if imp.tensors[out]["quant"] is not None:
        chk.per_tensor(imp.err, w, imp.tensors[out]["quant"], "the output")


def _converter(builtin):
    kop, opts_cls, n = BUILTINS[builtin]

    def conv(imp, k, op, ins, out):
        if n is None:
            tfl.need(imp, k, builtin, ins, 1, 64)
        else:
            tfl.need(imp, k, builtin, ins, n)
        o = tfl.options(imp, k, op, builtin, opts_cls)
        attrs, act = {}, "none"
        if builtin in _FUSED:
            act = tfl.activation(imp, k, builtin, o.FusedActivationFunction() if o else 0)
        if builtin == "LEAKY_RELU":
            attrs["alpha"] = float(o.Alpha()) if o else 0.0
        if kop == "where":
            xs = [imp.value(ins[0], k, builtin)] + [imp.operand(i, k, builtin) for i in ins[1:]]
        elif kop.startswith("logical"):
            xs = [imp.value(i, k, builtin) for i in ins]
        else:
            xs = [imp.operand(i, k, builtin) for i in ins]
        _check_int8(imp, k, builtin, kop, xs[1:] if kop == "where" else xs, out)
        imp.finish(k, builtin, kop, xs, attrs, out, act)
    conv.__name__ = f"import_{builtin.lower()}"
    return conv


for _b in BUILTINS:
    tfl.importer(_b)(_converter(_b))

_EXPORT = {kop: (b, opts) for b, (kop, opts, _) in BUILTINS.items()}


def _export(e, n, act, out, int8):
    builtin, opts = _EXPORT[n.op]
    fields = {}
    if builtin in _FUSED:
        fields["FusedActivationFunction"] = tfl.ACT_CODES[act]
        if builtin == "SUB" and e.g.types[out].dtype == "int16":
            fields["PotScaleInt16"] = False     # 16x8: the general-scale kernel (TFLite Micro's only one)
    elif builtin == "LEAKY_RELU":
        fields["Alpha"] = float(n.attrs["alpha"])
    else:
        opts = None
    e.op(builtin, [e.value(i) for i in n.inputs], [e.tensor(out, e.g.types[out])], opts, int8, **fields)


tfl.exporter(*[kop for kop, _, _ in BUILTINS.values() if kop not in ("sub", "div")], versions=INT8_VERSIONS)(_export)
tfl.exporter("sub", "div", versions=INT8_VERSIONS, fuses_activation=True)(_export)
