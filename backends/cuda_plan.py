"""Reading a CUDA package (backends/cuda.py writes it): its typed manifest, the consistency check,
the storage conversions of its values, and the CPU plan interpreter.

``interpret_plan(pkg, inputs)`` executes the package's launch plan on the CPU: each step's
PrimFunc (groups.json) is built for LLVM and called on NumPy views of one arena and the weights
blob at the manifest's offsets, so offsets, lifetimes and step order are validated without a GPU.
"""
from __future__ import annotations

import os

import numpy as np

from kiln.frontend.errors import KilnError
from kiln.frontend.ops.nn import dropout_mask_values

from . import planner
from .manifest import CUDA_FORMAT, FILE, Manifest
from .manifest import load_manifest as _load

ALIGN = 256
DTYPES = ("float32", "float16", "bfloat16")
INT8 = "int8"     # the dtype of a quantised graph's package (backends/cuda_int8.py): compared exactly
# absolute tolerance of a float package against the float32 NumPy reference, by storage dtype:
# float32 kernels reorder sums (1e-4); float16 (10-bit mantissa) and bfloat16 (7-bit mantissa)
# round every stored value, layer after layer, to ~1e-3 and ~8e-3 relative
TOLERANCE = {"float32": 1e-4, "float16": 3e-2, "bfloat16": 1e-1}


def tolerance(dtype):
    """The comparison tolerance for a package of storage dtype ``dtype``."""
    if dtype not in TOLERANCE:
        raise KilnError(f"no float tolerance for dtype {dtype!r} (known: {', '.join(TOLERANCE)})")
    return TOLERANCE[dtype]


def load_manifest(pkg) -> Manifest:
    """The manifest of a CUDA package folder (a named error for anything else)."""
    if not os.path.exists(os.path.join(pkg, FILE)):
        raise KilnError(f"{pkg}: no {FILE} (not a Kiln CUDA package)")
    m = _load(pkg)
    if not m.is_cuda or m.format != CUDA_FORMAT:
        raise KilnError(f"{os.path.join(pkg, FILE)}: target {m.target!r} format {m.format!r}, expected cuda format "
                        f"{CUDA_FORMAT}")
    return m


# ---- storage -----------------------------------------------------------------------------------
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


def storage_bytes(x, dtype, shape=None):
    """The bytes of one value as the package stores it (float inputs as float32 first)."""
    x = np.asarray(x, np.float32 if dtype in DTYPES else dtype)
    return to_storage(x if shape is None else x.reshape(shape), dtype).view(np.uint8).ravel()


# ---- plan checks -------------------------------------------------------------------------------
def check_plan(buffers, offsets, align=16):
    """Raise if two buffers ``[(name, bytes, first step, last step)]`` alive at the same step
    overlap in the arena (or one is misaligned)."""
    bad = planner.overlaps([planner.Buffer(n, s, f, l, align) for n, s, f, l in buffers], offsets)
    if bad:
        raise KilnError("arena plan is wrong: " + "; ".join(bad[:5]))


def check_package(pkg) -> Manifest:
    """Consistency of a package: every argument inside the arena or the weights blob, no two
    buffers alive at once overlapping, every launched kernel defined in the sources, launch
    dimensions within CUDA limits. Returns the manifest."""
    m = load_manifest(pkg)
    src = "".join(open(os.path.join(pkg, s)).read() for s in m.sources)
    wbytes = os.path.getsize(os.path.join(pkg, m.weights_file))
    if wbytes != m.weights_bytes:
        raise KilnError(f"{pkg}: weights.bin has {wbytes} bytes, manifest says {m.weights_bytes}")
    limit = {"arena": m.arena_bytes, "weights": m.weights_bytes}
    for st in m.steps:
        for L in st.launches:
            where = f"step {st.step} ({st.func}) kernel {L.kernel}"
            if "void __launch_bounds__" not in src or f" {L.kernel}(" not in src:
                raise KilnError(f"{where}: not defined in {m.sources}")
            if any(b > 1024 for b in L.block) or int(np.prod(L.block)) > 1024 or min(L.grid + L.block) < 1:
                raise KilnError(f"{where}: bad launch config grid {L.grid} block {L.block}")
            for a in L.args:
                if a.space is None:
                    continue
                if not (0 <= a.offset and a.offset + a.bytes <= limit[a.space]):
                    raise KilnError(f"{where}: argument {a.value} [{a.offset}, +{a.bytes}) outside the "
                                    f"{a.space} ({limit[a.space]} bytes)")
                if a.offset % 16:
                    raise KilnError(f"{where}: argument {a.value} offset {a.offset} not 16-byte aligned")
    check_plan([(b.name, b.bytes, b.first, b.last) for b in m.buffers], {b.name: b.offset for b in m.buffers})
    for b in m.buffers:
        if b.offset + b.bytes > m.arena_bytes:
            raise KilnError(f"buffer {b.name} ends past the arena")
    return m


def guard_bytes(m: Manifest):
    """Bytes of the guard zones before and after the arena and the weights blob: the largest
    argument of any launch (a kernel that reads its padding halo before the bounds check reads at
    most about one row of its operand outside it), 256-byte aligned, at least 4 KiB."""
    big = max([a.bytes for st in m.steps for L in st.launches for a in L.args if a.space] + [4096])
    return (big + ALIGN - 1) // ALIGN * ALIGN


