"""Write the C package (docs/c_package.md) from kernels, constants and the memory plan with the
jinja2 templates in ``backends/templates``."""
from __future__ import annotations

import glob
import os
import shutil

import jinja2
import numpy as np

from kiln.common.version import __version__

HERE = os.path.dirname(__file__)
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
                          keep_trailing_newline=True, undefined=jinja2.StrictUndefined)

CTYPES = {"int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "int32": "int32_t", "uint32": "uint32_t",
          "int64": "int64_t", "float32": "float"}


def c_ident(s):
    out = "".join(ch if ch.isalnum() else "_" for ch in str(s))
    return out if out and not out[0].isdigit() else "v" + out


def c_array_body(arr, per_line=16):
    a = np.asarray(arr).ravel()
    if a.dtype == np.float32:
        items = [_cfloat(v) for v in a]
    else:
        items = [str(int(v)) if not (a.dtype == np.int32 and int(v) == -2**31) else "(-2147483647 - 1)" for v in a]
    if not items:
        items = ["0"]
    lines = ["    " + ", ".join(items[i:i + per_line]) + "," for i in range(0, len(items), per_line)]
    return "\n".join(lines)


def _cfloat(v):
    v = float(v)
    if np.isnan(v):
        return "(0.0f/0.0f)"
    if np.isinf(v):
        return "(1.0f/0.0f)" if v > 0 else "(-1.0f/0.0f)"
    s = repr(float(np.float32(v)))
    if "e" not in s and "." not in s:
        s += ".0"
    return s + "f"


# the dtype codes of kiln_tensor_info_t (model.h)
DTYPE_CODES = {"float32": 1, "int8": 2, "uint8": 3, "int16": 4, "int32": 5, "float16": 6, "int64": 7, "bool": 8,
               "float64": 9, "uint16": 10, "uint32": 11, "bfloat16": 12}


