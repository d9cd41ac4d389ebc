"""CUDA package emitter: Kiln float graphs -> `.cu` + launch plan + arena plan + weights blob.

The package runs without TVM (backends/cuda_runner.py: CuPy/NVRTC); backends/cuda_plan.py reads,
checks and interprets it on the CPU. ``compile`` runs ``PIPELINE``, one named pass each on one
typed state (:class:`CudaState`); every pass only needs what the ones before produced:

  relax         one ``emit_te`` per node with the TE rules (float32, or float16/bfloat16 storage
                with float32 accumulation, each value's storage dtype from
                ``tvm_te.precision_plan``), then Relax AnnotateTIROpPattern + FuseOps + FuseTIR:
                element-wise epilogues (bias, activation, BN arithmetic, gradient masks) fuse into
                their producers
  steps         walk Relax ``main``: each ``call_tir`` is one step with its argument values
  lower         DLight per PrimFunc (Matmul, GEMV, Reduction, GeneralReduction, Fallback, first
                rule that schedules *and* lowers wins; convolutions go to Fallback), then the
                s_tir lowering passes up to SplitHostDevice (no packed API): the host side of each
                step is a list of ``call_ffi_kernel`` launches whose arguments are the step's
                buffers or step-local global temporaries, with grid/block extents
  plan          lifetimes (planner.lifetimes) of graph inputs, activations, outputs and step
                temporaries -> a static arena plan (planner.plan, the C backend's planner)
  weights       parameters and constants that are not folded go to one blob
  launch_plan   every launch's arguments as arena / weights locations
  emit          kernels.cu (device code from the same lowered IR), manifest.json (launch plan:
                kernel, grid, block, dynamic shared memory, each argument as arena/weights offset),
                weights.bin, plan.txt (the arena drawn), groups.json (unscheduled TIR of each step,
                for the CPU plan interpreter), scheduled.json (the scheduled TIR, for cuda-sim)
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np
import tvm_ffi
from tvm import ir, s_tir, tirx

from kiln.frontend.errors import KilnError
from kiln.frontend.graph import Graph
from kiln.frontend.loader import semantics_of
from kiln.frontend.types import TensorType

from . import cuda_int8, nvrtc, planner, tvm_te
from .cuda_plan import (  # noqa: F401
    ALIGN,
    DTYPES,
    TOLERANCE,
    check_package,
    check_plan,
    expand_inputs,
    from_storage,
    interpret_plan,
    load_manifest,
    to_storage,
)
from .manifest import CUDA_FORMAT, ArenaBuffer, Arg, Launch, Manifest, Step, Tensor, save_manifest

FORMAT = CUDA_FORMAT
RULES = ("Matmul", "GEMV", "Reduction", "GeneralReduction", "Fallback")


# per-block limits of sm_80 and sm_90 without opt-in attributes (the runner sets none): DLight
# sizes its tiles from them and every scheduled kernel is checked against them
GPU_LIMITS = {"max_shared_memory_per_block": 48 * 1024, "max_threads_per_block": 1024,
              "max_num_threads": 1024, "thread_warp_size": 32, "registers_per_block": 65536}


def gpu_target(arch="sm_90"):
    import tvm
    return tvm.target.Target({"kind": "cuda", "arch": arch, **GPU_LIMITS}, host="llvm")


def _nbytes(shape, dtype):
    return int(np.prod(shape, dtype=np.int64)) * TensorType((), dtype).itemsize


def _align(n, a=ALIGN):
    return (n + a - 1) // a * a


# ---- fuse + steps -----------------------------------------------------------------------------
def fuse(graph: Graph, dtype="float32", target=None, with_updates=False, plan=None):
    """Relax module after FuseTIR (PrimFuncs unscheduled); ``plan``: tvm_te.precision_plan."""
    return fuse_module(tvm_te.to_relax(graph, dtype=dtype, with_updates=with_updates, plan=plan), target)


def fuse_module(mod, target=None):
    """A Relax module through LegalizeOps, FuseOps and FuseTIR (PrimFuncs unscheduled)."""
    import tvm
    from tvm import relax
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


def extract_steps(mod, graph: Graph, dtype="float32", with_updates=False, params=None, plan=None):
    """Steps of Relax ``main`` as data: values {name: {shape, dtype, kind}} and steps
    [{func, args: [value names, inputs then outputs]}], plus the output value names. ``params``
    {name: (shape, dtype)} in ``main``'s parameter order replaces the graph's runtime arguments
    (the int8 path, whose rules add constants); ``plan`` (tvm_te.precision_plan) their storage
    dtypes, default every float32 value in ``dtype``."""
    from tvm import relax
    main = mod["main"]
    if params is None:
        plan = plan or tvm_te.precision_plan(graph, dtype)
        params = {n: (list(graph.types[n].shape), plan.storage[n]) for n in tvm_te.runtime_args(graph)}
    values, steps, var_name = {}, [], {}
    for p, (n, (shape, dt)) in zip(main.params, params.items()):
        kind = "input" if n in graph.inputs else "weight"
        values[n] = {"shape": list(shape), "dtype": dt, "kind": kind}
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
        s_tir.transform.ManifestSharedMemoryLocalStage(), _compact_buffer_allocation(),
        s_tir.transform.LowerAutoCopy(), s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(), s_tir.transform.StmtSimplify(),
        s_tir.transform.InjectPermutedLayout(), s_tir.transform.AnnotateIrregularLoop(),
        s_tir.transform.InjectSoftwarePipeline(), s_tir.transform.TransformMmaBufferLayout(),
        s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
        tirx.transform.BF16ComputeLegalize(), _narrow_data_type(),
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


def _narrow_data_type():
    """NarrowDataType(32), except on step functions marked ``cuda_int8.NO_NARROW`` (int8 steps:
    the pass's bound analysis fails on the Let-bound fixed-point temporaries of the
    requantisation, 'Detected bound for mq conflicts with memorization'; their indices stay as
    Relax typed them)."""
    import tvm
    return _unless_marked(tvm.tirx.transform.NarrowDataType(32), cuda_int8.NO_NARROW,
                          "kiln.NarrowDataTypeUnlessMarked")


def _compact_buffer_allocation():
    """CompactBufferAllocation, except on step functions scheduled ``Blockwise`` (an LSTM's chain
    of blocks: the pass ran over 5 minutes on micro_speech_lstm's 198 blocks, where every other
    lowering pass together takes 26 s). It only shrinks allocations to the region a block
    touches; without it a step-local temporary keeps the shape its TE compute gave it."""
    import tvm
    return _unless_marked(tvm.s_tir.transform.CompactBufferAllocation(), cuda_int8.NO_COMPACT,
                          "kiln.CompactBufferAllocationUnlessMarked")


def _unless_marked(inner, attr, name):
    """A module pass running ``inner`` on every function without the attribute ``attr``."""
    import tvm

    @tvm.ir.transform.module_pass(opt_level=0, name=name)
    def run(mod, _ctx):
        keep = {gv: f for gv, f in mod.functions.items() if f.attrs is not None and attr in f.attrs}
        if not keep:
            return inner(mod)
        rest = {gv: f for gv, f in mod.functions.items() if gv not in keep}
        out = inner(tvm.IRModule(rest, attrs=mod.attrs)) if rest else mod
        for gv, f in keep.items():
            out[gv] = f
        return out
    return run


def _lower(mod, target):
    import tvm
    mod = tvm.tirx.transform.BindTarget(target)(mod)
    return tvm.transform.Sequential(_lower_passes())(mod)


def check_lowered(name, low):
    """Raise unless a lowered step is launchable: its host side a flat list of launches whose
    arguments are buffers or constants, every kernel within ``GPU_LIMITS`` (shared memory,
    threads per block)."""
    from tvm import s_tir
    limits = {"max_shared_memory_per_block": GPU_LIMITS["max_shared_memory_per_block"],
              "max_threads_per_block": GPU_LIMITS["max_threads_per_block"]}
    for gv, f in low.functions.items():
        if gv.name_hint == name:
            loops = []
            _walk(f.body, lambda s: loops.append(s) if type(s).__name__ == "For" else None)
            if loops:
                raise KilnError(f"step {name!r}: loops left on the host ({loops[0].loop_var} ...)")
            launches_of(f, name)
        elif not s_tir.analysis.verify_gpu_code(f, limits):
            raise KilnError(f"kernel {gv.name_hint}: over the GPU limits {limits} (shared memory or threads)")


def schedule_gpu(name, func, target):
    """(scheduled PrimFunc, rule name): the first DLight rule that schedules the function and
    whose result lowers to a launchable step (``check_lowered``: kernels within the target's
    shared-memory and thread limits, no loops left on the host); otherwise the next rule. Raises
    naming the function and what each rule did when none does."""
    import tvm
    from tvm.s_tir import dlight as dl
    func = unit_reductions_to_spatial(func)
    own = func.attrs.get(cuda_int8.SCHEDULE) if func.attrs is not None else None
    if own in ("Serial", "Blockwise"):
        sched = cuda_int8.serial_schedule if own == "Serial" else cuda_int8.blockwise_schedule
        f = sched(func).with_attr("tirx.is_scheduled", True).with_attr("global_symbol", name) \
            .with_attr(cuda_int8.NO_NARROW, True)
        if own == "Blockwise":
            f = f.with_attr(cuda_int8.NO_COMPACT, True)
        check_lowered(name, _lower(tvm.IRModule({name: f}), target))
        return f, own
    errors = []
    for rule in RULES:
        try:
            with target:
                sch = getattr(dl.gpu, rule)().apply(func, target, False)
            if sch is None:
                continue
            sch = sch[0] if isinstance(sch, (list, tuple)) else sch
            f = sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("global_symbol", name)
            if func.attrs is not None and cuda_int8.NO_NARROW in func.attrs:
                f = f.with_attr(cuda_int8.NO_NARROW, True)
            check_lowered(name, _lower(tvm.IRModule({name: f}), target))   # must lower and launch
            return f, rule
        except Exception as e:   # noqa: BLE001 - try the next rule, report all at the end
            errors.append(f"{rule}: {str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__}")
    raise KilnError(f"no GPU schedule for step {name!r}: " + "; ".join(errors))


# ---- reductions of one element --------------------------------------------------------------
def unit_reductions_to_spatial(func):
    """``func`` with every reduction block whose reduction runs over one element (each reduction
    iterator of extent 1: a dp4a reduction of a single 4-byte word, a 1x1 convolution over one
    channel, a sum over an axis of length 1) written as the spatial block it is, ``acc = init
    (+) term``, with the unit loops that only fed it dropped. DLight's rules see such a block
    as spatial but keep its init: Fallback then inlined the epilogue into both the init and the
    update (reading the requantised value back as the accumulator, and binding the
    requantisation's Let variables twice, which TVM's bound analysis rejects). Functions
    without such a block are returned unchanged."""
    f = tvm_ffi.structural_map(func, [(s_tir.SBlockRealize, _unit_reduction_as_spatial)])
    return f if f.same_as(func) else tvm_ffi.structural_map(f, [(tirx.For, _drop_unit_loop)])


def _same_indices(a, b):
    return len(a) == len(b) and all(tvm_ffi.structural_equal(x, y) for x, y in zip(a, b))


def _substitute(node, vmap):
    return tvm_ffi.structural_map(node, [(tirx.Var, lambda v: vmap.get(v, v))])


def _unit_reduction_as_spatial(realize):
    blk = realize.block
    init, body = blk.init, blk.body
    red = {k: iv for k, iv in enumerate(blk.iter_vars) if iv.iter_type == tirx.IterVar.CommReduce}
    if init is None or not red or any(not isinstance(iv.dom.extent, tirx.IntImm) or int(iv.dom.extent) != 1
                                      for iv in red.values()):
        return realize
    if not (isinstance(init, tirx.BufferStore) and isinstance(body, tirx.BufferStore)
            and init.buffer.same_as(body.buffer) and _same_indices(init.indices, body.indices)):
        return realize
    acc = body.buffer

    def initial(load):      # the accumulator, read by the update: its initial value
        return init.value if load.source.same_as(acc) and _same_indices(load.indices, body.indices) else load
    vmap = {iv.var: iv.dom.min for iv in red.values()}
    value = _substitute(tvm_ffi.structural_map(body.value, [(ir.TensorLoad, initial)]), vmap)
    keep = [k for k in range(len(blk.iter_vars)) if k not in red]
    reads = [_substitute(r, vmap) for r in blk.reads if not r.source.same_as(acc)]
    nb = s_tir.SBlock([blk.iter_vars[k] for k in keep], reads, blk.writes, blk.name_hint,
                      tirx.BufferStore(acc, value, body.indices), None, blk.alloc_buffers, blk.match_buffers,
                      blk.annotations)
    return s_tir.SBlockRealize([realize.iter_values[k] for k in keep], realize.predicate, nb)


def _drop_unit_loop(loop):
    if isinstance(loop.extent, tirx.IntImm) and int(loop.extent) == 1:
        used = []
        tvm_ffi.structural_walk(loop.body, [(tirx.Var, lambda v: used.append(1) if v.same_as(loop.loop_var) else None)])
        if not used:
            return loop.body
    return loop


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
    source, the scheduled module)."""
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
    return info, src, tvm.IRModule(sched)


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
    p = _plan([planner.Buffer(n, s, f, l, align) for n, s, f, l in buffers], align)
    return dict(p.offsets), p.arena_bytes