def expand_inputs(m: Manifest, inputs):
    """Package inputs (manifest order) from the user's inputs: adds the dropout masks, made on the
    host from the key inputs with the reference's generator."""
    users = m.user_inputs or [i.name for i in m.inputs]
    if len(inputs) != len(users):
        raise KilnError(f"package takes {len(users)} inputs {users}, got {len(inputs)}")
    env = dict(zip(users, inputs))
    if m.dropout_masks:
        env.update(dropout_mask_values(m.dropout_masks, env))
    return [env[i.name] for i in m.inputs]


# ---- the CPU plan interpreter ------------------------------------------------------------------
def _aligned_bytes(n, align=ALIGN):
    raw = np.empty(n + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + n]


def _memory(pkg, m: Manifest, inputs, params, poison):
    """{"arena": bytes, "weights": bytes} filled as the GPU runner fills device memory."""
    arena = _aligned_bytes(m.arena_bytes)
    arena[:] = 0xFF if poison else 0
    weights = _aligned_bytes(m.weights_bytes)
    weights[:] = np.fromfile(os.path.join(pkg, m.weights_file), np.uint8)
    for w in m.weights:
        if params and w.name in params:
            weights[w.offset:w.offset + w.bytes] = to_storage(np.asarray(params[w.name]), w.dtype).view(np.uint8).ravel()
    for spec, x in zip(m.inputs, expand_inputs(m, inputs)):
        arena[spec.offset:spec.offset + spec.bytes] = storage_bytes(x, spec.dtype, spec.shape)
    return {"arena": arena, "weights": weights}


def interpret_plan(pkg, inputs, params=None, poison=True):
    """Run a CUDA package's plan on the CPU: each step's (unscheduled) PrimFunc is built for LLVM
    and called on NumPy views of a single arena and of the weights blob at the manifest offsets,
    in plan order. The arena starts filled with NaN bytes (``poison``) so a step that reads a
    buffer nobody wrote, or one clobbered by a wrongly shared slot, shows up as NaN. Returns the
    outputs as float32/NumPy arrays."""
    steps = PlanSteps(pkg)
    m = steps.m
    space = _memory(pkg, m, inputs, params, poison)
    for st in m.steps:
        steps.call(st, space)
    outs = []
    for o in m.outputs:
        raw = space[o.space][o.offset:o.offset + o.bytes].tobytes()
        outs.append(np.array(from_storage(raw, o.dtype, o.shape), dtype=np.float32 if o.dtype in DTYPES else None))
    return outs


def aligned_copy(raw):
    """A copy of the bytes ``raw`` (a memory space) aligned as PlanSteps.call needs them."""
    out = _aligned_bytes(raw.size)
    out[:] = raw
    return out


class PlanSteps:
    """The package's unscheduled step PrimFuncs (groups.json), each built for LLVM:
    ``call(step, space)`` runs one manifest step on ``space`` ({"arena": bytes, "weights": bytes},
    256-byte aligned uint8 arrays) in place; ``params(step)`` its (dtype, shape) per argument."""

    def __init__(self, pkg, m: Manifest | None = None):
        import tvm  # TVM: builds each step for the CPU

        from . import cuda_dp4a  # noqa: F401  (registers kiln.dp4a, which int8 steps call)
        self.m = m or load_manifest(pkg)
        with open(os.path.join(pkg, "groups.json")) as f:
            self.tir_mod = tvm.ir.load_json(f.read())
        self._half = {}
        self.funcs = {gv.name_hint: tvm.tirx.build(fn.with_attr("global_symbol", gv.name_hint), target="llvm")
                      for gv, fn in self.tir_mod.functions.items()}

    def params(self, st):
        """[(dtype, shape)] of step ``st``'s arguments (shape None for a scalar)."""
        out = []
        for p in self.tir_mod[st.func].params:
            b = p.ty if hasattr(p, "ty") else None
            shape = [int(s) for s in b.shape] if b is not None and hasattr(b, "shape") else None
            out.append((str(b.dtype) if b is not None and hasattr(b, "dtype") else "float32", shape))
        return out

    def half_dtypes(self, st):
        """The half-precision dtypes step ``st``'s function computes in, arguments or not (a mixed
        step reads float32 values and rounds them to bfloat16 inside before multiplying)."""
        if st.func not in self._half:
            text = self.tir_mod[st.func].script()
            self._half[st.func] = {d for d in ("float16", "bfloat16") if f'"{d}"' in text}
        return self._half[st.func]

    def call(self, st, space):
        import ml_dtypes  # TVM's own dependency: its bfloat16 arrays
        import tvm

        def view(a, shape, dtype):
            raw = space[a.space][a.offset:a.offset + a.bytes]
            return raw.view(np.uint16 if dtype == "bfloat16" else np.dtype(dtype)).reshape(shape)
        args, copies = [], []
        for a, (dtype, shape) in zip(st.args, self.params(st)):
            if dtype == "bfloat16":   # DLPack has no bfloat16: a copy in TVM's bfloat16, copied back after
                args.append(tvm.runtime.tensor(view(a, shape, dtype).view(ml_dtypes.bfloat16)))
                copies.append((args[-1], view(a, shape, dtype)))
            else:
                args.append(tvm.runtime.from_dlpack(view(a, shape, dtype)))
        self.funcs[st.func](*args)
        for t, raw in copies:
            raw[...] = t.numpy().view(np.uint16)