def c_string(s):
    """A C string literal for any Python string (TFLite tensor names hold ':', '/', quotes...)."""
    out = []
    for b in str(s).encode("utf-8"):
        ch = chr(b)
        out.append(ch if 32 <= b < 127 and ch not in '"\\?' else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _tensor_info(t):
    """One kiln_tensor_info_t initialiser (model.c) for a manifest Tensor."""
    shape = list(t.shape) or [1]
    dims = ", ".join(str(int(d)) for d in shape)
    scale = _cfloat(t.scale) if t.scale is not None else "0.0f"
    zp = int(t.zero_point) if t.zero_point is not None else 0
    return (f'{{ {c_string(t.name)}, {t.bytes}u, {t.packed}u, {DTYPE_CODES.get(t.dtype, 0)}u, '
            f'{len(shape)}u, {{ {dims} }}, {scale}, {zp} }}')


# a kernel with more arena operands than this (a CONCATENATION of 200 time steps) reads its
# offsets from a constant array of its own, so the command record (KILN_MAX_IO offsets in every
# command) stays as small as the other kernels need
IO_INLINE_MAX = 8


def io_outside(kernel):
    """Whether ``kernel``'s commands keep their arena offsets in a constant array (data[] after
    the kernel's constants) instead of the command record."""
    return sum(a.kind != "const" for a in kernel.args) > IO_INLINE_MAX


def _ptr_cast(dtype, const):
    return f"({'const ' if const else ''}{CTYPES[dtype]} *)"


def render(out_dir, *, model_name, target, kernels, commands, consts, plan, inputs, outputs,
           schedule, write_extras=True, optimize="size", states=()):
    """Write model.h, model.c, kernels.c, kiln_cmd.h and kiln_intrinsics.h; ``inputs``/``outputs``
    are manifest Tensors. Returns the bytes of constant data (weights, tables)."""
    os.makedirs(out_dir, exist_ok=True)
    import tvm  # TVM: only its version string, for the generated files' header
    ctx = dict(version=__version__, target=target, model=model_name, tvm_version=tvm.__version__,
               optimize=optimize)
    max_io = max([len(c.get("record_offs", c["offs"])) for c in commands] + [1])
    max_data = max([len(c["data"]) for c in commands] + [1])
    kern_ctx = []
    for k in kernels:
        call = []
        io = data = 0
        wide = io_outside(k)        # its offsets in a constant array after its other constants
        offs = f"((const uint32_t *)c->data[{sum(a.kind == 'const' for a in k.args)}])" if wide else "c->off"
        for p, a in zip(k.cparams, k.args):
            if a.kind == "const":
                call.append(f"{_ptr_cast(a.dtype, True)}c->data[{data}]")
                data += 1
            else:
                call.append(f"{_ptr_cast(a.dtype, p.const)}(arena + {offs}[{io}])")
                io += 1
        kern_ctx.append(dict(name=k.name, covers=", ".join(f"{n} ({o})" for n, o in zip(k.nodes, k.ops)),
                             source=k.source.rstrip(), call=", ".join(call)))
    cmd_ctx = []
    for c in commands:
        offs = list(c.get("record_offs", c["offs"]))
        offs += [0] * (max_io - len(offs))
        data = list(c["data"]) + ["NULL"] * (max_data - len(c["data"]))
        cmd_ctx.append(dict(name=c["name"], ops=c["ops"], kernel=c["kernel"], macs=c["macs"],
                            offs=", ".join(f"{o}u" for o in offs), data=", ".join(data)))
    const_ctx = [dict(ctype=CTYPES[str(arr.dtype)], cname=cname, count=max(1, arr.size), desc=desc,
                      body=c_array_body(arr)) for cname, arr, desc in consts]
    weight_bytes = int(sum(arr.nbytes for _, arr, _ in consts))
    state_ctx = [dict(s, ctype=CTYPES[s["dtype"]], init=None if s["fill"] is not None else c_array_body(s["reset"]),
                      fill=None if s["fill"] is None else _cfloat(s["fill"]) if s["dtype"].startswith("float")
                      else str(s["fill"])) for s in states]
    state_bytes = int(sum(s["bytes"] for s in states))
    copies = {}                      # command index -> the states saved right after it
    for s in state_ctx:
        if s["after"] is not None:
            copies.setdefault(s["after"], []).append(s)
    files = {
        "model.h": _ENV.get_template("model.h.j2").render(
            **ctx, inputs=inputs, outputs=outputs, arena_bytes=plan.arena_bytes, strategy=plan.strategy,
            drawing=plan.drawing(width=64).splitlines(), commands=commands,
            input_bytes=sum(t.bytes for t in inputs), output_bytes=sum(t.bytes for t in outputs),
            states=state_ctx, state_bytes=state_bytes, max_rank=max([len(t.shape) for t in list(inputs) + list(outputs)] + [1]), dtype_codes=DTYPE_CODES),
        "kiln_cmd.h": _ENV.get_template("kiln_cmd.h.j2").render(max_io=max_io, max_data=max_data,
                                                                num_kernels=len(kernels)),
        "model.c": _ENV.get_template("model.c.j2").render(**ctx, consts=const_ctx, commands=cmd_ctx,
                                                          weight_bytes=weight_bytes, inputs=inputs, outputs=outputs,
                                                          states=state_ctx, state_bytes=state_bytes,
                                                          state_copies=sorted(copies.items()),
                                                          input_info=[_tensor_info(t) for t in inputs],
                                                          output_info=[_tensor_info(t) for t in outputs]),
        "kernels.c": _ENV.get_template("kernels.c.j2").render(**ctx, kernels=kern_ctx, schedule=schedule),
    }
    for name, text in files.items():
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(text)
    for header in sorted(glob.glob(os.path.join(HERE, "include", "*.h"))):     # kiln_intrinsics.h, kiln_detect.h, ...
        shutil.copy(header, os.path.join(out_dir, os.path.basename(header)))
    return weight_bytes

