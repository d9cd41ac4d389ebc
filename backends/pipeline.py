"""The C backend's pipeline: a list of named passes, run in order on one state dict.

    load -> prepare (fold constants, find views) -> check_supported -> fuse -> lower (TVM)
         -> plan (arena) -> check_budget -> emit (package) -> measure (code size)

Each pass's docstring states what it needs before it runs.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np

from kiln.frontend.errors import KilnError
from kiln.frontend.files import staged_dir

from . import cpus, emit, passes, planner
from .lower import lower_group, register_pending, source_key

ALIGN = 4   # arena buffer alignment (int32/float accesses); the arena itself is 16-byte aligned


class BudgetError(KilnError):
    """The arena does not fit the RAM budget."""


@dataclasses.dataclass
class Package:
    """A compiled C package on disk; ``manifest`` is the parsed manifest.json."""
    path: str
    manifest: dict
    plan: planner.MemoryPlan = None
    graph: object = None

    @property
    def arena_bytes(self):
        return self.manifest["arena_bytes"]

    def run(self, *inputs):
        """Run on the host (compiled with host gcc, called through ctypes)."""
        from .host import HostModel
        return HostModel(self.path).run(*inputs)


# ---- passes ---------------------------------------------------------------------------------
def load(st):
    """Needs: st['source'] (a Graph or a model file kiln.frontend.load_model reads: .json, .tflite,
    .onnx, .pt2)."""
    from kiln.frontend import load_model
    src = st["source"]
    if not isinstance(src, (str, os.PathLike)):
        st["graph"] = load_model(src)
    else:
        path = os.fspath(src)
        if not os.path.exists(path):
            raise KilnError(f"model file {path} not found")
        st["graph"] = load_model(path)

    st["model_name"] = st["graph"].name


def prepare(st):
    """Needs: load. Registers deferred lowerings, folds constant subgraphs, finds views."""
    import kiln.backends.ops  # noqa: F401  (fills the registry's C lowerings)
    register_pending()
    g = st["graph"]
    st["consts"] = passes.constants(g)
    st["nodes"] = passes.fold_constants(g, st["consts"])
    st["views"] = passes.find_views(g, st["nodes"], st["consts"])


def check_supported(st):
    """Needs: prepare."""
    passes.check_supported(st["graph"], st["nodes"], st["views"])


def fuse(st):
    """Needs: prepare."""
    st["groups"] = passes.fuse(st["graph"], st["nodes"], st["views"])


def lower(st):
    """Needs: fuse. One TVM kernel per group; identical kernels (same C text) are shared."""
    g, target = st["graph"], st["target"]
    kernels, uniq, cmds = [], {}, []
    for idx, grp in enumerate(st["groups"]):
        kname = f"k{idx:02d}_{emit.c_ident(grp.name)}"[:48]
        kern = lower_group(g, grp, target, st["consts"], kname)
        key = (source_key(kern.source, kname), tuple((a.kind, a.dtype) for a in kern.args))
        if key not in uniq:
            uniq[key] = kern
            kernels.append(kern)
        cmds.append((kern, uniq[key]))
    st["kernels"] = kernels
    st["commands"] = cmds


def plan(st):
    """Needs: lower. Buffers for graph inputs, kernel outputs and kernel scratch; in-place hints
    from the kernels; the planner picks the smallest strategy."""
    g, views, cmds = st["graph"], st["views"], st["commands"]
    n = len(cmds)
    store = lambda v: views.get(v, v)  # noqa: E731
    first, last, size = {}, {}, {}
    for v in g.inputs:
        s = store(v)
        first[s], last[s], size[s] = 0, 0, g.types[v].nbytes
    scratch = []
    for t, (kern, _) in enumerate(cmds):
        s = store(kern.out)
        first.setdefault(s, t)
        last[s] = max(last.get(s, t), t)
        size[s] = g.types[kern.out].nbytes
        for a in kern.args:
            if a.kind == "value":
                sv = store(a.name)
                last[sv] = max(last.get(sv, t), t)
            elif a.kind == "scratch":
                scratch.append(planner.Buffer(f"{t}:{a.name}", a.nbytes, t, t, ALIGN))
    for o in g.outputs:
        s = store(o)
        if s in first:
            last[s] = max(n - 1, 0)
    bufs = [planner.Buffer(s, size[s], first[s], max(last[s], first[s]), ALIGN) for s in first] + scratch
    aliases = []
    outs = {store(o) for o in g.outputs}
    for t, (kern, _) in enumerate(cmds):
        so = store(kern.out)
        for v, shift in kern.inplace.items():
            si = store(v)
            if si in first and si != so and last[si] == t and first[so] == t and si not in outs and shift is not None:
                aliases.append(planner.Alias(so, si, shift))
    st["plan"] = planner.plan(bufs, aliases)
    st["store"] = store


def check_budget(st):
    """Needs: plan. The arena plus ``ram_reserved`` (the rest of what the board keeps in RAM)
    must fit ``ram_budget``."""
    budget = st.get("ram_budget")
    p = st["plan"]
    parts = {"arena": p.arena_bytes, **(st.get("ram_reserved") or {})}
    need = sum(parts.values())
    if budget is not None and need > budget:
        what = f"arena of {need} B"
        if len(parts) > 1:
            what = (f"the model needs {need:,} B of RAM (" + " + ".join(f"{k} {v:,} B" for k, v in parts.items())
                    + "; the firmware's own .data/.bss come on top, checked when linking)")
        raise BudgetError(f"{what} does not fit the RAM budget of {budget} B (over by {need - budget} B); largest "
                          f"live set without in-place reuse is {p.lower_bound()} B")


def emit_package(st):
    """Needs: plan. Writes model.h, model.c, kernels.c, kiln_cmd.h, kiln_intrinsics.h,
    manifest.json (and plan.txt, memory.png)."""
    g, p, store = st["graph"], st["plan"], st["store"]
    out_dir = st["out_dir"]
    consts, cindex = [], {}

    def const_ref(kern, a):
        arr = st["consts"].get(a.name)
        if arr is None:
            arr = kern.extra_consts[a.name]
        key = a.name
        if key not in cindex:
            cname = "c_" + emit.c_ident(a.name)
            arr = np.ascontiguousarray(arr).astype(a.dtype)
            cindex[key] = cname
            consts.append((cname, arr, f"{a.name}: {a.dtype}{list(arr.shape)}"))
        return cindex[key]
    commands = []
    kid = {k.name: i for i, k in enumerate(st["kernels"])}
    for t, (kern, shared) in enumerate(st["commands"]):
        offs, data = [], []
        for a in kern.args:
            if a.kind == "const":
                data.append(const_ref(kern, a))
            elif a.kind == "scratch":
                offs.append(p.offsets[f"{t}:{a.name}"])
            else:
                offs.append(p.offsets[store(a.name)])
        commands.append(dict(name=kern.nodes[-1], ops="+".join(kern.ops), kernel=kid[shared.name], macs=kern.macs,
                             offs=offs, data=data, nodes=kern.nodes, c_function=shared.name))

    def tinfo(v, packed):
        t = g.types[v]
        q = t.quant
        return dict(name=v, shape=list(t.shape), dtype=t.dtype, bytes=t.nbytes, offset=p.offsets.get(store(v), 0),
                    packed=packed, scale=(float(q.scale[0]) if q is not None and not q.per_channel else None),
                    zero_point=(int(q.zero_point[0]) if q is not None and not q.per_channel else None))
    inputs, off = [], 0
    for v in g.inputs:
        inputs.append(tinfo(v, off))
        off += g.types[v].nbytes
    outputs, off = [], 0
    for v in g.outputs:
        outputs.append(tinfo(v, off))
        off += g.types[v].nbytes
    target = st["target"]
    sched = ("Kiln kernels, " + ("DSP (SXTB16/SMLAD)" if target.dsp else "portable C")) if target.kernels \
        else "TVM default (plain C)"
    weight_bytes = emit.render(out_dir, model_name=st["model_name"], target=target.name, kernels=st["kernels"],
                               commands=commands, consts=consts, plan=p, inputs=inputs, outputs=outputs,
                               schedule=sched, optimize=target.optimize)
    with open(os.path.join(out_dir, "plan.txt"), "w") as f:
        f.write(p.table() + "\n\n" + p.drawing() + "\n")
    if st.get("plot", True):
        try:
            planner.plot(p, os.path.join(out_dir, "memory.png"), title=st["model_name"])
        except Exception:  # noqa: BLE001 (a plot is a nicety)
            pass
    st["manifest"] = dict(
        format="kiln-c-package", version=1, model=st["model_name"], target=target.name, dsp=target.dsp,
        optimize=target.optimize,
        arena_bytes=p.arena_bytes, arena_peak=p.peak, planner=p.strategy, planner_tried=p.tried,
        weight_bytes=weight_bytes, inputs=inputs, outputs=outputs,
        input_bytes=sum(t["bytes"] for t in inputs), output_bytes=sum(t["bytes"] for t in outputs),
        commands=[{k: c[k] for k in ("name", "ops", "nodes", "c_function", "macs", "offs")} for c in commands],
        kernels=[k.name for k in st["kernels"]], macs=int(sum(c["macs"] for c in commands)),
        files=["model.h", "model.c", "kernels.c", "kiln_cmd.h", "kiln_intrinsics.h"],
        sizes={}, compile_seconds=None)


def measure(st):
    """Needs: emit_package. Code/data sizes with arm-none-eabi-gcc -O2 (Cortex-M targets)."""
    target = st["target"]
    if target.is_host or not st.get("measure", True):
        return
    st["manifest"]["sizes"] = code_size(st["out_dir"], target)


def code_size(pkg_dir, target, opt="-O2"):
    gcc = shutil.which("arm-none-eabi-gcc")
    size = shutil.which("arm-none-eabi-size")
    if not gcc or not size:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        objs = []
        for c in ("kernels.c", "model.c"):
            o = os.path.join(tmp, c + ".o")
            subprocess.run([gcc, *target.cflags, opt, "-ffunction-sections", "-fdata-sections", "-std=c99",
                            "-Wall", "-Wextra", "-Werror", "-I", pkg_dir, "-c", os.path.join(pkg_dir, c), "-o", o],
                           check=True, capture_output=True, text=True)
            objs.append(o)
        out = subprocess.run([size, "-A", *objs], check=True, capture_output=True, text=True).stdout
    sizes = {"kernels_text": 0, "model_text": 0, "rodata": 0}
    cur = None
    for line in out.splitlines():
        if line.endswith(":") and ".o" in line:
            cur = "kernels" if "kernels.c" in line else "model"
            continue
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            sec, n = parts[0], int(parts[1])
            if sec.startswith(".text"):
                sizes[f"{cur}_text"] += n
            elif sec.startswith(".rodata"):
                sizes["rodata"] += n
    sizes["code_bytes"] = sizes["kernels_text"] + sizes["model_text"]
    return sizes


PIPELINE = [load, prepare, check_supported, fuse, lower, plan, check_budget, emit_package, measure]


def compile(graph_or_path, target="cortex-m4", out_dir=None, ram_budget=None, plot=True, measure_size=True,
            optimize="size", ram_reserved=None):
    """Compile a model (Graph, .json or .tflite) to a C package in ``out_dir``. ``optimize``:
    "size" (int8 weights everywhere, the default) or "speed" (int16-packed weights for layers
    up to schedules.W16_MAX_BYTES: fewer instructions, more flash). ``ram_budget``: bytes of RAM
    for the arena plus ``ram_reserved`` ({what: bytes} of the other RAM a board needs, e.g. the
    input and output buffers and the stack); more fails with BudgetError."""
    t0 = time.time()
    if out_dir is None:
        out_dir = tempfile.mkdtemp(prefix="kiln_pkg_")
    # the package is written to a temporary folder beside out_dir and moved into place when
    # complete: a failure (a full disk included) leaves no half-written package
    with staged_dir(out_dir, "package folder", last="manifest.json") as tmp:
        st = dict(source=graph_or_path, target=cpus.get(target, optimize), out_dir=tmp, ram_budget=ram_budget,
                  ram_reserved=ram_reserved, plot=plot, measure=measure_size)
        for p in PIPELINE:
            p(st)
        st["manifest"]["compile_seconds"] = round(time.time() - t0, 3)
        emit.write_manifest(st["out_dir"], st["manifest"])
    return Package(os.fspath(out_dir), st["manifest"], st["plan"], st["graph"])


def load_package(path):
    with open(os.path.join(path, "manifest.json")) as f:
        return Package(path, json.load(f))
