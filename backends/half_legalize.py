"""float16 and bfloat16 kernels without half-precision types: uint16 storage, float32 arithmetic.

cuda-sim runs a CUDA package's kernels with OpenCL on pocl, which has no ``half`` arithmetic
(no cl_khr_fp16) and no bfloat16 at all. ``legalize(func)`` rewrites a lowered device PrimFunc
so that no value has a half type, computing what the CUDA kernel computes:

- every half operation of the TIR (an add, multiply, max, a math call, a cast from float32 or an
  integer: what the CUDA code does with ``half``/``nv_bfloat16`` operands, ``__hadd``,
  ``__float2half_rn`` ...) is computed in float32 from its operands converted exactly, then
  rounded back to the half format to nearest even. For +, -, x, / and sqrt this is the correctly
  rounded half result (float32 has 24 >= 2 x 11 + 2 significant bits, so the double rounding is
  innocuous), i.e. the value the GPU's half instruction gives;
- comparisons and conversions from a half value compare and convert its exact float32 value;
- loads, stores, selects, broadcasts and let bindings of half values move their 16 bits; half
  buffers, pointers and constants become uint16 ones.

The conversions are integer TIR operations (``f32_to_half_bits``, ``half_bits_to_f32``): round to
nearest even with ties to even, float16 subnormals, overflow to infinity from 65520 up, and NaN
to the canonical NaN 0x7FFF (what ``cvt.rn.f16.f32`` / ``cvt.rn.bf16.f32`` give on the GPU).
"""
from __future__ import annotations

import re

import numpy as np
import tvm_ffi
from tvm import tirx
from tvm.ir import Call, PrimType
from tvm.ir.expr import TensorLoad

from kiln.frontend.errors import KilnError

HALF = ("float16", "bfloat16")
CANONICAL_NAN = 0x7FFF
# calls that move a half value without computing with it
_MOVES = {"tirx.if_then_else", "prim.if_then_else", "tirx.reinterpret", "tirx.tvm_warp_shuffle",
          "tirx.tvm_warp_shuffle_down", "tirx.tvm_warp_shuffle_up"}


def split_dtype(dtype):
    """("float16", 4) for "float16x4"."""
    m = re.fullmatch(r"([a-z]+\d*)(?:x(\d+))?", str(dtype))
    return m.group(1), int(m.group(2) or 1)


