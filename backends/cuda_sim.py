"""cuda-sim: a CUDA package's GPU schedules executed for real on the CPU, with OpenCL (pocl).

The package's DLight-scheduled TIR (``scheduled.json``) is lowered with the same passes as for
CUDA but for TVM's OpenCL target, so every kernel keeps its name, parameter order, tiling, thread
mapping and shared-memory staging. The package's own launch plan then runs on pocl's CPU device:
each launch with its grid and block (global size = grid x block, local size = block) and its
arguments at their arena and weights offsets. The arena is filled with 0xFF bytes (NaN in
float32/float16/bfloat16) and the arena and weights blob each sit between two guard zones
(cuda_plan.guard_bytes) that must stay untouched. What differs from the GPU: cross-thread
reductions use shared memory instead of warp shuffles (OpenCL has none), so warp shuffles are
not executed. float16 and bfloat16 kernels are legalised first (half_legalize): uint16 storage,
float32 arithmetic rounded to the half format after every half operation, so pocl needs no
cl_khr_fp16. Needs pyopencl and an OpenCL CPU driver (Debian: pocl-opencl-icd).
"""
from __future__ import annotations

import dataclasses
import os
import re

import numpy as np

from kiln.frontend import executor
from kiln.frontend.errors import KilnError

from .cuda_plan import (
    DTYPES,
    expand_inputs,
    from_storage,
    guard_bytes,
    load_manifest,
    storage_bytes,
    to_storage,
)
from .cuda_runner import scaled_errors


class SimUnavailable(KilnError):
    """No OpenCL CPU device (pocl) or no pyopencl."""


class GuardViolation(KilnError):
    """A kernel wrote outside the arena or into the weights."""


def opencl_target():
    import tvm
    return tvm.target.Target({"kind": "opencl", "max_shared_memory_per_block": 48 * 1024, "max_threads_per_block": 1024,
                              "max_num_threads": 1024, "thread_warp_size": 1}, host="llvm")


def opencl_source(pkg):
    """OpenCL C of the package's scheduled kernels (cached as kernels.cl in the package)."""
    import tvm
    path = os.path.join(pkg, "kernels.cl")
    if os.path.exists(path):
        with open(path) as f:
            return f.read()
    sched_file = os.path.join(pkg, "scheduled.json")
    if not os.path.exists(sched_file):
        raise KilnError(f"{pkg}: no scheduled.json (a package from an older Kiln: compile it again)")
    with open(sched_file) as f:
        src = opencl_kernels(tvm.ir.load_json(f.read()))
    with open(path, "w") as f:
        f.write(src)
    return src


def opencl_kernels(sched):
    """OpenCL C of the kernels of ``sched`` (an IRModule of GPU-scheduled PrimFuncs), lowered as
    cuda.compile lowers them, with float16/bfloat16 legalised (half_legalize)."""
    import tvm
    from tvm.tirx.compilation_pipeline import finalize_device_passes

    from . import half_legalize  # TVM
    names = {gv.name_hint for gv in sched.functions}
    low = tvm.transform.Sequential(_sim_passes())(tvm.tirx.transform.BindTarget(opencl_target())(sched))
    kernels = finalize_device_passes()(tvm.IRModule({gv: f for gv, f in low.functions.items()
                                                     if gv.name_hint not in names}))
    # half types last: the simplifier would substitute the conversions' let-bound values
    kernels = tvm.IRModule({gv: exact_float_constants(half_legalize.legalize(scalar_byte_gathers(f)))
                            for gv, f in kernels.functions.items()})
    d = dict(opencl_target().export())
    d.pop("host", None)
    src = tvm.get_global_func("target.build.opencl")(kernels, tvm.target.Target(d)).inspect_source()
    # INT32_MIN as TVM prints it is a long in OpenCL C (2147483648 does not fit an int), which
    # makes select(int, -2147483648, int) ambiguous (int8 fixed-point saturation): write it as an int
    src = re.sub(r"(?<![\w.])-2147483648(?![\w.])", "(-2147483647 - 1)", src)
    # TVM prints a Shuffle (scalar_byte_gathers' vectors) as C++'s char2(a, b): OpenCL C's vector
    # literal is (char2)(a, b); a type name is never called in OpenCL C, so every such call is one
    return re.sub(r"(?<![\w.])((?:u?char|u?short|u?int|u?long|float|double)(?:2|3|4|8|16))\(", r"(\1)(", src)