def _plan(buffers, align=ALIGN):
    return planner.plan(buffers, random_orders=0, arena_align=align)


# ---- the pipeline -----------------------------------------------------------------------------
@dataclasses.dataclass
class CudaState:
    """What the passes read and write: the input block, then each pass's results."""
    graph: Graph                         # float graph, dropout externalised (masks: host inputs)
    out_dir: str
    arch: str = "sm_90"
    dtype: str = "float32"               # the half dtype of the package (float32: none)
    with_updates: bool = False           # buffer updates of a train-mode graph become outputs
    params: dict | None = None           # parameter values replacing the graph's in the blob
    user_inputs: list = dataclasses.field(default_factory=list)   # the graph's inputs before the masks
    masks: list = dataclasses.field(default_factory=list)         # tvm_te.externalize_dropout's masks
    precision: str = "uniform"           # storage policy (tvm_te.PRECISIONS)
    loss_scale: float = 1.0              # applied to the graph before the pipeline (tvm_te.apply_loss_scale)
    storage: tvm_te.PrecisionPlan | None = None   # relax: each value's storage and compute dtype
    target: object = None                # relax: the TVM target
    mod: object = None                   # relax: the fused Relax module
    values: dict = dataclasses.field(default_factory=dict)   # steps: {name: {shape, dtype, kind}}
    steps: list = dataclasses.field(default_factory=list)    # steps: [{func, args, n_in}]
    outs: list = dataclasses.field(default_factory=list)     # steps: output values (then updates)
    tir_mod: object = None               # steps: the steps' PrimFuncs
    info: dict = dataclasses.field(default_factory=dict)     # lower: {func: (launches, temps, rule)}
    source: str = ""                     # lower: CUDA C of every kernel
    scheduled: object = None             # lower: the DLight-scheduled PrimFuncs (for cuda-sim)
    buffers: list = dataclasses.field(default_factory=list)  # plan: [planner.Buffer]
    plan: planner.MemoryPlan | None = None
    blob: bytearray = dataclasses.field(default_factory=bytearray)   # weights
    woff: dict = dataclasses.field(default_factory=dict)              # weights: {value: offset}
    plan_steps: list = dataclasses.field(default_factory=list)        # launch_plan: [manifest.Step]
    manifest: Manifest | None = None     # emit
    int8_params: dict | None = None      # relax_int8: {main's parameter: (shape, dtype)}
    nvrtc: bool | None = None            # compile the .cu with NVRTC + ptxas (None: when installed)
    resources: dict = dataclasses.field(default_factory=dict)   # nvrtc: {arch: {kernel: resources}}
    t0: float = dataclasses.field(default_factory=time.time)

    def nbytes(self, v):
        return _nbytes(self.values[v]["shape"], self.values[v]["dtype"])

    def loc(self, v) -> Arg:
        """Where value ``v`` lives: the weights blob or the arena."""
        if self.values[v]["kind"] == "weight":
            return Arg(value=v, space="weights", offset=self.woff[v], bytes=self.nbytes(v))
        return Arg(value=v, space="arena", offset=self.plan.offsets[v], bytes=self.nbytes(v))


