"""The C backend's pipeline: a list of named passes, run in order on one typed state
(:class:`CompileState`).

    load -> prepare (fold constants, find views) -> check_supported -> fuse -> lower (TVM)
         -> plan (arena) -> check_budget -> emit (package) -> measure (code size)

Each pass's docstring states what it needs before it runs. ``backends/c.py`` wraps the pipeline
as the ``c`` backend (``compile(graph, options) -> CPackage``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import tempfile

import numpy as np

from kiln.frontend.errors import KilnError
from kiln.frontend.graph import Graph
from kiln.frontend.loader import load_model, semantics_of

from . import emit, families, families_tir, ops, passes, planner  # noqa: F401  (ops: fills the registry's C lowerings)
from .cpus import TargetSpec
from .lower import Arg, BuildCache, kernel_of, register_pending, schedule_group, source_key
from .manifest import Command, Manifest, Tensor

ALIGN = 4   # arena buffer alignment (int32/float accesses); the arena itself is 16-byte aligned


class BudgetError(KilnError):
    """The arena does not fit the RAM budget."""


@dataclasses.dataclass
class CompileState:
    """What the passes read and write. The first block is the input; each pass fills the fields
    its docstring names."""
    source: object                      # a Graph, a .json graph path or a .tflite path
    target: TargetSpec
    out_dir: str
    ram_budget: int | None = None
    ram_reserved: dict | None = None    # {what: bytes} of the other RAM a board needs
    plot: bool = True
    measure: bool = True
    graph: Graph | None = None          # load
    model_name: str = ""
    consts: dict = dataclasses.field(default_factory=dict)    # prepare: value -> array
    nodes: list = dataclasses.field(default_factory=list)     # prepare: the nodes left after folding
    views: dict = dataclasses.field(default_factory=dict)     # prepare: view value -> storage value
    groups: list = dataclasses.field(default_factory=list)    # fuse: [passes.Group]
    kernels: list = dataclasses.field(default_factory=list)   # lower: distinct kernels
    commands: list = dataclasses.field(default_factory=list)  # lower: [(kernel, shared kernel)] per command
    tvm_builds: int = 0                                        # lower: TVM builds (distinct kernels)
    plan: planner.MemoryPlan | None = None                    # plan
    state_copy: dict = dataclasses.field(default_factory=dict)  # plan: state -> command after which it is saved
    manifest: Manifest | None = None                          # emit_package

    def store(self, value):
        """The value whose bytes ``value`` uses (itself, or the storage of a view)."""
        return self.views.get(value, value)


# ---- passes ---------------------------------------------------------------------------------
def load(st: CompileState):
    """Needs: ``source``. A Graph as it is, or a model file read by frontend.load_model."""
    st.graph = load_model(st.source)
    st.model_name = st.graph.name


def prepare(st: CompileState):
    """Needs: load. Registers deferred lowerings, folds constant subgraphs, finds views."""
    register_pending()
    st.consts = passes.constants(st.graph)
    st.nodes = passes.fold_constants(st.graph, st.consts)
    st.views = passes.find_views(st.graph, st.nodes, st.consts)


def check_supported(st: CompileState):
    """Needs: prepare."""
    passes.check_supported(st.graph, st.nodes, st.views)


def fuse(st: CompileState):
    """Needs: prepare."""
    st.groups = passes.fuse(st.graph, st.nodes, st.views)


def lower(st: CompileState):
    """Needs: fuse. One TVM kernel per group; kernels equal up to their buffers (the time steps
    of an unrolled RNN) are built once (lower.BuildCache), a family of scheduled kernels differing
    only in integer constants is built once as a template (families_tir.py), and, like any
    kernels with the same C text, they share one C function; a family of kernels whose C differs
    only in integer literals shares one function taking the literals as constants
    (backends/families.py). ``tvm_builds``: how many TVM builds it took."""
    kernels, uniq, cmds = [], {}, []
    cache = BuildCache()
    scheduled = [schedule_group(st.graph, grp, st.target, st.consts, f"k{idx:02d}_{emit.c_ident(grp.name)}"[:48])
                 for idx, grp in enumerate(st.groups)]
    for s, built in zip(scheduled, families_tir.build_all(scheduled, cache)):
        kern = kernel_of(s, built)
        key = (source_key(kern.source, kern.c_function), tuple((a.kind, a.dtype) for a in kern.args))
        if key not in uniq:
            uniq[key] = kern
            kernels.append(kern)
        cmds.append((kern, uniq[key]))
    st.tvm_builds = cache.builds
    st.kernels, st.commands = families.share(kernels, cmds)


def plan(st: CompileState):
    """Needs: lower. Buffers for graph inputs, kernel outputs and kernel scratch (lifetimes from
    planner.lifetimes); in-place hints from the kernels; the planner picks the smallest strategy."""
    g, store = st.graph, st.store
    steps, scratch = [], []
    for t, (kern, _) in enumerate(st.commands):
        writes = [store(v) for v in [kern.out, *kern.also]]
        steps.append(([store(a.name) for a in kern.args if a.kind == "value"], writes))
        scratch += [planner.Buffer(f"{t}:{a.name}", a.nbytes, t, t, ALIGN) for a in kern.args if a.kind == "scratch"]
    # a state's next value is copied into the state's buffer right after the command producing
    # it (its arena bytes are then free after its last reader), or at the end of the run
    st.state_copy = _state_copies(st)
    kept = list(g.outputs) + [v for s, v in g.states.items() if st.state_copy[s] is None]
    outs = {store(o) for o in kept}
    first, last = planner.lifetimes([store(v) for v in g.inputs], steps, [store(o) for o in kept])
    size = {store(v): g.types[v].nbytes for v in g.inputs}
    size.update({store(v): g.types[v].nbytes for kern, _ in st.commands for v in [kern.out, *kern.also]})
    bufs = [planner.Buffer(s, size[s], first[s], max(last[s], first[s]), ALIGN) for s in first] + scratch
    aliases = []
    for t, (kern, _) in enumerate(st.commands):
        so = store(kern.out)
        for v, shift in kern.inplace.items():
            si = store(v)
            if si in first and si != so and last[si] == t and first[so] == t and si not in outs and shift is not None:
                aliases.append(planner.Alias(so, si, shift))
    st.plan = planner.plan(bufs, aliases)


def _state_copies(st: CompileState):
    """state -> the command after which the run saves its next value: the command producing it,
    when no later command reads the state's current value; else None (the end of the run)."""
    producer = {st.store(v): t for t, (kern, _) in enumerate(st.commands) for v in [kern.out, *kern.also]}
    out = {}
    for s, v in st.graph.states.items():
        t = producer.get(st.store(v))
        readers = [u for u, (kern, _) in enumerate(st.commands) if any(a.kind == "const" and a.name == s
                                                                        for a in kern.args)]
        out[s] = t if t is not None and all(u <= t for u in readers) else None
    return out