def _byte_lanes(ty):
    m = re.fullmatch(r"u?int8x(\d+)", str(ty))
    return int(m.group(1)) if m else 0


def scalar_byte_gathers(func):
    """``func`` with every vector load of int8/uint8 lanes that is not contiguous (a gather: a
    strided Ramp or a vector index, e.g. a 16x8 TRANSPOSE_CONV's weight pair in shared memory)
    written as its lanes' scalar loads put together (a Shuffle). TVM's OpenCL code generator
    prints such a gather as CUDA's packed form, the bytes or-ed into one int, and a cast of it as
    ``convert_int2(<int>)``, which pocl rejects as ambiguous (and which would not be the lanes'
    values). The CUDA source is not affected: this runs on cuda-sim's OpenCL lowering only."""
    import tvm_ffi
    from tvm import ir, tirx

    def scalar(load):
        n, idx = _byte_lanes(load.ty), load.indices[-1] if len(load.indices) else None
        if not n or len(load.indices) != 1 or not re.fullmatch(r"u?int\d+x\d+", str(idx.ty)) or (
                isinstance(idx, tirx.Ramp) and isinstance(idx.stride, tirx.IntImm) and int(idx.stride) == 1):
            return load         # a scalar index (a buffer of vectors) or a contiguous load: no gather
        if isinstance(idx, tirx.Ramp):
            at = [idx.base + idx.stride * k for k in range(n)]
        elif isinstance(idx, tirx.Broadcast):
            at = [idx.value] * n
        else:           # a vector expression: bound once, its lanes read as v.s0, v.s1, ...
            v = tirx.Var("gather_idx", idx.ty)
            at = [tirx.Shuffle([v], [tirx.const(k, "int32")]) for k in range(n)]
        vec = tirx.Shuffle([tirx.BufferLoad(load.source, [a]) for a in at], [tirx.const(k, "int32") for k in range(n)])
        return vec if isinstance(idx, (tirx.Ramp, tirx.Broadcast)) else tirx.Let(v, idx, vec)
    return tvm_ffi.structural_map(func, [(ir.TensorLoad, scalar)])


def exact_float_constants(func):
    """``func`` with each float32 constant that OpenCL C would not get back exactly (TVM's OpenCL
    code generator prints 7 significant digits; the CUDA source has exact hexadecimal literals)
    written as its bits, reinterpreted."""
    import tvm_ffi
    from tvm import tirx

    def exact(n):
        v = np.float32(n.value)
        if str(n.ty.dtype) != "float32" or not np.isfinite(v) or np.float32(f"{v:.6e}") == v:
            return n
        return tirx.reinterpret("float32", tirx.const(int(np.array(v).view(np.uint32)), "uint32"))
    return tvm_ffi.structural_map(func, [(tirx.FloatImm, exact)])


def _sim_passes():
    """cuda.compile's lowering passes (cuda._lower_passes) without BF16ComputeLegalize: bfloat16
    is legalised with float16 afterwards (half_legalize), rounding after every half operation."""
    from .cuda import _lower_passes
    return [p for p in _lower_passes() if p.info.name != "tirx.BF16ComputeLegalize"]


def _context():
    try:
        import pyopencl as cl
    except ImportError as e:
        raise SimUnavailable(f"cuda-sim needs pyopencl (pip install pyopencl) and pocl "
                             f"(apt install pocl-opencl-icd): {e}") from None
    try:
        devs = [d for p in cl.get_platforms() for d in p.get_devices(cl.device_type.CPU)]
    except cl.Error as e:
        raise SimUnavailable(f"no OpenCL platform (apt install pocl-opencl-icd): {e}") from None
    if not devs:
        raise SimUnavailable("no OpenCL CPU device (apt install pocl-opencl-icd)")
    return cl, cl.Context([devs[0]])


