"""Lower fused groups of graph nodes to TVM TE, schedule them and turn them into C kernels.

A node is lowered by the op's C override when there is one and it takes the case at hand, else by
the op's own TE compute (``OpDef.te``, the one float lowering every backend shares; ``lower_te``).
Overrides (``backends/ops_elementwise.py``, ``ops_misc.py``, ``ops_nn.py``) are registered with
``lower_rule(op)`` and have the signature ``rule(k: KernelBuilder, node, xs) -> te.Tensor | None``
where ``xs`` are TE tensors for the node's inputs; they hold the int8 kernels (TFLite semantics)
and the DSP kernels, and return None for a case they leave to the TE compute (float). A rule may
replace a constant input by a transformed copy (``k.const``), declare that its output may
overwrite an input in place (``k.inplace``; ``k.inplace_hints_of_op()`` applies the op's usual
ones from ``backends/inplace.py``) and set the group's schedule (``k.schedule``). A rule may write a
second node of its group as well (``k.also_writes``: a stateful LSTM's final cell state next to its
sequence, ``passes.fuse``): that node is not lowered on its own and the kernel has one output
parameter more. MACs come from the op (``OpDef.macs``) for every node lowered, whichever path
lowers it.
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import tvm_ffi
from tvm import s_tir, te, tirx

from kiln.frontend.errors import KilnError
from kiln.frontend.ops import te_helpers as T
from kiln.frontend.registry import OPS, SHAPE, deflower, get_op

from . import inplace, schedules, tirc
from .emit import c_ident

BACKEND = "c"


PENDING = {}   # op name -> rule, for ops registered later (e.g. quantize/dequantize by kiln.quantize)


def lower_rule(op_name):
    """``deflower(op_name, "c")``, deferred until the op exists in the registry."""
    def deco(fn):
        if op_name in OPS:
            deflower(op_name, BACKEND)(fn)
        else:
            PENDING[op_name] = fn
        return fn
    return deco


def register_pending():
    for name in list(PENDING):
        if name in OPS:
            deflower(name, BACKEND)(PENDING.pop(name))


class LoweringError(KilnError):
    """An op, dtype or attribute a target cannot run; names the op and the node."""


@dataclasses.dataclass
class Arg:
    kind: str          # "value" (arena tensor), "const" (flash array), "scratch" (arena, this kernel only)
    name: str          # graph value / constant name / scratch id
    dtype: str
    nbytes: int
    writes: bool = False


@dataclasses.dataclass
class Kernel:
    name: str                     # C function name
    nodes: list                   # graph node names covered (in order)
    ops: list
    out: str                      # graph value produced
    args: list                    # [Arg] in C parameter order
    inplace: dict                 # graph input value -> min shift (bytes) for in-place output
    macs: int = 0
    source: str = ""              # C function text (static)
    mod: object = None
    also: list = dataclasses.field(default_factory=list)   # other graph values it writes (k.also_writes)


class KernelBuilder:
    """Context handed to lowering rules while one fused group is lowered."""

    def __init__(self, graph, group, target, consts):
        self.graph = graph
        self.group = group
        self.target = target
        self.consts = consts                 # name -> np.ndarray (graph params + consts + folded)
        self.placeholders = {}               # te.Tensor -> Arg
        self._by_value = {}
        self.extra_consts = {}               # new constant name -> array
        self.inplace_hints = {}
        self.n_macs = 0
        self.schedule_fn = None
        self.node = None
        self.also = {}                       # graph value -> TE tensor: further outputs (also_writes)

    # ---- what rules use ---------------------------------------------------------------
    def type(self, value):
        return self.graph.types[value]

    def value(self, name):
        """The constant array behind a graph value, or None for run-time values."""
        return self.consts.get(name)

    def const(self, tag, array, dtype=None):
        """A new constant array (e.g. requantisation multipliers) as a TE placeholder."""
        array = np.ascontiguousarray(np.asarray(array, dtype=dtype))
        name = f"{self.node.name}_{tag}"
        self.extra_consts[name] = array
        t = te.placeholder(array.shape or (1,), str(array.dtype), name=c_ident(tag))
        self.placeholders[t] = Arg("const", name, str(array.dtype), array.nbytes)
        return t

    def inplace(self, value, min_shift):
        """The kernel's output may start ``min_shift`` bytes (or more) below ``value``'s start
        and overwrite it (``value`` must die here; the planner checks)."""
        self.inplace_hints[value] = int(min_shift)

    def macs(self, n):
        self.n_macs += int(n)

    def also_wanted(self):
        """The values this group's kernel must write besides its output (``passes.Group.also``)."""
        return list(getattr(self.group, "also", ()))       # no group: a kernel of one node

    def also_writes(self, value, tensor):
        """The kernel also writes ``value`` (one of ``also_wanted()``, the output of another node
        of the group) from ``tensor``, which the current node's compute has made anyway: that node
        is then not lowered on its own."""
        if value not in self.also_wanted():
            self.fail(f"{value!r} is not an output of this kernel (it writes {self.node.name!r}"
                      f"{''.join(', ' + repr(v) for v in self.also_wanted())})")
        self.also[value] = tensor

    def schedule(self, fn):
        """``fn(sch, out_block)`` replaces the default schedule for this group."""
        self.schedule_fn = fn

    def inplace_hints_of_op(self):
        """The current node's usual in-place hints (``inplace.hints``: element-wise ops, a
        reshape copy, conv2d and pools); returns them."""
        n = self.node
        hints = inplace.hints(get_op(n.op), n.inputs, [self.type(i) for i in n.inputs], self.type(n.name), n.attrs)
        for v, shift in hints.items():
            self.inplace(v, shift)
        return hints

    def fail(self, msg):
        n = self.node
        raise LoweringError(f"node {n.name!r} ({n.op}): {msg} (target {self.target.name})")

    # ---- internal ----------------------------------------------------------------------
    def input_tensor(self, value):
        if value in self._by_value:
            return self._by_value[value]
        t = self.graph.types[value]
        kind = "const" if value in self.consts else "value"
        if t.dtype == "int64" and kind == "const" and int16_bias_reader(self, value):
            return None       # a 16x8 bias: its rule reads the constant (k.value) and stores int32 parts
        if t.dtype in ("bfloat16", "float16", "float64", "int64"):
            self.fail(f"dtype {t.dtype} of {value!r} is not supported by the C backend")
        ph = te.placeholder(t.shape or (1,), c_storage(t.dtype), name=c_ident(value))
        self.placeholders[ph] = Arg(kind, value, c_storage(t.dtype), t.nbytes)
        self._by_value[value] = bool_view(ph) if t.dtype == "bool" else ph
        return self._by_value[value]


