"""TFLite's element-wise and activation ops that ``elementwise.py`` does not define: abs, square,
rsqrt, sin, cos, floor, ceil, round, elu, hard_swish, leaky_relu, prelu, squared_difference,
floor_div, floor_mod, add_n. Float semantics follow TFLite's kernels (round: half to even; floor_div:
floor(a / b); floor_mod: the sign of the divisor; elu: expm1 below 0; prelu: alpha * x below 0).

Their int8 references (and those of sub, maximum, minimum, exp, abs...) are in
``elementwise_int8.py``; their TFLite import and export in ``elementwise_tflite.py``.
"""
import numpy as np

from .. import functional as F
from ..errors import ShapeError
from ..registry import ELEMENTWISE, NONDIFF, UNARY, Attr, defrule, get_op, register
from ._util import need_float, same_dtype, tt
from .elementwise import _binary, _ub, _unary, unary_te


def _zero_grad(n, xs, y, gy):
    return [gy * 0.0]


def _abs_vjp(n, xs, y, gy):
    x = xs[0]
    return [F.where(x > 0.0, gy, F.where(x < 0.0, -gy, gy * 0.0))]


_unary("abs", np.abs, _abs_vjp, lambda T, v, a: T.tirx.Select(v < T.c(0, T.dt(v)), -v, v), doc="|x|; gradient 0 at 0 (as torch)")
_unary("square", np.square, lambda n, xs, y, gy: [gy * (xs[0] * 2.0)], lambda T, v, a: v * v, doc="x * x")
_unary("rsqrt", lambda x: 1.0 / np.sqrt(x), lambda n, xs, y, gy: [gy * (y * y * y) * -0.5],
       lambda T, v, a: T.c(1, T.dt(v)) / T.te.sqrt(v), doc="1 / sqrt(x) (VJP reads the output)")
_unary("sin", np.sin, lambda n, xs, y, gy: [gy * F.emit("cos", [xs[0]])], lambda T, v, a: T.te.sin(v), doc="sine")
_unary("cos", np.cos, lambda n, xs, y, gy: [-(gy * F.emit("sin", [xs[0]]))], lambda T, v, a: T.te.cos(v),
       doc="cosine")
_unary("floor", np.floor, _zero_grad, lambda T, v, a: T.te.floor(v), doc="round toward -inf; gradient 0 (as torch)")
_unary("ceil", np.ceil, _zero_grad, lambda T, v, a: T.te.ceil(v), doc="round toward +inf; gradient 0 (as torch)")
_unary("round", np.round, _zero_grad, lambda T, v, a: T.te.nearbyint(v),
       doc="round half to even (TFLite ROUND, torch.round); gradient 0")
_unary("elu", lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
       lambda n, xs, y, gy: [F.where(xs[0] > 0.0, gy, gy * (y + 1.0))],
       lambda T, v, a: T.tirx.Select(v > T.c(0, T.dt(v)), v, T.te.exp(v) - T.c(1, T.dt(v))),
       doc="x if x > 0 else exp(x) - 1 (alpha 1, TFLite ELU)")


def _hard_swish_ref(x):
    return x * np.minimum(np.maximum(x + 3, 0), 6) / 6


def _hard_swish_vjp(n, xs, y, gy):
    x = xs[0]
    return [F.where(x < -3.0, gy * 0.0, F.where(x <= 3.0, gy * (x * (1.0 / 3.0) + 0.5), gy))]


def _hard_swish_te(T, v, a):
    d = T.dt(v)
    return v * T.te.min(T.te.max(v + T.c(3, d), T.c(0, d)), T.c(6, d)) / T.c(6, d)


_unary("hard_swish", _hard_swish_ref, _hard_swish_vjp, _hard_swish_te,
       doc="x * relu6(x + 3) / 6 (MobileNetV3); gradient as torch.nn.functional.hardswish")


# ---- leaky_relu: one attribute ----------------------------------------------------------------
def _leaky_ref(xs, a):
    x = xs[0]
    return np.where(x > 0, x, x * np.asarray(a["alpha"], x.dtype)).astype(x.dtype, copy=False)


def _leaky_infer(ts, attrs):
    need_float(ts[0], "leaky_relu")
    return ts[0]


register("leaky_relu", attrs={"alpha": Attr("float", 0.2)}, infer=_leaky_infer, ref=_leaky_ref,
         vjp=lambda n, xs, y, gy: [F.where(xs[0] > 0.0, gy, gy * float(n.attrs["alpha"]))],
         props={ELEMENTWISE, UNARY}, arity=1, doc="x if x > 0 else alpha * x (TFLite LEAKY_RELU, alpha 0.2 by default)")