class Simulator:
    """One package on pocl: ``Simulator(pkg)(x)`` -> outputs; ``guards_clean()`` after a run."""

    def __init__(self, pkg):
        self.pkg, self.m = pkg, load_manifest(pkg)
        self.cl, self.ctx = _context()
        self.queue = self.cl.CommandQueue(self.ctx)
        try:
            self.prog = self.cl.Program(self.ctx, opencl_source(pkg)).build()
        except self.cl.Error as e:
            raise KilnError(f"{pkg}: pocl could not build the OpenCL kernels: {str(e)[:2000]}") from None
        self.guard = guard_bytes(self.m)
        self.kernels = {k: getattr(self.prog, k) for k in self.m.kernels}
        weights = np.zeros(self.m.weights_bytes + 2 * self.guard, np.uint8)
        weights[self.guard:self.guard + self.m.weights_bytes] = np.fromfile(os.path.join(pkg, self.m.weights_file),
                                                                            np.uint8)
        self.weights_host = weights
        mf = self.cl.mem_flags
        self.weights = self.cl.Buffer(self.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=weights)
        self.arena = self.cl.Buffer(self.ctx, mf.READ_WRITE, self.m.arena_bytes + 2 * self.guard)
        self._subs = {}

    def _arg(self, a):
        if a.scalar is not None:
            return getattr(np, a.dtype)(a.scalar) if hasattr(np, a.dtype) else np.int32(a.scalar)
        key = (a.space, a.offset, a.bytes)
        if key not in self._subs:
            buf = self.arena if a.space == "arena" else self.weights
            self._subs[key] = buf.get_sub_region(self.guard + a.offset, max(a.bytes, 1))
        return self._subs[key]

    def set_params(self, params):
        by = {w.name: w for w in self.m.weights}
        for k, v in params.items():
            if k not in by:
                raise KilnError(f"package has no weight {k!r}")
            w = by[k]
            self.weights_host[self.guard + w.offset:self.guard + w.offset + w.bytes] = \
                to_storage(np.asarray(v), w.dtype).view(np.uint8).ravel()
        self.cl.enqueue_copy(self.queue, self.weights, self.weights_host)

    def __call__(self, *inputs):
        self.start(inputs)
        for st in self.m.steps:
            self.launch_step(st)
        self.last_arena, self.last_weights = self.snapshot()
        self.check_guards()
        return [self._value(self.last_arena, o) for o in self.m.outputs]

    def start(self, inputs):
        """Fill the device arena: NaN bytes (0xFF), the package inputs at their offsets."""
        m = self.m
        arena = np.full(m.arena_bytes + 2 * self.guard, 0xFF, np.uint8)
        for spec, x in zip(m.inputs, expand_inputs(m, inputs)):
            arena[self.guard + spec.offset:self.guard + spec.offset + spec.bytes] = storage_bytes(x, spec.dtype,
                                                                                                  spec.shape)
        self.cl.enqueue_copy(self.queue, self.arena, arena)

    def launch_step(self, st):
        """Enqueue the launches of plan step ``st`` (its grid, block and arguments)."""
        for L in st.launches:
            k = self.kernels[L.kernel]
            k.set_args(*[self._arg(a) for a in L.args])
            gsize = tuple(int(g * b) for g, b in zip(L.grid, L.block))
            self.cl.enqueue_nd_range_kernel(self.queue, k, gsize, tuple(int(b) for b in L.block))

    def snapshot(self):
        """(arena, weights) bytes as the device holds them now, guard zones included."""
        arena = np.empty(self.m.arena_bytes + 2 * self.guard, np.uint8)
        weights = np.empty_like(self.weights_host)
        self.cl.enqueue_copy(self.queue, arena, self.arena)
        self.cl.enqueue_copy(self.queue, weights, self.weights)
        self.queue.finish()
        return arena, weights

    def _value(self, arena, o):
        src = arena if o.space == "arena" else self.last_weights
        raw = src[self.guard + o.offset:self.guard + o.offset + o.bytes].tobytes()
        return np.array(from_storage(raw, o.dtype, o.shape), dtype=np.float32 if o.dtype in DTYPES else None)

    def updates(self):
        return {u.name: self._value(self.last_arena, u) for u in self.m.updates}

    def check_guards(self):
        """Raise GuardViolation when a kernel wrote into a guard zone or into the weights blob."""
        g, a = self.guard, self.last_arena
        bad = []
        if not ((a[:g] == 0xFF).all() and (a[a.size - g:] == 0xFF).all()):
            bad.append("a guard zone of the arena")
        if not np.array_equal(self.last_weights, self.weights_host):
            bad.append("the weights blob or its guard zones")
        if bad:
            raise GuardViolation(f"{self.pkg}: a kernel wrote into {' and '.join(bad)}")


