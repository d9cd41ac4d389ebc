"""CUDA package emitter: Kiln float graphs -> `.cu` + launch plan + arena plan + weights blob.

The package runs without TVM (backends/cuda_runner.py: CuPy/NVRTC). Pipeline, one named pass
each (``PIPELINE``); every step only needs what the one before produced:

  to_relax      one ``emit_te`` per node with the TE rules of backends/tvm_te.py (float32, or
                float16/bfloat16 storage with float32 accumulation)
  fuse          Relax AnnotateTIROpPattern + FuseOps + FuseTIR: element-wise epilogues (bias,
                activation, BN arithmetic, gradient masks) fuse into their producers
  steps         walk Relax ``main``: each ``call_tir`` is one step with its argument values
  schedule      DLight per PrimFunc (Matmul, GEMV, Reduction, GeneralReduction, Fallback, first
                rule that schedules *and* lowers wins; convolutions go to Fallback)
  lower         the s_tir lowering passes up to SplitHostDevice (no packed API): the host side of
                each step is then a list of ``call_ffi_kernel`` launches whose arguments are the
                step's buffers or step-local global temporaries, with grid/block extents
  plan          a static greedy arena plan over (bytes, first step, last step) of graph inputs,
                activations, outputs and step temporaries; weights go to one blob
  emit          kernels.cu (device code from the same lowered IR), manifest.json (launch plan:
                kernel, grid, block, dynamic shared memory, each argument as arena/weights offset),
                weights.bin, plan.txt (the arena drawn), groups.json (unscheduled TIR of each step,
                for the CPU plan interpreter)

``interpret_plan(pkg, inputs)`` executes the *same* plan on the CPU: each step's PrimFunc is built
for LLVM and called on NumPy views of one arena and the weights blob at the manifest's offsets,
so offsets, lifetimes and step order are validated without a GPU.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np

from kiln.frontend.errors import KilnError
from kiln.frontend.graph import Graph
from kiln.frontend.types import TensorType

from . import tvm_te

ALIGN = 256
FORMAT = 1
DTYPES = ("float32", "float16", "bfloat16")
PIPELINE = ["to_relax", "fuse", "steps", "schedule", "lower", "plan", "emit"]
RULES = ("Matmul", "GEMV", "Reduction", "GeneralReduction", "Fallback")


def gpu_target(arch="sm_90"):
    import tvm
    return tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm")


def _nbytes(shape, dtype):
    return int(np.prod(shape, dtype=np.int64)) * TensorType((), dtype).itemsize


def _align(n, a=ALIGN):
    return (n + a - 1) // a * a


# ---- fuse + steps -----------------------------------------------------------------------------
def fuse(graph: Graph, dtype="float32", target=None, with_updates=False):
    """Relax module after FuseTIR (PrimFuncs unscheduled)."""
    import tvm
    from tvm import relax
    mod = tvm_te.to_relax(graph, dtype=dtype, with_updates=with_updates)
    seq = [relax.transform.LegalizeOps(), relax.transform.DeadCodeElimination(),
           relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
           relax.transform.FuseTIR(), relax.transform.DeadCodeElimination()]
    if target is not None:
        with target:
            return tvm.transform.Sequential(seq)(mod)
    return tvm.transform.Sequential(seq)(mod)


def _sinfo_list(ty):
    from tvm import relax
    if isinstance(ty, relax.TupleType):
        return list(ty.fields)
    return [ty]


def _shape_dtype(ty):
    return tuple(int(s) for s in ty.shape.values), str(ty.dtype)


def extract_steps(mod, graph: Graph, dtype="float32", with_updates=False):
    """Steps of Relax ``main`` as data: values {name: {shape, dtype, kind}} and steps
    [{func, args: [value names, inputs then outputs]}], plus the output value names."""
    from tvm import relax
    main = mod["main"]
    names = tvm_te.runtime_args(graph)
    values, steps, var_name = {}, [], {}
    for p, n in zip(main.params, names):
        t = graph.types[n]
        kind = "input" if n in graph.inputs else "weight"
        values[n] = {"shape": list(t.shape), "dtype": tvm_te.storage_dtype(t, dtype), "kind": kind}
        var_name[p] = n
    body = main.body
    blocks = body.blocks
    for blk in blocks:
        for b in blk.bindings:
            v = b.value
            if isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.call_tir":
                gv, args = v.args[0], v.args[1]
                arg_names = []
                for a in args.fields:
                    if a not in var_name:
                        raise KilnError(f"step {gv.name_hint}: argument {a} is not a known value")
                    arg_names.append(var_name[a])
                outs = []
                for k, ty in enumerate(_sinfo_list(v.ty_args[0] if len(v.ty_args) else b.var.ty)):
                    shape, dt = _shape_dtype(ty)
                    name = f"{b.var.name}" if len(_sinfo_list(b.var.ty)) == 1 else f"{b.var.name}.{k}"
                    name = _unique(name, values)
                    values[name] = {"shape": list(shape), "dtype": dt, "kind": "activation"}
                    outs.append(name)
                var_name[b.var] = outs[0] if len(outs) == 1 else tuple(outs)
                steps.append({"func": gv.name_hint, "args": arg_names + outs, "n_in": len(arg_names)})
            elif isinstance(v, relax.TupleGetItem):
                var_name[b.var] = var_name[v.tuple_value][v.index]
            elif isinstance(v, relax.Tuple):
                var_name[b.var] = tuple(var_name[f] for f in v.fields)
            elif isinstance(v, relax.Var):
                var_name[b.var] = var_name[v]
            else:
                raise KilnError(f"unexpected binding in the fused Relax main: {b.var} = {type(v).__name__}")
    res = body.body
    if isinstance(res, relax.Var):
        res = var_name[res]
    elif isinstance(res, relax.Tuple):
        res = tuple(var_name[f] for f in res.fields)
    outs = list(res) if isinstance(res, tuple) else [res]
    return values, steps, outs


def _unique(name, taken):
    base, k = name, 1
    while name in taken:
        name = f"{base}_{k}"
        k += 1
    return name


# ---- schedule + lower -------------------------------------------------------------------------
def _lower_passes():
    """The s_tir pipeline of tvm/s_tir/pipeline.py (0.27) up to SplitHostDevice, without
    MakePackedAPI: the host side keeps typed buffer parameters and plain kernel launches."""
    from tvm import s_tir, tirx
    return [
        s_tir.transform.CanonicalizeLoop(), s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.LiftThreadBinding(),
        s_tir.transform.ManifestSharedMemoryLocalStage(), s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerAutoCopy(), s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(), s_tir.transform.StmtSimplify(),
        s_tir.transform.InjectPermutedLayout(), s_tir.transform.AnnotateIrregularLoop(),
        s_tir.transform.InjectSoftwarePipeline(), s_tir.transform.TransformMmaBufferLayout(),
        s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
        tirx.transform.BF16ComputeLegalize(), tirx.transform.NarrowDataType(32),
        s_tir.transform.LoopPartition(), tirx.transform.VectorizeLoop(True),
        s_tir.transform.InjectVirtualThread(), s_tir.transform.InjectDoubleBuffer(),
        tirx.transform.StorageRewrite(), s_tir.transform.HoistIfThenElse(), tirx.transform.UnrollLoop(),
        s_tir.transform.RenormalizeSplitPattern(), tirx.transform.StmtSimplify(), tirx.transform.RemoveNoOp(),
        s_tir.transform.RewriteUnsafeSelect(), tirx.transform.CommonSubexprElim(),
        tirx.transform.FP8ComputeLegalize(), tirx.transform.VerifyMemory(), tirx.transform.AnnotateEntryFunc(),
        s_tir.transform.ThreadSync("shared"), s_tir.transform.ThreadSync("shared.dyn"),
        s_tir.transform.ThreadSync("warp"), s_tir.transform.InferFragment(),
        s_tir.transform.LowerThreadAllreduce(), s_tir.transform.MergeSharedMemoryAllocations(),
        tirx.transform.SplitHostDevice(),
    ]


def _lower(mod, target):
    import tvm
    mod = tvm.tirx.transform.BindTarget(target)(mod)
    return tvm.transform.Sequential(_lower_passes())(mod)


def schedule_gpu(name, func, target):
    """(scheduled PrimFunc, rule name): the first DLight rule that schedules the function and
    whose result lowers. Raises naming the function when none does."""
    import tvm
    from tvm.s_tir import dlight as dl
    errors = []
    for rule in RULES:
        try:
            with target:
                sch = getattr(dl.gpu, rule)().apply(func, target, False)
            if sch is None:
                continue
            sch = sch[0] if isinstance(sch, (list, tuple)) else sch
            f = sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("global_symbol", name)
            _lower(tvm.IRModule({name: f}), target)   # must lower, too
            return f, rule
        except Exception as e:   # noqa: BLE001 - try the next rule, report all at the end
            errors.append(f"{rule}: {str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__}")
    raise KilnError(f"no GPU schedule for step {name!r}: " + "; ".join(errors))


def _walk(stmt, fn):
    t = type(stmt).__name__
    fn(stmt)
    if t == "SeqStmt":
        for s in stmt.seq:
            _walk(s, fn)
    else:
        for attr in ("body", "then_case", "else_case"):
            s = getattr(stmt, attr, None)
            if s is not None and not isinstance(s, (int, float)) and hasattr(s, "__class__") \
                    and type(s).__module__.startswith("tvm"):
                try:
                    _walk(s, fn)
                except TypeError:
                    pass


def _int(e):
    return int(e.value) if hasattr(e, "value") else int(e)


def launches_of(host_func, step_name):
    """Launches of one lowered host function: [{kernel, grid, block, shared_bytes, args}] where each
    arg is ('param', index) | ('temp', name) | ('scalar', value), and temps {name: (shape, dtype)}."""
    params = list(host_func.params)
    temps, launches = {}, []

    def visit(s):
        t = type(s).__name__
        if t == "AllocBuffer":
            b = s.buffer
            if b.scope() == "global":
                temps[b.name] = ([_int(x) for x in b.shape], str(b.dtype), b)
        elif t == "Evaluate" and getattr(getattr(s.value, "op", None), "name", "") == "tirx.call_ffi_kernel":
            c = s.value
            lp = [str(p) for p in c.attrs.launch_params]
            kargs, dims = list(c.args[1:len(c.args) - len(lp)]), list(c.args[len(c.args) - len(lp):])
            grid, block, shared = [1, 1, 1], [1, 1, 1], 0
            for tag, d in zip(lp, dims):
                if tag.startswith("blockIdx."):
                    grid["xyz".index(tag[-1])] = _int(d)
                elif tag.startswith("threadIdx."):
                    block["xyz".index(tag[-1])] = _int(d)
                elif "dyn_shared" in tag:
                    shared = _int(d)
                else:
                    raise KilnError(f"step {step_name!r}: unknown launch parameter {tag!r}")
            args = []
            for a in kargs:
                if getattr(getattr(a, "op", None), "name", "") == "tirx.buffer_data":
                    var = a.args[0]
                    hit = [i for i, p in enumerate(params) if p.same_as(var)] or \
                        [i for i, p in enumerate(params) if str(a) == f"{p.name}.data"]
                    if hit:
                        args.append(("param", hit[0]))
                        continue
                    tname = [n for n, (_, _, b) in temps.items() if b.same_as(var) or str(a) == f"{n}.data"]
                    if tname:
                        args.append(("temp", tname[0]))
                        continue
                    raise KilnError(f"step {step_name!r}: kernel argument {a} is neither a parameter nor a "
                                    f"temporary\n{host_func.script(show_meta=False)}")
                elif hasattr(a, "value"):
                    args.append(("scalar", a.value, str(a.ty) if hasattr(a, "ty") else "int32"))
                else:
                    raise KilnError(f"step {step_name!r}: kernel argument {a} is not a buffer or a constant")
            launches.append({"kernel": str(c.args[0].value), "grid": grid, "block": block,
                             "shared_bytes": shared, "args": args})
    _walk(host_func.body, visit)
    return launches, {n: (shape, dt) for n, (shape, dt, _) in temps.items()}


def lower_steps(tir_mod, target):
    """Schedule every PrimFunc, lower them together, return ({func: (launches, temps, rule)}, cuda
    source)."""
    import tvm
    from tvm.tirx.compilation_pipeline import finalize_device_passes
    sched, rules = {}, {}
    for gv, f in tir_mod.functions.items():
        sched[gv.name_hint], rules[gv.name_hint] = schedule_gpu(gv.name_hint, f, target)
    low = _lower(tvm.IRModule(sched), target)
    info, kernels = {}, {}
    for gv, f in low.functions.items():
        if gv.name_hint in sched:          # host side of a step: its launches
            launches, temps = launches_of(f, gv.name_hint)
            info[gv.name_hint] = (launches, temps, rules.get(gv.name_hint))
        else:                              # a device kernel
            kernels[gv] = f
    dmod = finalize_device_passes()(tvm.IRModule(kernels))
    src = tvm.get_global_func("target.build.cuda")(dmod, _device_target(target)).inspect_source()
    return info, src


def _device_target(target):
    import tvm
    d = dict(target.export())
    d.pop("host", None)
    return tvm.target.Target(d)


# ---- static memory plan -----------------------------------------------------------------------
def plan_arena(buffers, align=ALIGN):
    """Static arena plan with backends/planner.py (the C backend's planner: greedy strategies,
    smallest wins): buffers [(name, bytes, first step, last step)] -> ({name: offset}, arena bytes).
    Two buffers may share bytes only when their [first, last] step ranges do not intersect."""
    from . import planner
    p = planner.plan([planner.Buffer(n, s, f, l, align) for n, s, f, l in buffers], random_orders=0)
    return dict(p.offsets), _align(p.peak, align)


def check_plan(buffers, offsets, align=16):
    """Raise if two buffers alive at the same step overlap in the arena (or one is misaligned)."""
    from . import planner
    bad = planner.overlaps([planner.Buffer(n, s, f, l, align) for n, s, f, l in buffers], offsets)
    if bad:
        raise KilnError("arena plan is wrong: " + "; ".join(bad[:5]))


def draw_plan(buffers, offsets, peak, width=64):
    lines = [f"arena: {peak} bytes ({len(buffers)} buffers, alignment {ALIGN})",
             f"{'buffer':<40} {'offset':>10} {'bytes':>10}  steps"]
    for n, s, f, l in sorted(buffers, key=lambda b: (offsets[b[0]], b[2])):
        lo = int(offsets[n] / max(peak, 1) * width)
        hi = max(lo + 1, int((offsets[n] + s) / max(peak, 1) * width))
        lines.append(f"{n:<40} {offsets[n]:>10} {s:>10}  {f:>3}..{l:<3} |{' ' * lo}{'#' * (hi - lo)}{' ' * (width - hi)}|")
    return "\n".join(lines)


# ---- weights ----------------------------------------------------------------------------------
def to_storage(arr, dtype):
    """NumPy array in the package's storage dtype (bfloat16 as uint16 bits, round to nearest even)."""
    a = np.ascontiguousarray(arr)
    if dtype == "bfloat16":
        u = a.astype(np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return a.astype(np.dtype(dtype), copy=False)


def from_storage(raw, dtype, shape):
    if dtype == "bfloat16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(raw, np.dtype(dtype)).reshape(shape)


# ---- compile ----------------------------------------------------------------------------------
def compile(graph: Graph, out_dir, arch="sm_90", dtype="float32", with_updates=False, params=None):
    """Write a CUDA package for a float Kiln graph to ``out_dir``; returns ``out_dir``.
    ``dtype`` is the storage dtype of float32 values (float16/bfloat16 accumulate in float32)."""
    import tvm
    if dtype not in DTYPES:
        raise KilnError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    graph.validate()
    user_inputs = list(graph.inputs)
    graph, masks = tvm_te.externalize_dropout(graph)
    tvm_te.check_lowerable(graph, f"cuda ({arch})")
    t0 = time.time()
    target = gpu_target(arch)
    mod = fuse(graph, dtype, target, with_updates)
    values, steps, outs = extract_steps(mod, graph, dtype, with_updates)
    tir_mod = tvm.IRModule({gv: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)})
    info, source = lower_steps(tir_mod, target)

    # lifetimes: inputs from step -1, outputs to the end, temps within their step
    n = len(steps)
    first, last = {}, {}
    for v, d in values.items():
        if d["kind"] == "input":
            first[v], last[v] = -1, -1
    for k, st in enumerate(steps):
        for i, a in enumerate(st["args"]):
            if i >= st["n_in"]:
                first.setdefault(a, k)
            last[a] = max(last.get(a, k), k)
    for o in outs:
        last[o] = n
    launches, buffers = [], []
    for v, d in values.items():
        if d["kind"] != "weight":
            buffers.append((v, _nbytes(d["shape"], d["dtype"]), first.get(v, 0), last.get(v, first.get(v, 0))))
    for k, st in enumerate(steps):
        _, temps, _ = info[st["func"]]
        for tname, (shape, dt) in temps.items():
            name = f"{st['func']}@{k}:{tname}"
            values[name] = {"shape": shape, "dtype": dt, "kind": "temp"}
            buffers.append((name, _nbytes(shape, dt), k, k))
    offsets, arena = plan_arena(buffers)
    check_plan(buffers, offsets)

    # weights blob
    tensors = dict(graph.tensors())
    if params:
        tensors.update(params)
    blob, woff = bytearray(), {}
    for v, d in values.items():
        if d["kind"] == "weight":
            raw = to_storage(np.asarray(tensors[v]), d["dtype"]).tobytes()
            woff[v] = len(blob)
            blob += raw + b"\0" * (_align(len(raw)) - len(raw))

    def loc(v):
        d = values[v]
        if d["kind"] == "weight":
            return {"value": v, "space": "weights", "offset": woff[v], "bytes": _nbytes(d["shape"], d["dtype"])}
        return {"value": v, "space": "arena", "offset": offsets[v], "bytes": _nbytes(d["shape"], d["dtype"])}

    plan_steps = []
    for k, st in enumerate(steps):
        ls, temps, rule = info[st["func"]]
        step_launches = []
        for L in ls:
            args = []
            for a in L["args"]:
                if a[0] == "param":
                    args.append(loc(st["args"][a[1]]))
                elif a[0] == "temp":
                    args.append(loc(f"{st['func']}@{k}:{a[1]}"))
                else:
                    args.append({"scalar": a[1], "dtype": a[2]})
            step_launches.append({"kernel": L["kernel"], "grid": L["grid"], "block": L["block"],
                                  "shared_bytes": L["shared_bytes"], "args": args})
            launches.append(step_launches[-1])
        plan_steps.append({"step": k, "func": st["func"], "schedule": rule, "args": [loc(a) for a in st["args"]],
                           "n_inputs": st["n_in"], "launches": step_launches})

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "kernels.cu"), "w") as f:
        f.write(f"// Kiln CUDA package for graph {graph.name!r}: {len(launches)} launches, arch {arch}, {dtype}\n")
        f.write(source)
    with open(os.path.join(out_dir, "weights.bin"), "wb") as f:
        f.write(bytes(blob))
    with open(os.path.join(out_dir, "plan.txt"), "w") as f:
        f.write(draw_plan(buffers, offsets, arena) + "\n")
    with open(os.path.join(out_dir, "groups.json"), "w") as f:
        f.write(tvm.ir.save_json(tir_mod))
    n_out = len(graph.outputs)
    manifest = {
        "format": FORMAT, "target": "cuda", "arch": arch, "dtype": dtype, "graph": graph.name,
        "signature": tvm_te.graph_signature(graph, dtype, extra={"target": "cuda", "arch": arch}),
        "tvm": tvm.__version__, "sources": ["kernels.cu"], "arena_bytes": arena, "alignment": ALIGN,
        "weights_file": "weights.bin", "weights_bytes": len(blob),
        "user_inputs": user_inputs, "dropout_masks": masks,
        "inputs": [{"name": i, **values[i], "offset": offsets[i], "bytes": _nbytes(values[i]["shape"], values[i]["dtype"])}
                   for i in graph.inputs],
        "outputs": [{"name": go, **loc(o), "shape": values[o]["shape"], "dtype": values[o]["dtype"]}
                    for go, o in zip(graph.outputs, outs[:n_out])],
        "updates": [{"buffer": b, **loc(o), "shape": values[o]["shape"], "dtype": values[o]["dtype"]}
                    for b, o in zip(graph.updates, outs[n_out:])] if with_updates else [],
        "weights": [{"name": v, "shape": d["shape"], "dtype": d["dtype"], "offset": woff[v],
                     "bytes": _nbytes(d["shape"], d["dtype"])} for v, d in values.items() if d["kind"] == "weight"],
        "buffers": [{"name": b, "bytes": s, "first": f, "last": l, "offset": offsets[b], "kind": values[b]["kind"]}
                    for b, s, f, l in buffers],
        "kernels": sorted({L["kernel"] for L in launches}),
        "steps": plan_steps,
        "launches": len(launches),
        "build_seconds": round(time.time() - t0, 2),
    }
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return out_dir