def relax(st: CudaState):
    """Needs: the input. The graph as a fused Relax module for the GPU target."""
    st.target = gpu_target(st.arch)
    st.storage = tvm_te.precision_plan(st.graph, st.dtype, st.precision, st.loss_scale)
    st.mod = fuse(st.graph, st.dtype, st.target, st.with_updates, st.storage)


def steps(st: CudaState):
    """Needs: relax. The steps of Relax ``main`` and their PrimFuncs."""
    import tvm
    st.values, st.steps, st.outs = extract_steps(st.mod, st.graph, st.dtype, st.with_updates, plan=st.storage)
    st.tir_mod = tvm.IRModule({gv: f for gv, f in st.mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)})


def lower(st: CudaState):
    """Needs: steps. Every PrimFunc scheduled and lowered: launches per step and the CUDA source."""
    st.info, st.source, st.scheduled = lower_steps(st.tir_mod, st.target)


def plan(st: CudaState):
    """Needs: lower. Inputs live from step -1, outputs to the end, temporaries within their step;
    weights are not in the arena."""
    inputs = [v for v, d in st.values.items() if d["kind"] == "input"]
    first, last = planner.lifetimes(inputs, [(s["args"][:s["n_in"]], s["args"][s["n_in"]:]) for s in st.steps],
                                    st.outs, born=-1, end=len(st.steps))
    bufs = []
    for v, d in st.values.items():
        if d["kind"] != "weight":
            f = first.get(v, 0)
            bufs.append(planner.Buffer(v, st.nbytes(v), f, last.get(v, f), ALIGN))
    for k, s in enumerate(st.steps):
        for tname, (shape, dt) in st.info[s["func"]][1].items():
            name = f"{s['func']}@{k}:{tname}"
            st.values[name] = {"shape": shape, "dtype": dt, "kind": "temp"}
            bufs.append(planner.Buffer(name, _nbytes(shape, dt), k, k, ALIGN))
    st.buffers, st.plan = bufs, _plan(bufs)
    check_plan([(b.name, b.size, b.first, b.last) for b in bufs], st.plan.offsets)