def run(pkg, inputs, params=None):
    """Outputs of the package on pocl (float32/NumPy arrays)."""
    s = Simulator(pkg)
    if params:
        s.set_params(params)
    return s(*inputs)


# ---- checking against a float64 reference ------------------------------------------------------
# Errors are relative to the scale of what is compared (cuda_runner.scaled_errors): max |got - ref|
# / max |ref| per output, and for a training step's gradients / the largest |ref| over all of them
# (a bias in front of a train-mode BatchNorm has an exact gradient of 0, returned as rounding noise
# by any float32 computation). Bound per output: TOLERANCE64 of the package's storage dtype, or
# PEER_FACTOR x the error of the NumPy executor's own float32 run of the graph where that is
# larger. float32 sums of K terms (K up to batch x H x W for a weight gradient) in any order stay
# around 1e-6 of the scale on the zoo; 1e-4 leaves two orders of margin, far below what a wrong
# index or a lost tile costs (O(1)). Where the step itself is ill-conditioned float32 cannot do
# 1e-4: in mobilenet-v1-0.25's batch-64 training step, perturbing the inputs and parameters by
# 2^-24 (float32 rounding) moves the float64 step's depthwise weight gradients by 2.5e-3 of the
# largest gradient (ds-cnn's: 2e-7); NumPy's float32 step is 6% off float64 there, the GPU and
# cuda-sim 1.3%. There the package is held to what float32 does on that output. float16 and
# bfloat16 round every stored value (2^-11 and 2^-8 relative; float16 gradients under 6e-5 go
# subnormal) and accumulate in float32. The same holds at half precision, where conditioning
# matters 2^13 (float16) or 2^16 (bfloat16) times more: a half package is also allowed
# PEER_FACTOR x its *rounding floor*, the error of the float64 computation itself on the inputs
# and parameters rounded to the storage dtype the package keeps them in (what any half-precision
# implementation starts from, before its first operation). fc-autoencoder's training step: its
# floor is 11.4% (float16) / 21.2% (bfloat16) of the largest gradient (in float64, a 1e-4 relative
# change of one weight of its first layer moves a gradient by 9.5%), the package 13% / 24%.
# That allowance alone stops at FLOOR_CAP: beyond it a comparison with float64 cannot tell a wrong
# result (a sign, a lost tile: O(1)) from rounding. Such an output (mobilenet-v1-0.25's half
# training steps: ReLU6 masks flip between the float64 step and any half-precision one) is
# "beyond float64": it passes only when it is within PEER_FACTOR x its floor *and* the package
# passes the launch-by-launch check (stepwise, below), which sees precisely the errors float64
# cannot (a wrong tile, index, grid or offset costs O(1) at the step that makes it). Without that
# check such an output fails.
TOLERANCE64 = {"float32": 1e-4, "float16": 3e-2, "bfloat16": 1e-1}
PEER_FACTOR = 4.0
FLOOR_CAP = 0.5


def float64_graph(graph):
    """``graph`` with its float32 values, parameters, constants and cast targets in float64. The
    NumPy executor computes in the graph's dtypes (float64 arrays fed to a float32 graph come out
    float32), so this copy is what makes a float64 reference."""
    g = graph.copy()
    g.types = {k: dataclasses.replace(t, dtype="float64") if t.dtype == "float32" and t.quant is None else t
               for k, t in g.types.items()}
    for d in (g.params, g.consts):
        for k, v in d.items():
            if v.dtype == np.float32 and g.types[k].dtype == "float64":
                d[k] = v.astype(np.float64)
    for n in g.nodes:
        n.attrs = {k: "float64" if isinstance(v, str) and v == "float32" else v for k, v in n.attrs.items()}
    return g


