"""Families of kernels found before TVM builds them: each family is built once.

The time steps of an unrolled int8 RNN schedule the same PrimFunc with other integer constants
(requantisation multipliers, zero points, a slice's offset). Building every one with TVM and
merging the C afterwards (``families.py``) spends most of a long graph's compile time in TVM's
lowering passes. Here the scheduled PrimFuncs are compared first, each with its integer
constants blanked (a structural hash: buffer names do not count; dtypes, float constants, the loop
structure, the parameters' shapes and kinds do). A family of at least ``families.MIN_FAMILY``
members becomes one *template*: the integer constants that differ between its members are
replaced by loads from extra parameters (``kiln_lits_t``: int32, holding the constants of 32
bits or fewer with their C type restored by a cast; ``kiln_lits64_t``: int64), TVM builds the
template once, and each member's C is the template's with the loads replaced by its own values
written as TVM prints a constant of their type (``(uint32_t)2147537983``), with index
arithmetic of constants folded as TVM folds it where that is needed (:func:`fold`). Every
expression computes what the member's own build computed (bit-exact), and the text is the one
its own build would have had: one member of each family is also built on its own, and the
template is used only when that member's C comes out the same (else the family is built member
by member, as before). ``families.share`` therefore merges the members with the kernels built
on their own exactly as it did: the package does not change, TVM builds fewer kernels. Members
whose constants are all equal are left to ``lower.BuildCache``; a family whose template TVM
cannot build (a constant that sizes a buffer) is built member by member.
"""
from __future__ import annotations

import collections
import dataclasses
import re

import tvm_ffi
from tvm import tirx

from . import families
from .lower import BuildCache

_INT32 = ("int8", "int16", "int32", "uint8", "uint16", "uint32")    # stored in kiln_lits_t
_INT64 = ("int64",)                                                  # stored in kiln_lits64_t
_ARRAYS = {"int32": "kiln_lits_t", "int64": "kiln_lits64_t"}


def literals(func):
    """[(dtype, value)] of the PrimFunc's integer constants, in the order of a structural walk."""
    vals = []

    def see(x):
        if str(x.ty) in _INT32 + _INT64:
            vals.append((str(x.ty), int(x.value)))
        return x
    tvm_ffi.structural_map(func, (tirx.IntImm, see))
    return vals


def _blanked(func):
    def blank(x):
        return tirx.const(0, str(x.ty)) if str(x.ty) in _INT32 + _INT64 else x
    return tvm_ffi.structural_map(func, (tirx.IntImm, blank))


def template(func, slots):
    """``func`` with the integer constants at ``slots`` ({walk position: (array dtype, index)})
    read from the extra parameters ``kiln_lits_t`` / ``kiln_lits64_t``."""
    sizes = collections.Counter(dt for dt, _ in slots.values())
    bufs = {dt: tirx.decl_buffer((n,), dt, name=_ARRAYS[dt]) for dt, n in sizes.items()}
    pos = [0]

    def param(x):
        if str(x.ty) not in _INT32 + _INT64:
            return x
        j = pos[0]
        pos[0] += 1
        if j not in slots:
            return x
        dt, i = slots[j]
        v = tirx.BufferLoad(bufs[dt], [tirx.const(i, "int32")])
        return v if str(x.ty) == dt else v.astype(str(x.ty))
    f = tvm_ffi.structural_map(func, (tirx.IntImm, param))
    return tirx.PrimFunc(list(f.params) + [bufs[dt] for dt in ("int32", "int64") if dt in bufs], f.body,
                         f.ret_type, f.attrs)


def _c_literal(v, dt):
    """``v`` as TVM prints an integer constant of type ``dt`` (so a member's C is the C its own
    build would have had)."""
    if dt == "int32":
        return "(-2147483647 - 1)" if v == -2**31 else str(v)
    return f"({dt}_t){v}"


def instantiate(built, kname, consts, folded=False):
    """A member's own Built from the template's: the function named ``kname``, without the literal
    parameters, each ``kiln_lits_t[i]`` (with the cast back to the constant's type, if any)
    replaced by the member's constant as TVM prints one of its type. ``consts``: {array name:
    [(dtype, value)] of the member's constants in the array's order}; ``folded``: with constants
    folded as TVM folds them (:func:`fold`)."""
    keep = [i for i, p in enumerate(built.cparams) if p.name not in _ARRAYS.values()]
    head, _, body = built.source.partition("\n")
    for dt, arr in _ARRAYS.items():
        if arr not in consts:
            continue
        vals = consts[arr]

        def cast(mo, vals=vals):
            odt, v = vals[int(mo.group(2))]
            return _c_literal(v, odt) if mo.group(1) == odt else mo.group()
        body = re.sub(rf"\(\((\w+)_t\){arr}\[(\d+)\]\)", cast, body)
        body = re.sub(rf"\b{arr}\[(\d+)\]", lambda mo, vals=vals: _c_literal(vals[int(mo.group(1))][1], dt), body)
        head = re.sub(rf", const {dt}_t\* {arr}\b", "", head)
    body = fold(body) if folded else body
    head = re.sub(rf"\b{re.escape(built.name)}\(", f"{kname}(", head, count=1)
    return dataclasses.replace(built, name=kname, cparams=[built.cparams[i] for i in keep],
                               roles=[built.roles[i] for i in keep], source=head + "\n" + body)


