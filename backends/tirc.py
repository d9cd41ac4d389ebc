"""TVM PrimFunc -> one plain C function with pointer parameters (no TVM runtime).

Steps (see docs/TVM_NOTES.md): name the function, replace each buffer parameter by a typed pointer
Var and re-declare the buffer at entry (``DeclBuffer``), run the s_tir lowering passes without
``SplitHostDevice``/``MakePackedAPI``/``LowerTVMBuiltin``, lift large stack buffers into extra
pointer parameters (scratch the arena planner serves), ``LowerIntrin``, ``target.build.c``, then
keep only the function definitions (no TVM headers, no prototypes for extern intrinsics).
"""
from __future__ import annotations

import dataclasses
import re

import tvm
from tvm import s_tir, tirx
from tvm.ir import PointerType, PrimType

# stack arrays of at least this many bytes become scratch parameters planned into the arena
# (smaller ones, e.g. the per-pixel patch of a 3x3x16 conv, stay on the stack)
SCRATCH_MIN_BYTES = 256


@dataclasses.dataclass
class CParam:
    name: str
    dtype: str
    const: bool = False          # read-only (input / weights)
    scratch_bytes: int = 0       # > 0: a scratch buffer lifted out of the kernel


def _is_buffer(p):
    return tirx.buffer.is_buffer_var(p)


def pointer_params(func):
    """Replace every buffer parameter by a pointer Var of its element type + DeclBuffer."""
    params, decls = [], []
    for p in func.params:
        if _is_buffer(p):
            ptr = tirx.Var(p.name, PointerType(PrimType(p.dtype)))
            params.append(ptr)
            decls.append(tirx.DeclBuffer(p, data=ptr))
        else:
            params.append(p)
    return tirx.PrimFunc(params, tirx.SeqStmt(decls + [func.body]), func.ret_type, func.attrs)