def _f64(v):
    v = np.asarray(v)
    return v.astype(np.float64) if v.dtype == np.float32 else v


def reference64(graph, inputs, params=None, after=None):
    """(outputs, {buffer: new value}) of the float32 ``graph`` computed in float64 from ``inputs``
    (and ``params``, overrides by name), all cast to float64; ``after``: executor.run's hook on
    each node's result."""
    g = float64_graph(graph)
    ps = {k: _f64(v) for k, v in params.items()} if params else None
    return executor.run_updates(g, *[_f64(x) for x in inputs], params=ps, after=after)


def gradient_outputs(graph):
    """Names of the outputs of a training-step graph (kiln.grad) that are gradients."""
    meta = graph.meta.get("grad")
    return list(graph.outputs[len(graph.outputs) - len(meta["wrt"]):]) if meta else []


def errors64(graph, got, want, got_updates=None, want_updates=None):
    """{value: error} for every output (and buffer update, as ``update:NAME``) against the float64
    ``want``: cuda_runner.scaled_errors, gradients scaled by the step's largest gradient."""
    names, got, want = list(graph.outputs), list(got), list(want)
    for b in want_updates or {}:
        names.append(f"update:{b}")
        got.append(got_updates[b])
        want.append(want_updates[b])
    return scaled_errors(names, got, want, gradient_outputs(graph))


def bounds64(graph, inputs, want, want_updates, dtype, params=None, storage=None):
    """{output: allowed error} (see TOLERANCE64): the dtype's tolerance, or PEER_FACTOR x the
    error of the NumPy executor's float32 run against the float64 ``want`` where larger, and for a
    half ``dtype`` PEER_FACTOR x the rounding floor (rounding_floor64) where larger still. Also
    returns the float32 run's errors and the floor (None for float32)."""
    got32, upd32 = executor.run_updates(graph, *inputs, params=params)
    peer = errors64(graph, got32, want, upd32 if want_updates else None, want_updates)
    floor = None if dtype == "float32" else rounding_floor64(graph, inputs, want, want_updates, dtype, params,
                                                             storage)
    return bounds_from(dtype, peer, floor), peer, floor


def bounds_from(dtype, peer, floor=None):
    """{output: allowed error} from the float32 run's errors ``peer`` and the rounding ``floor``
    (None: no floor, a float32 package): see TOLERANCE64. The floor's share stops at FLOOR_CAP
    (check64 lifts it for outputs beyond float64 once the launch-by-launch check passed)."""
    return {k: max(TOLERANCE64[dtype], PEER_FACTOR * v, min(FLOOR_CAP, PEER_FACTOR * (floor[k] if floor else 0.0)))
            for k, v in peer.items()}


def beyond_float64(floor):
    """Outputs whose rounding ``floor`` is too large for a float64 comparison to tell a wrong
    result from rounding (PEER_FACTOR x floor over FLOOR_CAP): they pass only with the
    launch-by-launch check (see TOLERANCE64)."""
    return sorted(k for k, v in (floor or {}).items() if PEER_FACTOR * v > FLOOR_CAP)


def rounding_floor64(graph, inputs, want, want_updates, dtype, params=None, storage=None, values=True):
    """{output: error} of the float64 computation on the graph inputs, parameters and constant
    tensors rounded to the dtype the package stores each in (``storage``: the manifest's precision
    storage map; all float32 values in ``dtype`` without one) against the exact float64 ``want``.
    With ``values``, every value the package stores in half is rounded too, where it is computed
    (exact arithmetic in between): what any implementation storing them so cannot avoid; without,
    only the inputs, parameters and constants (the step's conditioning alone)."""
    storage = storage or {}

    def rounded(name, v):
        v = np.asarray(v)
        if v.dtype.kind != "f" or storage.get(name, dtype) not in ("float16", "bfloat16"):
            return v
        d = storage.get(name, dtype)
        return from_storage(to_storage(v.astype(np.float32), d).tobytes(), d, v.shape).astype(v.dtype)

    tensors = {k: v for k, v in graph.consts.items() if np.asarray(v).size > 1}   # scalars may be literals
    ps = {k: rounded(k, v) for k, v in {**tensors, **graph.params, **(params or {})}.items()}
    xs = [rounded(n, x) for n, x in zip(graph.inputs, inputs)]
    got, upd = reference64(graph, xs, ps, after=rounded if values else None)
    return errors64(graph, got, want, upd if want_updates else None, want_updates)