_leaky_te_rule = unary_te(
    "leaky_relu", lambda T, v, a: T.tirx.Select(v > T.c(0, T.dt(v)), v, v * T.c(float(a["alpha"]), T.dt(v))))


@defrule("leaky_relu", "te")
def _leaky_te(T, xs, a, out):
    return _leaky_te_rule(T, xs, a, out)


# ---- binary -----------------------------------------------------------------------------------
def _sqdiff_vjp(n, xs, y, gy):
    d = (xs[0] - xs[1]) * 2.0
    return [_ub(gy * d, xs[0]), _ub(-(gy * d), xs[1])]


_binary("squared_difference", lambda a, b: (a - b) * (a - b), _sqdiff_vjp, lambda T, a, b: (a - b) * (a - b))


def _prelu_vjp(n, xs, y, gy):
    x, alpha = xs
    pos = x >= 0.0
    return [_ub(F.where(pos, gy, gy * alpha), x), _ub(F.where(pos, gy * 0.0, gy * x), alpha)]


_binary("prelu", lambda x, al: np.where(x >= 0, x, x * al), _prelu_vjp,
        lambda T, x, al: T.tirx.Select(x >= T.c(0, T.dt(x)), x, x * al))


def _floor_mod_ref(a, b):
    r = np.fmod(a, b)
    return np.where((r != 0) & ((b < 0) != (r < 0)), r + b, r)


def _floor_mod_te(T, a, b):
    d = T.dt(a)     # C's fmod (TVM's C target has no lowering of tirx.fmod)
    r = T.tirx.call_pure_extern(d, {"float32": "fmodf", "float64": "fmod"}.get(d, "fmodf"), a, b)
    z = T.c(0, T.dt(a))
    # (b < 0) != (r < 0) with r != 0, written without comparing two booleans (LLVM's FCmp rejects i1)
    flip = T.tirx.Or(T.tirx.And(b < z, r > z), T.tirx.And(b >= z, r < z))
    return T.tirx.Select(flip, r + b, r)


_binary("floor_div", lambda a, b: np.floor(a / b), lambda n, xs, y, gy: [None, None],
        lambda T, a, b: T.te.floor(a / b), props={NONDIFF})
_binary("floor_mod", _floor_mod_ref,
        lambda n, xs, y, gy: [_ub(gy, xs[0]), _ub(-(gy * F.emit("floor_div", [xs[0], xs[1]])), xs[1])],
        _floor_mod_te)


# ---- add_n: the sum of n same-shaped tensors ------------------------------------------------
def _add_n_infer(ts, attrs):
    if not ts:
        raise ShapeError("add_n needs at least one input")
    dt = same_dtype(ts, "add_n")
    shapes = {tuple(t.shape) for t in ts}
    if len(shapes) != 1:
        raise ShapeError(f"add_n needs inputs of one shape (TFLite ADD_N does not broadcast), got "
                         f"{[list(t.shape) for t in ts]}")
    need_float(ts[0], "add_n")
    return tt(ts[0].shape, dt)


def _add_n_ref(xs, a):
    y = xs[0].copy()
    for x in xs[1:]:
        y = y + x
    return y.astype(xs[0].dtype, copy=False)


register("add_n", infer=_add_n_infer, ref=_add_n_ref, vjp=lambda n, xs, y, gy: [gy for _ in xs],
         props={ELEMENTWISE}, doc="x0 + x1 + ... (same shapes, summed left to right as TFLite ADD_N)")


@defrule("add_n", "te")
def _add_n_te(T, xs, a, out):
    ad = T.acc_dtype(xs[0].dtype)

    def body(*i):
        s = T.cast(xs[0](*i), ad)
        for x in xs[1:]:
            s = s + T.cast(x(*i), ad)
        return T.cast(s, out.dtype)
    return T.te.compute(T.shape(xs[0]), body, name="add_n")



for _name, _doc in (
        ("squared_difference", "(a - b)**2, NumPy broadcasting (TFLite SQUARED_DIFFERENCE)"),
        ("prelu", "x if x >= 0 else alpha * x, alpha broadcast against x (TFLite PRELU; a learnable slope)"),
        ("floor_div", "floor(a / b), NumPy broadcasting (TFLite FLOOR_DIV); no gradient"),
        ("floor_mod", "a - floor(a / b) * b with the sign of b (TFLite FLOOR_MOD, C's fmod then adjusted)")):
    get_op(_name).doc = _doc