def weights(st: CudaState):
    """Needs: steps. Parameters and unfolded constants (``params`` first) in one blob, each at a
    256-byte aligned offset."""
    tensors = dict(st.graph.tensors())
    tensors.update(st.params or {})
    for v, d in st.values.items():
        if d["kind"] == "weight":
            raw = to_storage(np.asarray(tensors[v]), d["dtype"]).tobytes()
            st.woff[v] = len(st.blob)
            st.blob += raw + b"\0" * (_align(len(raw)) - len(raw))


def launch_plan(st: CudaState):
    """Needs: plan, weights. Each step's arguments and launches with arena / weights locations."""
    for k, s in enumerate(st.steps):
        ls, _, rule = st.info[s["func"]]
        launches = []
        for L in ls:
            args = [st.loc(s["args"][a[1]]) if a[0] == "param" else
                    st.loc(f"{s['func']}@{k}:{a[1]}") if a[0] == "temp" else Arg(scalar=a[1], dtype=a[2])
                    for a in L["args"]]
            launches.append(Launch(L["kernel"], L["grid"], L["block"], L["shared_bytes"], args))
        st.plan_steps.append(Step(k, s["func"], rule, [st.loc(a) for a in s["args"]], s["n_in"], launches))


def emit(st: CudaState):
    """Needs: launch_plan. Writes kernels.cu, weights.bin, plan.txt, groups.json, manifest.json."""
    import tvm
    g, launches = st.graph, [L for s in st.plan_steps for L in s.launches]
    arena = st.plan.arena_bytes
    os.makedirs(st.out_dir, exist_ok=True)
    with open(os.path.join(st.out_dir, "kernels.cu"), "w") as f:
        f.write(f"// Kiln CUDA package for graph {g.name!r}: {len(launches)} launches, arch {st.arch}, {st.dtype}\n")
        f.write(st.source)
    with open(os.path.join(st.out_dir, "weights.bin"), "wb") as f:
        f.write(bytes(st.blob))
    with open(os.path.join(st.out_dir, "plan.txt"), "w") as f:
        f.write(f"arena: {arena} bytes ({len(st.buffers)} buffers, alignment {ALIGN})\n"
                f"{st.plan.table()}\n\n{st.plan.drawing()}\n")
    with open(os.path.join(st.out_dir, "groups.json"), "w") as f:
        f.write(tvm.ir.save_json(st.tir_mod))
    with open(os.path.join(st.out_dir, "scheduled.json"), "w") as f:
        f.write(tvm.ir.save_json(st.scheduled))
    st.manifest = _manifest(st, arena, launches, tvm.__version__)
    save_manifest(st.out_dir, st.manifest)