def check_budget(st: CompileState):
    """Needs: plan. The arena plus ``ram_reserved`` (the rest of what the board keeps in RAM)
    must fit ``ram_budget``."""
    budget, p = st.ram_budget, st.plan
    parts = {"arena": p.arena_bytes, **(st.ram_reserved or {})}
    if st.graph.states:
        parts["state"] = sum(st.graph.types[s].nbytes for s in st.graph.states)
    need = sum(parts.values())
    if budget is not None and need > budget:
        what = f"arena of {need} B"
        if len(parts) > 1:
            what = (f"the model needs {need:,} B of RAM (" + " + ".join(f"{k} {v:,} B" for k, v in parts.items())
                    + "; the firmware's own .data/.bss come on top, checked when linking)")
        raise BudgetError(f"{what} does not fit the RAM budget of {budget} B (over by {need - budget} B); largest "
                          f"live set without in-place reuse is {p.lower_bound()} B")


def emit_package(st: CompileState):
    """Needs: plan. Writes model.h, model.c, kernels.c, kiln_cmd.h, kiln_intrinsics.h (and
    plan.txt, memory.png); sets ``manifest`` (written by :func:`run`)."""
    consts, commands = _command_buffer(st)
    inputs, outputs = _io_tensors(st, st.graph.inputs), _io_tensors(st, st.graph.outputs)
    states = _state_tensors(st)
    target, p = st.target, st.plan
    sched = ("Kiln kernels, " + ("DSP (SXTB16/SMLAD)" if target.dsp else "portable C")) if target.kernels \
        else "TVM default (plain C)"
    weight_bytes = emit.render(st.out_dir, model_name=st.model_name, target=target.name, kernels=st.kernels,
                               commands=commands, consts=consts, plan=p, inputs=inputs, outputs=outputs,
                               schedule=sched, optimize=target.optimize, states=_state_records(st, states))
    with open(os.path.join(st.out_dir, "plan.txt"), "w") as f:
        f.write(p.table() + "\n\n" + p.drawing() + "\n")
    if st.plot:
        try:
            planner.plot(p, os.path.join(st.out_dir, "memory.png"), title=st.model_name)
        except Exception:  # noqa: BLE001 (a plot is a nicety)
            pass
    st.manifest = Manifest(
        target=target.name, model=st.model_name, arena_bytes=p.arena_bytes, inputs=inputs, outputs=outputs,
        kernels=[k.name for k in st.kernels], dsp=target.dsp, optimize=target.optimize, arena_peak=p.peak,
        planner=p.strategy, planner_tried=p.tried, weight_bytes=weight_bytes,
        input_bytes=sum(t.bytes for t in inputs), output_bytes=sum(t.bytes for t in outputs),
        commands=[Command(name=c["name"], ops=c["ops"], nodes=c["nodes"], c_function=c["c_function"], macs=c["macs"],
                          offs=c["offs"]) for c in commands],
        macs=int(sum(c["macs"] for c in commands)),
        states=states, state_bytes=sum(t.bytes for t in states),
        files=["model.h", "model.c", "kernels.c", "kiln_cmd.h", "kiln_intrinsics.h"],
        semantics=semantics_of(st.graph) if any(t.quant is not None for t in st.graph.types.values()) else None)