# ---- bool tensors: one byte each (0 or 1, as NumPy and TFLite store them), uint8 in C ---------------
def c_storage(dtype):
    """The C element type a Kiln dtype is stored as (bool: uint8)."""
    return "uint8" if dtype == "bool" else dtype


def bool_view(ph):
    """A stored bool tensor (uint8) as the bool values the ops' TE computes take."""
    return te.compute(ph.shape, lambda *i: tirx.NE(ph(*i), tirx.const(0, "uint8")), name=f"{ph.op.name}_b")


def bool_store(out):
    """A kernel's bool result as the bytes it stores (0 or 1)."""
    return te.compute(out.shape, lambda *i: out(*i).astype("uint8"), name=f"{out.op.name}_u8")


# data the C backend's kernels read and write
C_DTYPES = ("float32", "int32", "int16", "int8", "uint8", "bool")


def c_lowerable(op_name):
    """Whether the C backend can lower the op at all: a C override or the op's TE compute."""
    op = get_op(op_name)
    return BACKEND in op.lower or op.te is not None


def lower_node(k, node, xs):
    """One node: the op's C override when it takes this case (it returns None when it does not),
    else the op's TE compute (``lower_te``)."""
    rule = get_op(node.op).lower.get(BACKEND)
    y = rule(k, node, xs) if rule is not None else None
    return lower_te(k, node, xs) if y is None else y