def _manifest(st: CudaState, arena, launches, tvm_version) -> Manifest:
    g, values, n_out = st.graph, st.values, len(st.graph.outputs)

    def placed(name, v, kind=None):
        a = st.loc(v)
        return Tensor(name, values[v]["shape"], values[v]["dtype"], a.bytes, a.offset, space=a.space, value=v) \
            if kind is None else Tensor(name, values[v]["shape"], values[v]["dtype"], a.bytes, a.offset, kind=kind)
    return Manifest(
        format=FORMAT, target="cuda", arch=st.arch, dtype=st.dtype, model=g.name,
        signature=tvm_te.graph_signature(g, st.dtype, extra={"target": "cuda", "arch": st.arch, **(
            {"precision": st.precision} if st.dtype != "float32" else {})}),
        tvm=tvm_version, sources=["kernels.cu"], arena_bytes=arena, alignment=ALIGN, weights_file="weights.bin",
        weights_bytes=len(st.blob), user_inputs=st.user_inputs, dropout_masks=st.masks,
        inputs=[placed(i, i, kind=values[i]["kind"]) for i in g.inputs],
        outputs=[placed(go, o) for go, o in zip(g.outputs, st.outs[:n_out])],
        updates=[placed(b, o) for b, o in zip(g.updates, st.outs[n_out:])] if st.with_updates else [],
        weights=[Tensor(v, d["shape"], d["dtype"], st.nbytes(v), st.woff[v]) for v, d in values.items()
                 if d["kind"] == "weight"],
        buffers=[ArenaBuffer(b.name, b.size, b.first, b.last, st.plan.offsets[b.name], values[b.name]["kind"])
                 for b in st.buffers],
        kernels=sorted({L.kernel for L in launches}), steps=st.plan_steps, launches=len(launches),
        build_seconds=round(time.time() - st.t0, 2), extra=_precision_entry(st),
        semantics=semantics_of(g) if any(t.quant is not None for t in g.types.values()) else None)