def _command_buffer(st: CompileState):
    """(constants [(C name, array, description)], commands [emit's command records]): each
    command's arena offsets and constant arrays, constants shared by name and by content (the
    time steps of an unrolled RNN each prepare the same packed weights and tables: one copy)."""
    consts, cindex, by_content = [], {}, {}

    def const_ref(kern, a, arr=None):
        if a.name in st.graph.states:
            return state_buffer(a.name)    # the state's own RAM buffer (model.c), not a flash constant
        if a.name not in cindex:
            arr = st.consts.get(a.name) if arr is None else arr
            arr = kern.extra_consts[a.name] if arr is None else arr
            arr = np.ascontiguousarray(arr).astype(a.dtype)
            content = (str(arr.dtype), arr.size, hashlib.sha256(arr.tobytes()).hexdigest())
            if content in by_content:
                cindex[a.name] = by_content[content]
            else:
                cindex[a.name] = by_content[content] = "c_" + emit.c_ident(a.name)
                consts.append((cindex[a.name], arr, f"{a.name}: {a.dtype}{list(arr.shape)}"))
        return cindex[a.name]
    commands = []
    kid = {k.name: i for i, k in enumerate(st.kernels)}
    for t, (kern, shared) in enumerate(st.commands):
        offs, data = [], []
        for a in kern.args:
            if a.kind == "const":
                data.append(const_ref(kern, a))
            elif a.kind == "scratch":
                offs.append(st.plan.offsets[f"{t}:{a.name}"])
            else:
                offs.append(st.plan.offsets[st.store(a.name)])
        record = offs                    # the offsets in the command record
        if emit.io_outside(shared):     # many operands: the offsets go to a constant array
            arr = np.asarray(offs, np.uint32)
            data.append(const_ref(kern, Arg("const", f"{kern.name}.offsets", "uint32", arr.nbytes), arr))
            record = []
        commands.append(dict(name=kern.out, ops="+".join(kern.ops), kernel=kid[shared.name], macs=kern.macs,
                             offs=offs, record_offs=record, data=data, nodes=kern.nodes,
                             c_function=shared.name))
    return consts, commands


def state_buffer(name):
    """The C name of a state's static buffer in model.c."""
    return "s_" + emit.c_ident(name)


def _state_tensors(st: CompileState):
    """Manifest records of the graph's states: offset is where the run leaves the next state in
    the arena (copied into the state's buffer after the command producing it, or at the end)."""
    g = st.graph
    out = []
    for s, v in g.states.items():
        t = g.types[s]
        q = t.quant if t.quant is not None and not t.quant.per_channel else None
        out.append(Tensor(name=s, shape=list(t.shape), dtype=t.dtype, bytes=t.nbytes,
                          offset=st.plan.offsets[st.store(v)], value=v,
                          scale=float(q.scale[0]) if q is not None else None,
                          zero_point=int(q.zero_point[0]) if q is not None else None))
    return out


def _state_records(st: CompileState, states):
    """emit's state records: C buffer name, dtype, element count, reset value (one fill value
    or an array), arena offset and bytes of the next value, the command after which it is saved
    (``after``; None: at the end of the run)."""
    recs = []
    for t in states:
        reset = np.ascontiguousarray(st.graph.consts[t.name]).astype(t.dtype).ravel()
        fill = reset[0] if reset.size and np.all(reset == reset[0]) else None
        recs.append(dict(cname=state_buffer(t.name), dtype=t.dtype, count=max(1, reset.size), bytes=t.bytes,
                         offset=t.offset, after=st.state_copy.get(t.name), fill=None if fill is None else int(fill) if reset.dtype.kind in "iu"
                         else float(fill), reset=reset, desc=f"{t.name}: {t.dtype}{list(t.shape)}"))
    return recs


def _io_tensors(st: CompileState, values):
    """The manifest records of graph inputs (or outputs): arena offset and offset in the packed
    buffer, quantisation when per-tensor."""
    out, packed = [], 0
    for v in values:
        t = st.graph.types[v]
        q = t.quant if t.quant is not None and not t.quant.per_channel else None
        out.append(Tensor(name=v, shape=list(t.shape), dtype=t.dtype, bytes=t.nbytes,
                          offset=st.plan.offsets.get(st.store(v), 0), packed=packed,
                          scale=float(q.scale[0]) if q is not None else None,
                          zero_point=int(q.zero_point[0]) if q is not None else None))
        packed += t.nbytes
    return out


def measure(st: CompileState):
    """Needs: emit_package. Code/data sizes with arm-none-eabi-gcc -O2 (Cortex-M targets)."""
    if st.target.is_host or not st.measure:
        return
    st.manifest.sizes = code_size(st.out_dir, st.target)


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
    return _parse_sizes(out)


def _parse_sizes(out):
    """arm-none-eabi-size -A output of kernels.c.o and model.c.o -> {kernels_text, model_text,
    rodata, code_bytes}."""
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


def run(state: CompileState) -> CompileState:
    """Run every pass of PIPELINE on ``state`` (writing into ``state.out_dir``)."""
    for p in PIPELINE:
        p(state)
    return state