def _check_te_types(k, node, op):
    for v in list(node.inputs) + [node.name]:
        t = k.type(v)
        if t.dtype not in C_DTYPES:
            k.fail(f"{node.op} on {t} ({v!r}) is not supported by the C backend (data types: "
                   f"{', '.join(C_DTYPES)})")
        if t.quant is not None and SHAPE not in op.props:
            int8 = sorted(n for n, o in OPS.items() if BACKEND in o.lower and o.int8_ref is not None)
            k.fail(f"{node.op} has no int8 kernel on the C backend ({v!r} is quantised: {t}); ops with "
                   f"C int8 kernels: {', '.join(int8)}, and data movement)")


def lower_te(k, node, xs, attrs=None, te_fn=None):
    """A node through its op's TE compute, with the C backend's facts about it: supported data
    types (quantised operands only for data movement, which is exact whatever the scale), the
    usual in-place hints and a schedule from ``schedules.TE_SCHEDULES``. Scalars, which C
    kernels hold as one-element arrays, reach the rule as 0-d tensors; a reduction whose input
    may be overwritten in place gets a store stage (its accumulator stays a scalar and every
    window is read before its output element is written). ``attrs`` replaces the node's
    attributes (an override that only changes one, as the int8 pad's fill value); ``te_fn``
    replaces the op's TE compute, same signature (a rule that uses more of it than its output)."""
    op = get_op(node.op)
    if op.te is None:
        k.fail(f"op '{node.op}' has no C lowering (no C kernel and no TE compute)")
    _check_te_types(k, node, op)
    hints = k.inplace_hints_of_op()
    pick = schedules.TE_SCHEDULES.get(node.op)
    sched = pick([k.type(i) for i in node.inputs], k.type(node.name), node.attrs, k.target) if pick else None
    if sched is not None:
        k.schedule(sched)
    y = (te_fn or op.te)(T, [x if k.type(v).shape else _as_0d(x) for x, v in zip(xs, node.inputs)],
                         node.attrs if attrs is None else attrs, k.type(node.name))
    if hints and _is_reduction_op(y):
        y = _copy(y, f"{y.op.name}_store")
    return y if y.shape else _as_1d(y)


def _as_0d(x):
    return te.compute((), lambda: x[0], name=f"{x.op.name}_0d")


def _as_1d(y):
    return te.compute((1,), lambda i: y(), name=f"{y.op.name}_1")


def _copy(y, name):
    return te.compute(y.shape, lambda *i: y(*i), name=name)


def _is_reduction_op(t):
    return isinstance(t.op, te.ComputeOp) and len(t.op.reduce_axis) > 0


def _used_placeholders(outs):
    """The placeholders the TE tensor ``outs`` (or a list of them) reads."""
    seen, order, stack = set(), [], list(outs) if isinstance(outs, (list, tuple)) else [outs]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if isinstance(t.op, te.PlaceholderOp):
            order.append(t)
        else:
            stack.extend(t.op.input_tensors)
    return order


def default_schedule(sch, out_block):
    """Inline every injective stage; move reductions under their consumer's loops (so their
    accumulators shrink to scalars) and split off the reduction init."""
    blocks = sch.get_child_blocks(sch.get_sblock("root")) if _has_root(sch) else []
    for b in blocks:
        name = sch.get(b).name_hint
        if name == out_block:
            continue
        try:
            sch.compute_inline(b)
        except Exception:  # noqa: BLE001 (reductions and multi-consumer stages stay)
            pass
    reductions = [b for b in sch.get_child_blocks(sch.get_sblock("root"))
                  if sch.get(b).name_hint != out_block and _is_reduction(sch, b)]
    placed = set()
    for b in reversed(reductions):
        consumers = sch.get_consumers(b)
        if len(consumers) != 1:
            continue
        nsp = sum(1 for iv in sch.get(b).iter_vars if int(iv.iter_type) == 0)
        loops = sch.get_loops(consumers[0])
        if not loops or nsp == 0:
            continue
        at = min(nsp, len(loops)) - 1
        try:
            sch.compute_at(b, loops[at], preserve_unit_loops=False)
        except Exception:  # noqa: BLE001
            continue
        name = sch.get(b).name_hint
        own = sch.get_loops(sch.get_sblock(name))
        if len(own) > at + 1:
            try:
                sch.decompose_reduction(sch.get_sblock(name), own[at + 1])
                placed.add(name)
            except Exception:  # noqa: BLE001
                pass
    decompose_reductions(sch, skip=placed)