def storage_map(m):
    """The per-value storage dtypes of a half package (manifest ``m``'s ``precision`` entry), or None."""
    return (m.extra.get("precision") or {}).get("storage")


def check64(pkg, graph, inputs, params=None, sim=None, launch_check=True, progress=None):
    """Run package ``pkg`` (made from the float32 ``graph``) on pocl and compare every output and
    buffer update with the float64 reference, each within its bound (bounds64). Outputs beyond
    float64 (beyond_float64) also need the launch-by-launch check: run when ``launch_check``
    (``progress``: stepwise's), else they fail. Returns {"max_err", "worst", "errors",
    "float32_errors", "rounding_floor", "tolerance", "bound", "bounds", "beyond_float64", "stepwise",
    "ok", "guards_clean"}, "worst" the output nearest its bound and "bound" its bound, "stepwise" None or the launch-by-launch
    summary (per_step left out); a write into a guard zone raises :class:`GuardViolation`."""
    sim = sim or Simulator(pkg)
    if params:
        sim.set_params(params)
    got = sim(*inputs)
    want, want_upd = reference64(graph, inputs, params)
    errs = errors64(graph, got, want, sim.updates() if want_upd else None, want_upd)
    bound, peer, floor = bounds64(graph, inputs, want, want_upd, sim.m.dtype, params, storage_map(sim.m))
    beyond = beyond_float64(floor)
    steps = None
    if beyond and launch_check:
        steps = {k: v for k, v in stepwise(pkg, inputs, params, sim=sim, progress=progress).items()
                 if k != "per_step"}
    if steps and steps["ok"]:       # the launches are right: the rest is rounding, up to PEER_FACTOR x floor
        bound.update({k: PEER_FACTOR * floor[k] for k in beyond})
    worst = max(errs, key=lambda k: errs[k] / bound[k])
    ok = all(errs[k] <= bound[k] for k in errs) and (not beyond or bool(steps and steps["ok"]))
    return {"max_err": max(errs.values()), "worst": worst, "errors": errs, "float32_errors": peer,
            "rounding_floor": floor,
            "tolerance": TOLERANCE64[sim.m.dtype], "bound": bound[worst], "bounds": bound, "beyond_float64": beyond,
            "stepwise": steps, "ok": ok, "guards_clean": True}