def _lower_passes():
    return [
        s_tir.transform.CanonicalizeLoop(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.StmtSimplify(),
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
        s_tir.transform.LoopPartition(),
        tirx.transform.VectorizeLoop(False),
        tirx.transform.StorageRewrite(),
        s_tir.transform.HoistIfThenElse(),
        tirx.transform.UnrollLoop(),
        s_tir.transform.RenormalizeSplitPattern(),
        tirx.transform.StmtSimplify(),
        tirx.transform.RemoveNoOp(),
        s_tir.transform.RewriteUnsafeSelect(),
        tirx.transform.CommonSubexprElim(),
        tirx.transform.StmtSimplify(),
    ]


def _nbytes(buf):
    n = 1
    for s in buf.shape:
        n *= int(s)
    return n * tvm.runtime.DataType(buf.dtype).bits // 8


def lift_scratch(func, min_bytes=SCRATCH_MIN_BYTES):
    """Top-level ``AllocBuffer`` of at least ``min_bytes`` -> extra pointer parameter."""
    body = func.body
    seq = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    params = list(func.params)
    lifted = []
    out = []
    for s in seq:
        if isinstance(s, tirx.AllocBuffer) and _nbytes(s.buffer) >= min_bytes:
            buf = s.buffer
            ptr = tirx.Var(f"scratch_{buf.name}", PointerType(PrimType(buf.dtype)))
            params.append(ptr)
            out.append(tirx.DeclBuffer(buf, data=ptr))
            lifted.append((ptr.name, buf.dtype, _nbytes(buf)))
        else:
            out.append(s)
    return tirx.PrimFunc(params, tirx.SeqStmt(out), func.ret_type, func.attrs), lifted


def lower(func, name, ro_names=()):
    """Lower one scheduled PrimFunc. Returns (IRModule with one C-ready function, [CParam])."""
    func = pointer_params(func.with_attr("global_symbol", name).without_attr("tirx.noalias"))
    target = tvm.target.Target("c")
    mod = tvm.IRModule({name: func})
    mod = tirx.transform.BindTarget(target)(mod)
    with tvm.transform.PassContext(opt_level=3):
        mod = tvm.ir.transform.Sequential(_lower_passes())(mod)
    f, lifted = lift_scratch(mod[name])
    mod = tvm.IRModule({name: f})
    with tvm.transform.PassContext(opt_level=3):
        mod = tvm.ir.transform.Sequential([tirx.transform.VerifyMemory(), tirx.transform.LowerIntrin()])(mod)
    scratch = {n: b for n, _, b in lifted}
    params = []
    for p in mod[name].params:
        dt = p.ty.element_type.dtype
        params.append(CParam(p.name, str(dt), p.name in ro_names, scratch.get(p.name, 0)))
    return mod, params


_DROP = re.compile(r"^(#define TVM_EXPORTS|#include\s+\"tvm/|void\* __tvm_ffi__library_ctx|#ifdef __cplusplus|"
                   r"extern \"C\"|#endif|// tvm target)")


_INF = re.compile(r"(?<![\w.])inff\b")


def build_c(mods, ro=None):
    """C source for several lowered modules: each function ``static``, read-only pointer
    parameters ``const``, extern prototypes dropped. ``ro``: function -> read-only param names."""
    ro = ro or {}
    merged = tvm.IRModule()
    for m in mods:
        for gv, f in m.functions.items():
            merged[gv.name_hint] = f
    target = tvm.target.Target("c")
    src = tvm.get_global_func("target.build.c")(merged, target).inspect_source()
    lines = []
    for line in src.splitlines():
        if _DROP.match(line) or line.startswith("#include <"):
            continue
        if re.match(r"^(TVM_DLL )?\w[\w\s\*]*\(.*\);\s*$", line):   # prototypes (kernels and externs)
            continue
        m = re.match(r"^(?:TVM_DLL )?void (\w+)\((.*)\) \{$", line)
        if m:
            fname, args = m.group(1), m.group(2)
            names = set(ro.get(fname, ()))
            new = []
            for a in args.split(", "):
                t, _, n = a.rpartition(" ")
                t = t.strip()
                if n in names:
                    t = "const " + t
                new.append(f"{t} {n}")
            line = f"static void {fname}({', '.join(new)}) {{"
        lines.append(line)
    # TVM's C codegen prints float infinity as "inff" (e.g. the -inf padding of float max
    # pooling); kernels.c includes <math.h>, whose INFINITY is the C spelling
    lines = [_INF.sub("INFINITY", ln) for ln in lines]
    chunks, cur = [], []
    for ln in lines:
        if ln.startswith("static void ") and cur:
            chunks.append(cur)
            cur = []
        cur.append(ln)
    chunks.append(cur)
    out = "\n".join(ln for ch in chunks for ln in _void_unused_params(_drop_unused_locals(ch)))
    return re.sub(r"\n{3,}", "\n\n", out).strip() + "\n"


_DECL = re.compile(r"^\s*(?:const )?\w+ (\w+) = [^;]*;\s*$")
_SIG = re.compile(r"^static void \w+\((.*)\) \{$")


def _void_unused_params(lines):
    """A kernel whose body the simplifier emptied or made constant (a zero-size tensor, an
    activation range of one value) no longer reads some parameters: cast those to void, so the
    package compiles with -Wall -Wextra -Werror (-Wunused-parameter)."""
    m = _SIG.match(lines[0]) if lines else None
    if not m:
        return lines
    body = "\n".join(lines[1:])
    names = [a.rpartition(" ")[2].lstrip("*") for a in m.group(1).split(", ") if a.strip()]
    unused = [n for n in names if not re.search(rf"\b{re.escape(n)}\b", body)]
    return [lines[0]] + [f"  (void){n};" for n in unused] + lines[1:]


def _drop_unused_locals(lines):
    """Remove scalar locals the C codegen declares but never reads (CSE leftovers), so the
    package compiles with -Wall -Wextra -Werror without pragmas."""
    text = "\n".join(lines)
    changed = True
    while changed:
        changed = False
        keep = []
        for ln in lines:
            m = _DECL.match(ln)
            if m and len(re.findall(rf"\b{re.escape(m.group(1))}\b", text)) == 1:
                changed = True
                continue
            keep.append(ln)
        lines = keep
        text = "\n".join(lines)
    return lines