def _has_root(sch):
    try:
        sch.get_sblock("root")
        return True
    except Exception:  # noqa: BLE001
        return False


def _is_reduction(sch, b):
    return any(int(iv.iter_type) == 2 for iv in sch.get(b).iter_vars)


def decompose_reductions(sch, skip=()):
    """Split the init of every reduction block out of its reduction loops (the reduction
    loops are the innermost ones, as TE creates them)."""
    for b in sch.get_child_blocks(sch.get_sblock("root")):
        blk = sch.get(b)
        if blk.init is None or blk.name_hint in skip:
            continue
        nred = sum(1 for iv in blk.iter_vars if int(iv.iter_type) == 2)
        loops = sch.get_loops(b)
        if nred == 0 or len(loops) < nred:
            continue
        try:
            sch.decompose_reduction(b, loops[len(loops) - nred])
        except Exception:  # noqa: BLE001
            pass


def lower_group(graph, group, target, consts, kname, cache=None) -> Kernel:
    """Lower one fused group (``group.nodes``, producing ``group.out``) to a C kernel. ``cache``
    (a :class:`BuildCache`, one per compile) shares the TVM build of structurally equal scheduled
    functions: a kernel equal to an earlier one up to its buffers' names (the time steps of an
    unrolled RNN) gets the earlier kernel's C function (``source``) instead of a new build."""
    s = schedule_group(graph, group, target, consts, kname)
    return kernel_of(s, (cache if cache is not None else BuildCache()).build(s.func, kname, s.ro, s.kinds))


@dataclasses.dataclass
class Scheduled:
    """A fused group lowered to TE and scheduled, not yet built by TVM: its scheduled PrimFunc
    (parameters: the placeholders ``phs`` then the outputs, the graph values ``values``),
    read-only parameter names and the (kind, dtype) of each placeholder."""
    k: KernelBuilder
    group: object
    kname: str
    phs: list
    func: object
    ro: list
    kinds: tuple
    values: list


def schedule_group(graph, group, target, consts, kname) -> Scheduled:
    """A group's nodes through their lowering rules, as one scheduled PrimFunc (no TVM build)."""
    k = KernelBuilder(graph, group, target, consts)
    out = _lower_nodes(k, graph, group, target)
    missing = [v for v in group.also if v not in k.also]
    if missing:
        raise LoweringError(f"node {group.out!r}: its lowering did not write {', '.join(map(repr, missing))}, "
                            f"which its kernel covers (target {target.name})")
    values = [group.out] + list(group.also)
    outs = [_checked_output(graph, v, t) for v, t in zip(values, [out] + [k.also[v] for v in group.also])]
    out = outs[0]
    if _is_reduction_op(out):
        k.inplace_hints.clear()   # a reduction into the output stores before it has read everything
    phs = _used_placeholders(outs)
    func = te.create_prim_func(phs + outs)
    sch = s_tir.Schedule(func)
    (k.schedule_fn or default_schedule)(sch, out.op.name)
    return Scheduled(k, group, kname, phs, sch.mod["main"], [ph.op.name for ph in phs],
                     tuple((k.placeholders[ph].kind, k.placeholders[ph].dtype) for ph in phs), values)


def kernel_of(s: Scheduled, built) -> Kernel:
    """The kernel of a scheduled group built as ``built`` (its own build, an equal one's, or its
    family's template with its constants: families_tir.py)."""
    k, group, kname, phs, values, types = s.k, s.group, s.kname, s.phs, s.values, s.k.graph.types
    args = []
    for p, role in zip(built.cparams, built.roles):
        if role == "scratch":
            args.append(Arg("scratch", f"{kname}.{p.name}", p.dtype, p.scratch_bytes, writes=True))
        elif role >= len(phs):
            v = values[role - len(phs)]
            args.append(Arg("value", v, c_storage(types[v].dtype), types[v].nbytes, writes=True))
        else:
            args.append(k.placeholders[phs[role]])
    kern = Kernel(kname, [n.name for n in group.nodes], [n.op for n in group.nodes], group.out, args,
                  dict(k.inplace_hints), k.n_macs, source=built.source, mod=built.mod, also=list(group.also))
    kern.extra_consts = k.extra_consts
    kern.cparams = built.cparams
    kern.c_function = built.name        # the C function this kernel's commands call (shared when equal)
    return kern