def _precision_entry(st: CudaState):
    """The manifest's ``precision`` (float packages): the storage policy, its loss scale, each
    graph value's storage dtype, and the arena bytes by dtype."""
    if st.storage is None or st.dtype == "float32":
        return {}
    d = st.storage.summary()
    by = {}
    for b in st.buffers:
        dt = st.values[b.name]["dtype"]
        by[dt] = by.get(dt, 0) + b.size
    d["buffer_bytes_by_dtype"] = dict(sorted(by.items()))
    return {"precision": d}


def compile_check(st: CudaState):
    """Needs: emit. kernels.cu compiled as the runner compiles it (NVRTC, then ptxas for the
    package's arch): fails naming the kernel and the limit it exceeds; writes resources.json
    (registers, shared memory, stack, spills per kernel). Skipped when ``nvrtc`` is False, or
    None and NVRTC is not installed."""
    if st.nvrtc is False:
        return
    try:
        nvrtc.toolkit()
    except nvrtc.NvrtcUnavailable:
        if st.nvrtc:
            raise
        return
    st.resources = nvrtc.check_package(st.out_dir, st.manifest, archs=(st.arch,))
    with open(os.path.join(st.out_dir, "resources.json"), "w") as f:
        json.dump(st.resources, f, indent=1, sort_keys=True)


PIPELINE = [relax, steps, lower, plan, weights, launch_plan, emit, compile_check]


def relax_int8(st: CudaState):
    """Needs: the input (a quantised graph). The graph as a fused Relax module built from the
    int8 lowering rules (backends/cuda_int8.py); the rules' constants go to ``params``."""
    st.target = gpu_target(st.arch)
    mod, names, types, made = cuda_int8.to_relax(st.graph)
    st.params, st.int8_params = made, {n: types[n] for n in names}
    st.mod = fuse_module(mod, st.target)


def steps_int8(st: CudaState):
    """Needs: relax_int8. ``steps`` with the int8 module's parameters."""
    import tvm
    st.values, st.steps, st.outs = extract_steps(st.mod, st.graph, params=st.int8_params)
    st.tir_mod = tvm.IRModule({gv: f.with_attr(cuda_int8.NO_NARROW, True) for gv, f in st.mod.functions.items()
                               if isinstance(f, tvm.tirx.PrimFunc)})


# int8 graphs: their own first two passes, then the float path's
PIPELINE_INT8 = [relax_int8, steps_int8] + PIPELINE[2:]