# ---- launch by launch: each plan step against its unscheduled PrimFunc -------------------------
# check64 compares whole outputs with float64, which cannot tell a wrong kernel from rounding when
# the step is chaotic at the package's precision. stepwise() instead runs each plan step's
# launches on pocl and the same step's *unscheduled* PrimFunc (groups.json, built for LLVM:
# cuda_plan.PlanSteps) on the same bytes (arena and weights as pocl left them after the previous
# step), and compares what each wrote. Same arithmetic in the same dtypes; only the schedule
# differs (tiling, reduction order, thread mapping), so the difference is rounding of one step:
# - a float32 sum of K terms in another order differs by at most about K x 2^-24 x sum|terms|,
#   in practice sqrt(K) x 2^-24 x sum|terms| (K up to batch x H x W: 147,456 for a BatchNorm
#   mean or a weight gradient of mobilenet-v1-0.25's first layer at batch 64, 384 x 6e-8 = 2.3e-5
#   of sum|terms|; the unscheduled function adds them one after another);
# - a value stored in float16 / bfloat16 is rounded once more to its 11 / 8 significant bits: a
#   float32 difference that straddles a rounding boundary becomes one unit in the last place,
#   2^-10 / 2^-7 of the output's scale at most; a fused step rounds a few times in a row.
# Errors are max |pocl - unscheduled| / max |unscheduled| per output argument (its own scale). The
# bound STEP_TOLERANCE: float32 1e-4 (4x the estimate above);
# float16 / bfloat16 8 units in the last place of the output's scale (8 x 2^-10 = 7.8e-3,
# 8 x 2^-7 = 6.3e-2). Integer outputs (int8, int16, int32 accumulators, masks) must be bit-exact.
# A float output is held to the bound of the narrowest float dtype among the step's arguments and
# the values it computes in (a mixed-precision step may read float32 values and round them to
# bfloat16 itself before multiplying: mobilenet-v1-0.25's bfloat16 weight gradients): a
# float32 sum of bfloat16 products is rounded where its operands are, and cuda-sim rounds after
# every half operation (as the GPU does) where TVM's LLVM build of a bfloat16 step computes in
# float32 and rounds at its stores (fc-autoencoder's bfloat16 step: 2.5e-3 on a float32 gradient).
# A wrong index, a lost tile or a race costs O(1) (or NaN: unwritten poisoned bytes), far above.
# An output whose exact value is zero up to rounding (a bias gradient in front of a train-mode
# BatchNorm: the column sums of the output gradient, 4e-6 from terms of size 3.6 in fc-autoencoder's
# float16 step) is pure reordering noise relative to its own scale. Where an output is over its
# bound, the step is run once more, unscheduled, on the absolute values of its float inputs: for
# sums of products that gives sum|terms| per element, the scale reordering errors are relative to,
# and the output's scale becomes the larger of the two (a wrong term among K still costs ~1/K).
# Bytes a step's launches do not name as arguments must not change.
STEP_TOLERANCE = {"float32": 1e-4, "float16": 8 * 2.0 ** -10, "bfloat16": 8 * 2.0 ** -7}


def _decoded(space, a, dtype, shape):
    raw = space[a.space][a.offset:a.offset + a.bytes]
    if dtype == "bfloat16":
        return from_storage(raw.tobytes(), dtype, shape).astype(np.float64)
    v = raw.view(np.dtype(dtype)).reshape(shape)
    return v.astype(np.float64) if v.dtype.kind == "f" else v


def _max_abs(v):
    v = np.abs(v[np.isfinite(v)])
    return float(v.max()) if v.size else 0.0


def step_errors(st, params, got, want, magnitude=None, inner=()):
    """{argument value: (error, bound)} of one plan step: pocl's ``got`` against the unscheduled
    ``want`` (memory spaces after the step), see STEP_TOLERANCE; ``magnitude``: the step run on
    its inputs' absolute values (abs_inputs), a lower limit of each output's scale; ``inner``: the
    half dtypes the step computes in (PlanSteps.half_dtypes). Integer outputs: error is the count
    of differing elements, bound 0."""
    vals = [(a, dt, sh) for a, (dt, sh) in zip(st.args, params) if a.space is not None]
    # a float output is held to the tolerance of the narrowest float dtype the step touches
    loose = max([STEP_TOLERANCE[dt] for dt in [dt for _, dt, _ in vals] + list(inner) if dt in STEP_TOLERANCE] + [0.0])
    out = {}
    for a, dt, sh in vals:
        g, w = _decoded(got, a, dt, sh), _decoded(want, a, dt, sh)
        if np.array_equal(g, w, equal_nan=g.dtype.kind == "f"):
            out[a.value] = (0.0, loose if dt in STEP_TOLERANCE else 0.0)
            continue
        if dt not in STEP_TOLERANCE:
            out[a.value] = (float(np.count_nonzero(g != w)), 0.0)
            continue
        if not np.array_equal(np.isnan(g), np.isnan(w)):
            out[a.value] = (float("inf"), loose)
            continue
        fin = np.isfinite(w)
        scale = max(_max_abs(w), _max_abs(_decoded(magnitude, a, dt, sh)) if magnitude else 0.0, 1e-30)
        d = np.abs(np.where(fin, g, 0.0) - np.where(fin, w, 0.0))
        if not np.array_equal(g[~fin], w[~fin]):
            d = np.append(d, np.inf)
        out[a.value] = (float(d.max()) / scale, loose)
    return out


