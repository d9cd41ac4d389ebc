"""Kernels that differ only in integer literals, shared as one C function.

The time steps of an unrolled recurrent model repeat the same kernels with other constants in
their code: an int8 ADD's requantisation multipliers and zero points (each step's tensors have
their own scales), the offset of a time step's slice. ``lower.BuildCache`` shares only kernels
whose code is equal; this pass takes a *family* of at least :data:`MIN_FAMILY` kernels whose C
text is equal once integer literals are blanked, and writes one function for all of them: the
literals that differ become ``const`` locals read from an extra constant parameter at entry
(``int`` literals from an ``int32_t`` array, wider ones from an ``int64_t`` array), so each
command passes its own values. A literal keeps its C type (``int``, or a 64-bit type for one
beyond INT32_MAX), so every expression computes what it did. A literal that sizes an array
keeps the family apart. Smaller families (the repeated blocks of a CNN) stay as they are.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from .lower import Arg
from .tirc import CParam

MIN_FAMILY = 16     # distinct kernels needed before literals are turned into parameters
# an integer literal, with the sign before it (binary or unary: "a - 14" is "a + LIT" with LIT -14)
_LIT = re.compile(r"(?<![\w.])(?:([-+]) ?)?(\d+)(?![\w.])")
_INT_MAX = 2**31 - 1
_ARRAY_DECL = re.compile(r"^\s*(?:const\s+)?\w+\s+\w+\[[^\]]*$")
_SIG = re.compile(r"^(static void )(\w+)(\(.*)\) \{$")


def _split(source, name):
    """(body lines without the signature, the signature's parameter text) of a kernel's C."""
    lines = source.rstrip("\n").split("\n")
    m = _SIG.match(lines[0])
    if m is None or m.group(2) != name:
        return None
    return lines[1:], m.group(3)[1:]


def _literals(lines):
    """[(line, start, end, signed value, signed)] of every integer literal."""
    return [(i, mo.start(), mo.end(), int(mo.group(2)) * (-1 if mo.group(1) == "-" else 1), mo.group(1) is not None)
            for i, ln in enumerate(lines) for mo in _LIT.finditer(ln)]


def _blank(mo):
    return "#i" if int(mo.group(2)) <= _INT_MAX else "#l"


def family_key(kern):
    """The kernel's C text with its name, its parameters' names and its integer literals (with
    their signs) blanked, each literal marked ``int`` or wider, and its parameter kinds; None
    when the text is not one plain function."""
    parts = _split(kern.source, kern.c_function)
    if parts is None:
        return None
    body, params = parts
    names = [p.rpartition(" ")[2].lstrip("*") for p in params.split(", ")]
    text = "\n".join(_LIT.sub(_blank, ln) for ln in body)
    if names:
        pos = {n: f"@{i}" for i, n in enumerate(names)}
        text = re.sub(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b", lambda mo: pos[mo.group()], text)
    return len(names), text, tuple((a.kind, a.dtype) for a in kern.args)


def share(kernels, commands, min_family=MIN_FAMILY):
    """``kernels`` (the distinct kernels) and ``commands`` ([(kernel, shared kernel)]) with every
    family of at least ``min_family`` kernels merged into its first member."""
    fams = {}
    for k in kernels:
        key = family_key(k)
        if key is not None:
            fams.setdefault(key, []).append(k)
    merged = {}
    for members in fams.values():
        if len(members) >= min_family:
            merged.update(_merge(members))
    if not merged:
        return kernels, commands
    out_cmds = []
    for kern, shared in commands:
        if shared.name in merged:
            head, values = merged[shared.name]
            kern = _with_literals(kern, head, values)
            shared = head
        out_cmds.append((kern, shared))
    out_kernels = []
    for k in kernels:
        if k.name not in merged:
            out_kernels.append(k)
        elif merged[k.name][0].name == k.name:
            out_kernels.append(merged[k.name][0])
    return out_kernels, out_cmds


def _merge(members):
    """{member name: (the family's shared kernel, {array dtype: the member's literal values})},
    or {} when a differing literal sizes an array."""
    bodies = [_split(k.source, k.c_function)[0] for k in members]
    lits = [_literals(b) for b in bodies]
    differ = [j for j in range(len(lits[0])) if len({lit[j][3] for lit in lits}) > 1]
    if not differ or any(_ARRAY_DECL.match(bodies[0][lits[0][j][0]][:lits[0][j][1]]) for j in differ):
        return {}
    wide = {j for j in differ if abs(lits[0][j][3]) > _INT_MAX}
    slots = {"int32": [j for j in differ if j not in wide], "int64": [j for j in differ if j in wide]}
    head = members[0]
    body = list(bodies[0])
    names = {}
    for dt, js in slots.items():
        for n, j in enumerate(js):
            names[j] = f"kiln_lit{'64' if dt == 'int64' else ''}_{n}"
    for j in sorted(differ, key=lambda j: (lits[0][j][0], -lits[0][j][1])):   # right to left in a line
        i, a, b, _, signed = lits[0][j]     # the head's sign form: "a - 14" -> "a + lit", "-5" -> "+ lit"
        body[i] = body[i][:a] + ("+ " if signed else "") + names[j] + body[i][b:]
    decls, extra = [], []
    for dt, js in slots.items():
        if not js:
            continue
        ptr = f"kiln_lits{'64' if dt == 'int64' else ''}"
        ctype = "int" if dt == "int32" else "int64_t"
        decls += [f"  const {ctype} {names[j]} = ({ctype}){ptr}[{n}];" for n, j in enumerate(js)]
        extra.append((dt, ptr))
    sig = _SIG.match(head.source.split("\n", 1)[0])
    params = sig.group(3) + "".join(f", const {dt}_t* {ptr}" for dt, ptr in extra)
    source = "\n".join([f"{sig.group(1)}{head.c_function}{params}) {{", *decls, *body]) + "\n"
    shared = dataclasses.replace(head, source=source, args=head.args + [Arg("const", f"{head.name}.{ptr}", dt, 0)
                                                                       for dt, ptr in extra])
    shared.extra_consts = head.extra_consts
    shared.cparams = list(head.cparams) + [CParam(ptr, dt, True) for dt, ptr in extra]
    shared.c_function = head.c_function
    out = {}
    for k, lit in zip(members, lits):
        out[k.name] = (shared, {dt: [lit[j][3] for j in js] for dt, js in slots.items() if js})
    return out


def _with_literals(kern, head, values):
    """A command's kernel with its literal arrays as extra constant arguments."""
    extra = dict(kern.extra_consts)
    args = list(kern.args)
    for dt, vals in values.items():
        ptr = "kiln_lits64" if dt == "int64" else "kiln_lits"
        name = f"{kern.name}.{ptr}"
        extra[name] = np.asarray(vals, dt)
        args.append(Arg("const", name, dt, extra[name].nbytes))
    new = dataclasses.replace(kern, args=args)
    new.extra_consts = extra
    new.cparams = head.cparams
    new.c_function = head.c_function
    return new