def _consts(vals, slots):
    """{array name: [(dtype, value)]} of a member's constants at ``slots``."""
    out = {}
    for j, (dt, _) in sorted(slots.items(), key=lambda kv: kv[1]):
        out.setdefault(_ARRAYS[dt], []).append(vals[j])
    return out


def build_all(scheduled, cache: BuildCache, min_family=families.MIN_FAMILY):
    """[Built] for ``scheduled`` (``lower.Scheduled``), in order: a family of
    ``min_family`` or more members with differing integer constants is built once as a template
    (``cache.templates`` counts them) and each member's C is the template's with its constants;
    the rest go through ``cache``."""
    fams = collections.defaultdict(list)
    lits = [literals(s.func) for s in scheduled]
    for i, s in enumerate(scheduled):
        blanked = _blanked(s.func)
        shapes = tuple(tuple(int(d) for d in p.shape) for p in s.func.params)
        key = (tvm_ffi.structural_hash(blanked), s.kinds, shapes, len(lits[i]))
        for head_blanked, members in fams[key]:
            if tvm_ffi.structural_equal(head_blanked, blanked):
                members.append(i)
                break
        else:
            fams[key].append((blanked, [i]))
    out = [None] * len(scheduled)
    for groups in fams.values():
        for _, members in groups:
            if len(members) >= min_family:
                _build_family(scheduled, lits, members, cache, out)
    for i, s in enumerate(scheduled):
        if out[i] is None:
            out[i] = cache.build(s.func, s.kname, s.ro, s.kinds)
    return out


def _build_family(scheduled, lits, members, cache, out):
    first = lits[members[0]]
    differ = [j for j in range(len(first)) if any(lits[m][j] != first[j] for m in members)]
    if not differ:
        return
    slots, count = {}, collections.Counter()
    for j in differ:
        dt = "int64" if first[j][0] in _INT64 else "int32"
        slots[j] = (dt, count[dt])
        count[dt] += 1
    head = scheduled[members[0]]
    arrays = [_ARRAYS[dt] for dt in ("int32", "int64") if count[dt]]
    try:
        built = cache.build(template(head.func, slots), head.kname, head.ro + arrays,
                            head.kinds + tuple(("const", dt) for dt in ("int32", "int64") if count[dt]))
    except Exception:  # noqa: BLE001 (TVM's errors and LoweringError alike)
        return          # e.g. a differing constant sizes a buffer: each member is built on its own
    # one member built on its own must come out as the template gives it: TVM folds constants
    # (``x[(i2 + 3)]`` where the template has ``x[((1 * 3) + i2)]``), and the C-level merge
    # (families.py) would no longer join the members with kernels built on their own
    probe = scheduled[members[-1]]
    own = normalized(cache.build(probe.func, probe.kname, probe.ro, probe.kinds))
    for folded in (False, True):
        if normalized(instantiate(built, probe.kname, _consts(lits[members[-1]], slots), folded)) == own:
            break
    else:
        return
    cache.templates += 1
    for m in members:
        out[m] = instantiate(built, scheduled[m].kname, _consts(lits[m], slots), folded)


_PRODUCT = re.compile(r"(?<![\w\]])\((-?\d+) ([*+]) (-?\d+)\)")      # not a call's parentheses
_CONST_FIRST = re.compile(r"(?<![\w\]])\((-?\d+) \+ (\w+)\)")


def fold(body):
    """``body`` with what TVM's simplifier does to an index of constants: ``(1 * 3)`` -> ``3``
    (int results only), then ``(3 + i2)`` -> ``(i2 + 3)``. Used only where it gives the C of a
    member's own build."""
    def product(mo):
        a, b = int(mo.group(1)), int(mo.group(3))
        v = a * b if mo.group(2) == "*" else a + b
        return str(v) if abs(v) <= 2**31 - 1 else mo.group()
    body = _PRODUCT.sub(product, body)
    return _CONST_FIRST.sub(lambda mo: f"({mo.group(2)} + {mo.group(1)})", body)


def normalized(built):
    """A Built's C with its name and its parameters' names blanked."""
    src = built.source.replace(f"{built.name}(", "@(", 1)
    names = [p.name for p in built.cparams]
    if names:
        src = re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b", lambda mo: f"@{names.index(mo.group())}", src)
    return src