def _checked_output(graph, value, out):
    """A kernel's TE output for graph value ``value`` (bools stored as bytes), checked against
    the graph's type."""
    want = graph.types[value]
    if want.dtype == "bool" and out.dtype == "bool":
        out = bool_store(out)
    if tuple(int(s) for s in out.shape) != (tuple(want.shape) or (1,)) or out.dtype != c_storage(want.dtype):
        raise LoweringError(f"node {value!r}: lowering produced {out.dtype}{list(out.shape)}, graph says {want}")
    return out


def _lower_nodes(k, graph, group, target):
    """The TE tensor of a group's output, its nodes lowered one after the other (a node whose
    value an earlier node's rule wrote already, ``k.also_writes``, is not)."""
    env = {}
    for node in group.nodes:
        if node.name in k.also:
            env[node.name] = k.also[node.name]
            continue
        k.node = node
        op = get_op(node.op)
        if not c_lowerable(node.op):
            ins = ", ".join(str(graph.types[i]) for i in node.inputs)
            raise LoweringError(f"node {node.name!r}: op '{node.op}' has no C lowering "
                                f"(inputs {ins}; target {target.name})")
        if op.macs is not None:
            k.macs(op.macs([graph.types[i] for i in node.inputs], graph.types[node.name], node.attrs))
        xs = [env[i] if i in env else k.input_tensor(i) for i in node.inputs]
        env[node.name] = lower_node(k, node, xs)
    return env[group.out]


@dataclasses.dataclass
class Built:
    """One C function built from a scheduled PrimFunc: its name, TVM module, C parameters, and
    each parameter's role (the index of its buffer among the function's parameters, i.e. the
    placeholders then the output; or "scratch"), which map the parameters of every structurally
    equal function the same way."""
    name: str
    mod: object
    cparams: list
    roles: list
    source: str


class BuildCache:
    """TVM builds of scheduled PrimFuncs, keyed by structural hash (names of buffers and variables
    do not count; shapes, dtypes, constants in the code and the loop structure do) and by the
    kinds and dtypes of the parameters; a hit is confirmed with ``structural_equal``."""

    def __init__(self):
        self._by_hash = {}
        self.hits = self.builds = 0
        self.templates = 0      # families built once as a template (families_tir.py)

    def build(self, func, kname, ro, kinds) -> Built:
        key = (tvm_ffi.structural_hash(func), kinds)
        for f, built in self._by_hash.get(key, ()):
            if tvm_ffi.structural_equal(f, func):
                self.hits += 1
                return built
        mod, cparams = tirc.lower(func, kname, ro)
        index = {p.name: i for i, p in enumerate(func.params)}
        roles = []
        for p in cparams:
            if p.scratch_bytes:
                roles.append("scratch")
            elif p.name in index:
                roles.append(index[p.name])
            else:
                raise LoweringError(f"kernel {kname}: unexpected parameter {p.name!r}")
        built = Built(kname, mod, cparams, roles, tirc.build_c([mod], {kname: ro}))
        self._by_hash.setdefault(key, []).append((func, built))
        self.builds += 1
        return built


def source_key(src, name):
    """Hash of a kernel's C text with its own name blanked (identical kernels are shared)."""
    return hashlib.sha1(src.replace(name, "@").encode()).hexdigest()


# ---- int16 ----------------------------------------------------------------------------------------
def int16_bias_reader(k, value):
    """Whether ``value`` (an int64 constant) is the bias of a 16x8 conv2d/dense node that the
    current node is: its C rule (backends/ops_nn.py, ops_int16.py) reads it at compile time."""
    n = k.node
    if n is not None and n.op == "lstm":           # the 16x8 LSTM's gate biases (ops_recurrent_int16.py)
        return value in n.inputs[9:13] and k.type(n.inputs[0]).dtype == "int16"
    return (n is not None and n.op in ("conv2d", "dense", "transpose_conv2d") and len(n.inputs) == 3
            and n.inputs[2] == value and k.type(n.inputs[0]).dtype == "int16")