def abs_inputs(st, params, space):
    """A copy of memory ``space`` with step ``st``'s float inputs replaced by their absolute values
    (sign bits cleared; NaN stays NaN)."""
    from .cuda_plan import aligned_copy
    out = {k: aligned_copy(v) for k, v in space.items()}
    for a, (dt, _) in zip(st.args[:st.n_inputs], params):
        if a.space is not None and dt in STEP_TOLERANCE:
            raw = out[a.space][a.offset:a.offset + a.bytes]
            bits = raw.view(np.uint32) if dt == "float32" else raw.view(np.uint16)
            bits &= bits.dtype.type(0x7FFFFFFF if dt == "float32" else 0x7FFF)
    return out


def _untouched_differs(st, before, got):
    """True when pocl changed bytes outside every argument of the step's launches."""
    for space in ("arena", "weights"):
        keep = np.ones(before[space].size, bool)
        for L in st.launches:
            for a in L.args:
                if a.space == space:
                    keep[a.offset:a.offset + a.bytes] = False
        if not np.array_equal(before[space][keep], got[space][keep]):
            return True
    return False


def stepwise(pkg, inputs, params=None, sim=None, stop_at_first=False, progress=None):
    """Check package ``pkg`` launch by launch (see STEP_TOLERANCE): every plan step run on pocl
    from the arena the previous steps left there, against its unscheduled PrimFunc on the same
    bytes. Returns {"ok", "steps", "checked", "worst_err", "worst_step", "failing_step",
    "failing_kernel", "failing_value", "per_step": [{"step", "func", "kernels", "err", "bound",
    "value", "ok"}]} (err/bound of the argument nearest its bound; err None: infinite, NaN bytes
    where the unscheduled step wrote numbers, or bytes changed outside the arguments); ``progress`` is called with
    each step's row as it is checked."""
    from .cuda_plan import PlanSteps, aligned_copy
    sim = sim or Simulator(pkg)
    if params:
        sim.set_params(params)
    plan = PlanSteps(pkg, sim.m)
    g = sim.guard
    sim.start(inputs)
    rows, fail = [], None
    for st in sim.m.steps:
        a0, w0 = sim.snapshot()
        before = {"arena": a0[g:a0.size - g], "weights": w0[g:w0.size - g]}
        want = {k: aligned_copy(v) for k, v in before.items()}
        plan.call(st, want)
        sim.launch_step(st)
        a1, w1 = sim.snapshot()
        sim.last_arena, sim.last_weights = a1, w1
        got = {"arena": a1[g:a1.size - g], "weights": w1[g:w1.size - g]}
        inner = plan.half_dtypes(st)
        errs = step_errors(st, plan.params(st), got, want, inner=inner)
        if any(e > b > 0 for e, b in errs.values()):     # cancellation? (see STEP_TOLERANCE)
            mag = abs_inputs(st, plan.params(st), before)
            plan.call(st, mag)
            errs = step_errors(st, plan.params(st), got, want, mag, inner)
        if _untouched_differs(st, before, got):
            errs["(bytes outside its arguments)"] = (float("inf"), 0.0)
        value = max(errs, key=lambda k: _ratio(*errs[k]))
        err, bound = errs[value]
        row = {"step": st.step, "func": st.func, "kernels": [L.kernel for L in st.launches], "err": err,
               "bound": bound, "value": value, "ok": all(e <= b for e, b in errs.values())}
        rows.append(row)
        if progress:
            progress(dict(row, err=err if np.isfinite(err) else None))
        if not row["ok"] and fail is None:
            fail = row
            if stop_at_first:
                break
    sim.check_guards()
    worst = max(rows, key=lambda r: _ratio(r["err"], r["bound"]))
    for r in rows:      # JSON has no infinity: null (NaN left where a number was written, or stray bytes)
        r["err"] = r["err"] if np.isfinite(r["err"]) else None
    return {"ok": fail is None, "steps": len(sim.m.steps), "checked": len(rows), "worst_err": worst["err"],
            "worst_bound": worst["bound"], "worst_step": worst["step"],
            "failing_step": fail and fail["step"], "failing_func": fail and fail["func"],
            "failing_kernel": fail and fail["kernels"], "failing_value": fail and fail["value"], "per_step": rows}


def _ratio(err, bound):
    return err / bound if bound else (0.0 if err == 0 else float("inf"))