def compile_train_step(step_graph: Graph, out_dir, arch="sm_90", dtype="float32"):
    """Package for a training-step graph (autodiff.grad output: forward + loss + backward); the
    buffer updates of train-mode BatchNorm, when the graph has them, become extra outputs listed
    under ``updates`` in the manifest. The optimiser update runs on the host (or as a second graph)."""
    if "grad" not in step_graph.meta:
        raise KilnError(f"graph {step_graph.name!r} is not a gradient graph (make it with kiln.grad)")
    return compile(step_graph, out_dir, arch=arch, dtype=dtype, with_updates=bool(step_graph.updates))


# ---- package checks and the CPU plan interpreter ----------------------------------------------
def load_manifest(pkg):
    path = os.path.join(pkg, "manifest.json")
    if not os.path.exists(path):
        raise KilnError(f"{pkg}: no manifest.json (not a Kiln CUDA package)")
    with open(path) as f:
        m = json.load(f)
    if m.get("target") != "cuda" or m.get("format") != FORMAT:
        raise KilnError(f"{path}: target {m.get('target')!r} format {m.get('format')!r}, expected cuda format {FORMAT}")
    return m


def check_package(pkg):
    """Consistency of a package: every argument inside the arena or the weights blob, no two
    buffers alive at once overlapping, every launched kernel defined in the sources, launch
    dimensions within CUDA limits. Returns the manifest."""
    m = load_manifest(pkg)
    src = "".join(open(os.path.join(pkg, s)).read() for s in m["sources"])
    wbytes = os.path.getsize(os.path.join(pkg, m["weights_file"]))
    if wbytes != m["weights_bytes"]:
        raise KilnError(f"{pkg}: weights.bin has {wbytes} bytes, manifest says {m['weights_bytes']}")
    limit = {"arena": m["arena_bytes"], "weights": m["weights_bytes"]}
    for st in m["steps"]:
        for L in st["launches"]:
            where = f"step {st['step']} ({st['func']}) kernel {L['kernel']}"
            if f"void __launch_bounds__" not in src or f" {L['kernel']}(" not in src:
                raise KilnError(f"{where}: not defined in {m['sources']}")
            if any(b > 1024 for b in L["block"]) or int(np.prod(L["block"])) > 1024 or min(L["grid"] + L["block"]) < 1:
                raise KilnError(f"{where}: bad launch config grid {L['grid']} block {L['block']}")
            for a in L["args"]:
                if "space" in a and not (0 <= a["offset"] and a["offset"] + a["bytes"] <= limit[a["space"]]):
                    raise KilnError(f"{where}: argument {a['value']} [{a['offset']}, +{a['bytes']}) outside the "
                                    f"{a['space']} ({limit[a['space']]} bytes)")
                if "space" in a and a["offset"] % 16:
                    raise KilnError(f"{where}: argument {a['value']} offset {a['offset']} not 16-byte aligned")
    bufs = [(b["name"], b["bytes"], b["first"], b["last"]) for b in m["buffers"]]
    check_plan(bufs, {b["name"]: b["offset"] for b in m["buffers"]})
    for b in m["buffers"]:
        if b["offset"] + b["bytes"] > m["arena_bytes"]:
            raise KilnError(f"buffer {b['name']} ends past the arena")
    return m