def compile(graph: Graph, out_dir, arch="sm_90", dtype="float32", with_updates=False, params=None, check=None,
            precision=None, loss_scale=None):
    """Write a CUDA package for a float Kiln graph to ``out_dir``; returns ``out_dir``.
    ``dtype`` is the package's half-precision dtype (float16/bfloat16 accumulate in float32) or
    float32. ``precision`` (tvm_te.PRECISIONS) is the storage policy of a half package: "uniform"
    stores every float value in ``dtype`` (default for inference graphs), "mixed" is automatic
    mixed precision (default for training steps, kiln.grad graphs). ``loss_scale``: the backward's
    scale under "mixed" (default tvm_te.LOSS_SCALE: 4096 for float16, none for bfloat16).
    ``check``: compile the package with NVRTC and ptxas for ``arch`` (backends/nvrtc.py) and fail
    on a kernel over a GPU limit; None checks when NVRTC is installed."""
    if cuda_int8.is_quantised(graph):
        if precision is not None or loss_scale is not None:
            raise KilnError(f"graph {graph.name!r} is quantised: its package stores int8/int16 values; precision "
                            f"and loss_scale apply to float16/bfloat16 packages of float graphs")
        return _compile_int8(graph, out_dir, arch, dtype, with_updates, params, check)
    if dtype not in DTYPES:
        raise KilnError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    graph.validate()
    precision = precision or ("mixed" if "grad" in graph.meta else "uniform")
    if precision not in tvm_te.PRECISIONS:
        raise KilnError(f"precision must be one of {tvm_te.PRECISIONS}, got {precision!r}")
    if loss_scale is None:
        loss_scale = tvm_te.LOSS_SCALE[dtype] if precision == "mixed" else 1.0
    if dtype == "float32":      # nothing to choose: every value is float32
        precision, loss_scale = "uniform", 1.0
    user_inputs = list(graph.inputs)
    graph, masks = tvm_te.externalize_dropout(graph)
    graph = tvm_te.apply_loss_scale(graph, loss_scale)
    tvm_te.check_lowerable(graph, f"cuda ({arch})")
    st = CudaState(graph, out_dir, arch, dtype, with_updates, params, user_inputs, masks, nvrtc=check,
                   precision=precision, loss_scale=float(graph.meta.get("loss_scale", 1.0)))
    for p in PIPELINE:
        p(st)
    return out_dir


def _compile_int8(graph: Graph, out_dir, arch, dtype, with_updates, params, check):
    """A quantised graph: PIPELINE_INT8, storage dtype ``cuda_int8.STORAGE``."""
    if dtype not in ("float32", cuda_int8.STORAGE):
        raise KilnError(f"graph {graph.name!r} is quantised: its package stores int8 values; --dtype {dtype} "
                        f"applies to float graphs only")
    if with_updates or params:
        raise KilnError(f"graph {graph.name!r} is quantised: buffer updates and replaced parameters are for "
                        f"float graphs")
    graph.validate()
    if graph.states:
        raise KilnError(f"graph {graph.name!r} is stateful (states {', '.join(graph.states)}); cuda cannot keep "
                        f"state between runs: use the reference or the C backend")
    st = CudaState(graph, out_dir, arch, cuda_int8.STORAGE, user_inputs=list(graph.inputs), nvrtc=check)
    for p in PIPELINE_INT8:
        p(st)
    return out_dir


def compile_train_step(step_graph: Graph, out_dir, arch="sm_90", dtype="float32", check=None,
                       precision="mixed", loss_scale=None):
    """Package for a training-step graph (autodiff.grad output: forward + loss + backward); the
    buffer updates of train-mode BatchNorm, when the graph has them, become extra outputs listed
    under ``updates`` in the manifest. The optimiser update runs on the host (or as a second graph).
    float16/bfloat16 steps use automatic mixed precision (``precision="mixed"``, see ``compile``);
    ``precision="uniform"`` stores every value in ``dtype``."""
    if "grad" not in step_graph.meta:
        raise KilnError(f"graph {step_graph.name!r} is not a gradient graph (make it with kiln.grad)")
    return compile(step_graph, out_dir, arch=arch, dtype=dtype, with_updates=bool(step_graph.updates), check=check,
                   precision=precision, loss_scale=loss_scale)