def half_of(expr):
    """The half format ("float16"/"bfloat16") of a scalar or vector expression, else None."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, PrimType):
        return None
    base = split_dtype(ty.dtype)[0]
    return base if base in HALF else None


def _vec(base, lanes):
    return base if lanes == 1 else f"{base}x{lanes}"


class _Ops:
    """Typed constants and let-bindings for expressions of ``lanes`` lanes."""

    def __init__(self, lanes):
        self.lanes, self._n = lanes, 0

    def t(self, base):
        return _vec(base, self.lanes)

    def k(self, v, base="uint32"):
        c = tirx.const(v, base)
        return c if self.lanes == 1 else tirx.Broadcast(c, self.lanes)

    def let(self, value, body_fn):
        """Bind ``value`` once (the conversions use their operand several times)."""
        self._n += 1
        v = tirx.Var(f"hv{self._n}", value.ty)
        return tirx.Let(v, value, body_fn(v))

    def sel(self, cond, a, b):
        return tirx.Select(cond, a, b)


def f32_to_half_bits(x, fmt="float16"):
    """uint16 bits of float32 expression ``x`` rounded to ``fmt`` (nearest, ties to even)."""
    o = _Ops(split_dtype(x.ty.dtype)[1])
    u32 = tirx.reinterpret(o.t("uint32"), x)
    body = _f16_bits if fmt == "float16" else _bf16_bits
    return tirx.Cast(o.t("uint16"), o.let(u32, lambda u: body(o, u)))


def _bf16_bits(o, u):
    nan = (u & o.k(0x7FFFFFFF)) > o.k(0x7F800000)
    rounded = (u + o.k(0x7FFF) + ((u >> o.k(16)) & o.k(1))) >> o.k(16)
    return o.sel(nan, o.k(CANONICAL_NAN), rounded)


def _round_even(o, kept, rest, half):
    """kept + 1 where the dropped bits ``rest`` are over ``half``, or equal to it and kept is odd."""
    up = (rest > half) | ((rest == half) & ((kept & o.k(1)) == o.k(1)))
    return kept + o.sel(up, o.k(1), o.k(0))


def _f16_bits(o, u):
    def on_abs(a):
        sign = (u >> o.k(16)) & o.k(0x8000)
        normal = _round_even(o, (a - o.k(0x38000000)) >> o.k(13), a & o.k(0x1FFF), o.k(0x1000))
        # below 2^-14: the significand with its implicit bit, shifted right by 126 - exponent
        # (14 at 2^-15, 24 at 2^-25; clamped to 25, which gives 0 for anything smaller)
        e = tirx.Cast(o.t("int32"), a >> o.k(23))
        sh = tirx.Cast(o.t("uint32"), tirx.max(tirx.min(o.k(126, "int32") - e, o.k(25, "int32")),
                                               o.k(14, "int32")))
        m = (a & o.k(0x7FFFFF)) | o.k(0x800000)
        sub = _round_even(o, m >> sh, m & ((o.k(1) << sh) - o.k(1)), o.k(1) << (sh - o.k(1)))
        mag = o.sel(a >= o.k(0x477FF000), o.k(0x7C00), o.sel(a >= o.k(0x38800000), normal, sub))
        return o.sel(a > o.k(0x7F800000), o.k(CANONICAL_NAN), sign | mag)
    return o.let(u & o.k(0x7FFFFFFF), on_abs)


def half_bits_to_f32(h, fmt="float16"):
    """The float32 value (exact) of uint16 expression ``h`` holding ``fmt`` bits."""
    o = _Ops(split_dtype(h.ty.dtype)[1])
    w32 = tirx.Cast(o.t("uint32"), h)
    if fmt == "bfloat16":
        return tirx.reinterpret(o.t("float32"), w32 << o.k(16))

    def body(w):
        sign = (w & o.k(0x8000)) << o.k(16)
        e, m = (w >> o.k(10)) & o.k(0x1F), w & o.k(0x3FF)
        f32 = o.t("float32")
        normal = tirx.reinterpret(f32, sign | ((e + o.k(112)) << o.k(23)) | (m << o.k(13)))
        special = tirx.reinterpret(f32, sign | o.k(0x7F800000) | (m << o.k(13)))
        # a subnormal is m x 2^-24: float32(m) (exact) with 24 taken off its exponent, in
        # integers (no float constant, which OpenCL C would get as rounded decimal text)
        m_bits = tirx.reinterpret(o.t("uint32"), tirx.Cast(f32, m))
        sub = tirx.reinterpret(f32, sign | o.sel(m == o.k(0), o.k(0), m_bits - o.k(24 << 23)))
        return o.sel(e == o.k(0x1F), special, o.sel(e == o.k(0), sub, normal))
    return o.let(w32, body)


def half_bits_of_value(value, fmt):
    """uint16 bits of the Python float ``value`` rounded to ``fmt`` (NumPy, for constants)."""
    if fmt == "float16":
        return int(np.array(value, np.float16).view(np.uint16))
    u = int(np.array(value, np.float32).view(np.uint32))
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return CANONICAL_NAN
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


# ---- the rewrite ---------------------------------------------------------------------------------
def to_f32(e):
    """Exact float32 value of half expression ``e``."""
    fmt = half_of(e)
    lanes = split_dtype(e.ty.dtype)[1]
    return half_bits_to_f32(tirx.reinterpret(_vec("uint16", lanes), e), fmt)


def from_f32(x, fmt):
    """Half expression of type ``fmt`` holding float32 ``x`` rounded to nearest even."""
    lanes = split_dtype(x.ty.dtype)[1]
    return tirx.reinterpret(_vec(fmt, lanes), f32_to_half_bits(x, fmt))


def _as_f32(e):
    """``e`` as float32 (of its lanes): exact from half, a cast from anything else."""
    if half_of(e):
        return to_f32(e)
    base, lanes = split_dtype(e.ty.dtype)
    return e if base == "float32" else tirx.Cast(_vec("float32", lanes), e)


def _binary(n):
    fmt = half_of(n.a) or half_of(n.b)
    if fmt is None:
        return n
    y = type(n)(_as_f32(n.a), _as_f32(n.b))
    return from_f32(y, fmt) if half_of(n) else y


def _cast(n):
    src, dst = half_of(n.value), half_of(n)
    if src is None and dst is None:
        return n
    x = to_f32(n.value) if src else n.value
    if dst:
        return from_f32(_as_f32(x), dst)
    return x if x.ty.dtype == n.ty.dtype else tirx.Cast(n.ty, x)


def _call(n):
    if n.op.name in _MOVES or not (half_of(n) or any(half_of(a) for a in n.args)):
        return n
    args = [_as_f32(a) if half_of(a) else a for a in n.args]
    fmt = half_of(n)
    if fmt is None:
        return Call(n.op, args, n.attrs, n.ty_args, ret_ty=n.ty)
    lanes = split_dtype(n.ty.dtype)[1]
    return from_f32(Call(n.op, args, n.attrs, n.ty_args, ret_ty=PrimType(_vec("float32", lanes))), fmt)


def _float_imm(n):
    fmt = half_of(n)
    if fmt is None:
        return n
    return tirx.reinterpret(fmt, tirx.const(half_bits_of_value(n.value, fmt), "uint16"))


_ARITH = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod, tirx.Min,
          tirx.Max, tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.EQ, tirx.NE)


def _storage_type(t):
    base, lanes = split_dtype(t.dtype)
    return PrimType(_vec("uint16", lanes)) if base in HALF else t


def _moved(n):
    """A half value moved (loaded, selected, bound, broadcast, shuffled), rebuilt from its
    operands, which are uint16 by now."""
    if isinstance(n, TensorLoad):
        return tirx.BufferLoad(n.source, list(n.indices))
    if isinstance(n, Call):
        if n.op.name == "tirx.reinterpret" and not half_of(n.args[0]):
            return n.args[0] if n.args[0].ty.dtype == _storage_type(n.ty).dtype else \
                tirx.reinterpret(_storage_type(n.ty).dtype, n.args[0])
        return Call(n.op, list(n.args), n.attrs, n.ty_args, ret_ty=_storage_type(n.ty))
    if isinstance(n, tirx.Select):
        return tirx.Select(n.condition, n.true_value, n.false_value)
    if isinstance(n, tirx.Let):
        return tirx.Let(n.var, n.value, n.body)
    if isinstance(n, tirx.Broadcast):
        return tirx.Broadcast(n.value, n.lanes)
    if isinstance(n, tirx.Shuffle):
        return tirx.Shuffle(list(n.vectors), list(n.indices))
    raise KilnError(f"half_legalize: no uint16 form for {type(n).__name__} {n}")


def _storage(n):
    if half_of(n):
        return _moved(n)
    if isinstance(n, Call) and n.op.name == "tirx.reinterpret" and n.args[0].ty.dtype == n.ty.dtype:
        return n.args[0]
    return n


def _reduce_scope(n):
    """The ``reduce_scope`` annotation of a lowered cross-thread reduction carries its (half)
    combiner as metadata only; the code generators ignore it."""
    return n.body if n.attr_key == "reduce_scope" else n


def legalize(func):
    """``func`` (a lowered device PrimFunc) with half arithmetic in float32 and half storage in
    uint16: no float16/bfloat16 type is left (see the module docstring)."""
    func = tvm_ffi.structural_map(func, [(tirx.AttrStmt, _reduce_scope)])
    compute = tvm_ffi.structural_map(func, [(_ARITH, _binary), (tirx.Cast, _cast), (Call, _call),
                                            (tirx.FloatImm, _float_imm)])
    out = tvm_ffi.structural_map(compute, [(PrimType, _storage_type),
                                           ((TensorLoad, Call, tirx.Select, tirx.Let, tirx.Broadcast,
                                             tirx.Shuffle), _storage)])
    left = half_left(out)
    if left:
        raise KilnError(f"half_legalize: {func.attrs.get('global_symbol', 'a kernel')} still has half "
                        f"values after legalisation: {left[:3]}")
    return out


def half_left(node):
    """Expressions and types of ``node`` that still have a half dtype."""
    found = []

    def see(x):
        t = x if isinstance(x, PrimType) else getattr(x, "ty", None)
        if isinstance(t, PrimType) and split_dtype(t.dtype)[0] in HALF:
            found.append(x)
    tvm_ffi.structural_walk(node, see)
    return found