def expand_inputs(m, inputs):
    """Package inputs (manifest order) from the user's inputs: adds the dropout masks, made on the
    host from the key inputs with the reference's generator."""
    users = m.get("user_inputs") or [i["name"] for i in m["inputs"]]
    if len(inputs) != len(users):
        raise KilnError(f"package takes {len(users)} inputs {users}, got {len(inputs)}")
    env = dict(zip(users, inputs))
    if m.get("dropout_masks"):
        env.update(tvm_te.mask_values(m["dropout_masks"], env))
    return [env[i["name"]] for i in m["inputs"]]


def _aligned_bytes(n, align=ALIGN):
    raw = np.empty(n + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + n]


def interpret_plan(pkg, inputs, params=None, poison=True):
    """Run a CUDA package's plan on the CPU: each step's (unscheduled) PrimFunc is built for LLVM
    and called on NumPy views of a single arena and of the weights blob at the manifest offsets,
    in plan order. The arena starts filled with NaN bytes (``poison``) so a step that reads a
    buffer nobody wrote, or one clobbered by a wrongly shared slot, shows up as NaN. Returns the
    outputs as float32/NumPy arrays."""
    import tvm
    m = load_manifest(pkg)
    with open(os.path.join(pkg, "groups.json")) as f:
        tir_mod = tvm.ir.load_json(f.read())
    funcs = {}
    for gv, fn in tir_mod.functions.items():
        funcs[gv.name_hint] = tvm.tirx.build(fn.with_attr("global_symbol", gv.name_hint), target="llvm")
    arena = _aligned_bytes(m["arena_bytes"])
    arena[:] = 0xFF if poison else 0
    weights = _aligned_bytes(m["weights_bytes"])
    weights[:] = np.fromfile(os.path.join(pkg, m["weights_file"]), np.uint8)
    if params:
        for w in m["weights"]:
            if w["name"] in params:
                raw = to_storage(np.asarray(params[w["name"]]), w["dtype"]).view(np.uint8).ravel()
                weights[w["offset"]:w["offset"] + w["bytes"]] = raw
    for spec, x in zip(m["inputs"], expand_inputs(m, inputs)):
        raw = to_storage(np.asarray(x, np.float32 if spec["dtype"] in DTYPES else spec["dtype"]).reshape(spec["shape"]),
                         spec["dtype"]).view(np.uint8).ravel()
        arena[spec["offset"]:spec["offset"] + spec["bytes"]] = raw
    space = {"arena": arena, "weights": weights}

    def view(a, shape, dtype):
        raw = space[a["space"]][a["offset"]:a["offset"] + a["bytes"]]
        np_dt = np.uint16 if dtype == "bfloat16" else np.dtype(dtype)
        return raw.view(np_dt).reshape(shape)
    for st in m["steps"]:
        args = []
        fn = tir_mod[st["func"]]
        for a, p in zip(st["args"], fn.params):
            b = p.ty if hasattr(p, "ty") else None
            shape = [int(s) for s in b.shape] if b is not None and hasattr(b, "shape") else None
            dtype = str(b.dtype) if b is not None and hasattr(b, "dtype") else "float32"
            args.append(tvm.runtime.from_dlpack(view(a, shape, dtype)) if dtype != "bfloat16" else
                        tvm.runtime.tensor(view(a, shape, dtype)))
        funcs[st["func"]](*args)
    outs = []
    for o in m["outputs"]:
        raw = space[o["space"]][o["offset"]:o["offset"] + o["bytes"]].tobytes()
        outs.append(np.array(from_storage(raw, o["dtype"], o["shape"]), dtype=np.float32 if o["dtype"] in DTYPES else None))
    return outs
