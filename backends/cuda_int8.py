"""int8 and 16x8 graphs on CUDA: the C backend's integer lowering rules as TE, in one Relax module
per graph.

A quantised graph takes the CUDA pipeline of ``backends/cuda.py`` with two passes of its own in
front (``relax`` and ``steps``); scheduling (DLight), lowering, the arena plan, the weights blob,
the launch plan, the emitted package and the NVRTC check are the float path's.

Every node is lowered by the same rule the C backend uses for it (``lower.lower_node``: the op's
C override for int8, TFLite's reference kernels bit for bit, else the op's TE compute for data
movement), with a target that has no Kiln C kernels: convolutions, depthwise convolutions,
pooling, ADD, MUL, softmax, the unary tables and the requantisation are plain TE computes with
int32 accumulation and gemmlowp's SaturatingRoundingDoublingHighMul + RoundingDivideByPOT
(``qmath.mbqm``, per-channel multipliers as weights) fused as their epilogue; 16x8 nodes (int16
activations, int8 weights, int64 biases) take the C backend's 16x8 rules the same way. What
differs from the C backend:

- ``conv2d`` (not depthwise) and ``dense`` with int8 activations reduce with dp4a, the input zero
  point folded into the bias (``backends/cuda_dp4a.py``).
- ``dense`` (int8 and 16x8): LiteRT's reference FULLY_CONNECTED requantises in IEEE double
  (``round(double(acc) * eff)``, ties away from zero; ``frontend/ops/nn.py: fc_requantize``).
  The C backend emulates that in integers (``kiln_fc_s8``, a C helper a GPU kernel cannot call);
  here the kernel does the double multiply itself (GPUs and OpenCL CPUs have IEEE doubles) and
  rounds with an exact truncate-and-compare, so no ``round()`` of any runtime library is trusted.
  The per-channel ``eff`` values are float64 weights (never decimal literals in the source).
- ``softmax``: the C rule's per-row stages, each its own single-thread kernel
  (``serial_schedule``): DLight did not finish on the function in 10 minutes.
- constants a rule makes at compile time (multipliers, shifts, tables: ``k.const``) become
  weights of the package named ``<node>_<tag>``.

The Relax module is built from one ``call_tir`` per node (not ``emit_te``: a rule's constants are
only known once it has run), then FuseOps/FuseTIR merge element-wise consumers as for float.
Every int8 step is lowered without TVM's NarrowDataType (``NO_NARROW``), whose bound analysis
fails on the requantisation's Let-bound temporaries once steps are fused.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from tvm import te, tirx

from kiln.frontend.errors import KilnError
from kiln.frontend.graph import Graph
from kiln.frontend.ops.int8util import channel_params, per_tensor
from kiln.frontend.ops.nn import fc_effective_scales, fixed_requant
from kiln.frontend.ops.reduce_shape import SOFTMAX_ACCUMULATION_INTEGER_BITS, softmax_params
from kiln.frontend.registry import INT16, SHAPE

from . import cuda_dp4a, qmath
from . import ops as _c_rules  # noqa: F401  (registers the C backend's int8 rules)
from .cuda_plan import INT8
from .lower import BACKEND, KernelBuilder, LoweringError, _used_placeholders, lower_node, register_pending
from .ops_misc import row_reciprocal, softmax_exp_table
from .ops_nn import _check_16x8, _check_int8, _zp, dense16_bias, quantized, requant_epilogue
from .qmath import c

STORAGE = INT8            # the manifest's dtype for a quantised graph's package
SCHEDULE = "kiln.gpu_schedule"    # PrimFunc attribute: "Serial" -> serial_schedule, not DLight
NO_NARROW = "kiln.no_narrow"      # PrimFunc attribute: lowered without NarrowDataType (every int8 step)
NO_COMPACT = "kiln.no_compact"    # PrimFunc attribute: lowered without CompactBufferAllocation (Blockwise steps)
# ops whose int8 rule the DLight rules cannot schedule: the softmax's chain of per-row
# fixed-point stages made DLight (and lowering after it) run for over 10 minutes
SERIAL_OPS = ("softmax",)
# ops whose rule unrolls a recurrence into a chain of blocks (an LSTM: four blocks per time step,
# 198 for micro_speech_lstm's 49 steps): DLight's rules try to inline every block into every
# other (reverse_compute_inline, quadratic in the blocks) and did not finish in 15 minutes, so
# each block is its own kernel, its spatial loops over the threads (``blockwise_schedule``)
BLOCKWISE_OPS = ("lstm",)


@dataclasses.dataclass(frozen=True)
class CudaRuleTarget:
    """What the C lowering rules ask of a target: no Kiln C kernels (no DSP/Helium helpers, no
    ``call_extern`` of kiln_intrinsics.h), so every int8 rule takes its plain TE path."""
    name: str = "cuda"
    kernels: bool = False
    helium: bool = False
    softmax_helper: bool = False
    optimize: str = "speed"


RULE_TARGET = CudaRuleTarget()


def is_quantised(graph: Graph) -> bool:
    return any(t.quant is not None for t in graph.types.values())


# ---- dense: LiteRT's double requantisation, in the kernel ------------------------------------
def fc_double_epilogue(k, acc, tx, tw, ty, channels, act, out="int8"):
    """acc (int32, bias added, channels last) -> int8 exactly as LiteRT's reference
    FULLY_CONNECTED: ``v = double(acc) * eff[c]`` (one IEEE multiply, nothing to contract it
    with), ``r = round(v)`` ties away from zero as ``trunc(v) + (|v - trunc(v)| >= 0.5)`` (the
    difference is exact), saturated to int32, plus the zero point, clamped to the activation
    range. ``v`` is clamped to [-2^31 - 1, 2^31] first so the int64 conversion is defined and
    saturation is kept. ``out``: int8, or int16 for the 16x8 kernel (the same rounding)."""
    s_in, _ = per_tensor(tx, "input", "dense")
    s_out, zy = per_tensor(ty, "output", "dense")
    ws, _, _ = channel_params(tw, channels, "dense")
    eff = k.const("fc_eff", fc_effective_scales(s_in, ws, s_out).astype(np.float64))
    info = np.iinfo(out)
    lo, hi = qmath.activation_range(act, s_out, zy, int(info.min), int(info.max))
    f64, i64 = "float64", "int64"

    def body(*idx):
        v = acc(*idx).astype(f64) * eff[idx[-1]]
        vc = tirx.max(tirx.min(v, tirx.const(2.0 ** 31, f64)), tirx.const(-2.0 ** 31 - 1, f64))
        return qmath.let("fv", vc, lambda u: qmath.let("ft", u.astype(i64), lambda t: _round_clamp(
            u, t, zy, lo, hi, out), i64), f64)
    return te.compute(acc.shape, body, name="requant")


def _round_clamp(u, t, zy, lo, hi, out):
    i64, f64 = "int64", "float64"
    frac = u - t.astype(f64)
    half = tirx.const(0.5, f64)
    r = t + tirx.Select(frac >= half, c(1, i64), tirx.Select(frac <= -half, c(-1, i64), c(0, i64)))
    r = tirx.max(tirx.min(r, c(2 ** 31 - 1, i64)), c(-2 ** 31, i64)) + c(zy, i64)
    return tirx.max(tirx.min(r, c(hi, i64)), c(lo, i64)).astype(out)


def lower_dense(k, node, xs):
    """int8 dense: the int32 accumulator (dp4a with the input zero point folded into the bias,
    ``cuda_dp4a.dense_acc``; else int32 products of (x - zx) * (w - zw) plus the bias), then
    ``fc_double_epilogue``."""
    tx, tw, ty = k.type(node.inputs[0]), k.type(node.inputs[1]), k.type(node.name)
    if tx.dtype == "int16":
        return lower_dense_16x8(k, node, xs)
    if tx.dtype != "int8":
        k.fail(f"dense with a {tx.dtype} input has no CUDA kernel (int8 and 16x8 only)")
    _check_int8(k, node, [node.inputs[0], node.inputs[1], node.name])
    x, w = xs[0], xs[1]
    K, N, lead = tx.shape[-1], tw.shape[0], tx.shape[:-1]
    acc = cuda_dp4a.dense_acc(k, node, x)
    if acc is not None:
        return _fc_epilogue(k, node, acc, tx, tw, ty, N)
    zx = _zp(tx)
    zws = tw.quant.zero_point
    if len(set(zws)) != 1:
        k.fail("int8 dense needs one weight zero point")
    zw = int(zws[0])
    kk = te.reduce_axis((0, K), "k")
    acc = te.compute(lead + (N,), lambda *i: te.sum(
        (x[i[:-1] + (kk,)].astype("int32") - c(zx)) * (w[i[-1], kk].astype("int32") - c(zw)), axis=[kk]), name="acc")
    if len(xs) == 3:
        bias = xs[2]
        acc = te.compute(acc.shape, lambda *i: acc(*i) + bias[i[-1]], name="bias")
    return _fc_epilogue(k, node, acc, tx, tw, ty, N)


def _fc_epilogue(k, node, acc, tx, tw, ty, N):
    """LiteRT's double requantisation, or the conv's fixed-point one (TensorFlow Lite Micro's)
    where the node's requant is "fixed"."""
    if fixed_requant(node.attrs):
        return fc_fixed_epilogue(k, node, acc, tx, tw, ty, N)
    return fc_double_epilogue(k, acc, tx, tw, ty, N, node.attrs["activation"])


def fc_fixed_epilogue(k, node, acc, tx, tw, ty, channels):
    """acc (int32, bias added, channels last) -> int8 as TensorFlow Lite Micro's FULLY_CONNECTED:
    MultiplyByQuantizedMultiplier with the conv's multipliers (``qmath.linear_requant``), written
    as the C kernels' ``kiln_dw_requant`` in int64 without Let bindings (TVM's bound analysis of
    the LLVM build of the plan's step functions rejects ``qmath.mbqm``'s lets when the step also
    packs dp4a words): t = (acc << left) * M + 2^30, then (t >> 31) + 2^(e-1) - (t < 0), shifted
    right by e (for e = 0: t >> 31), + zero point, clamped."""
    mult, shift = qmath.linear_requant(tx, tw, ty, channels)
    s_out, zy = per_tensor(ty, "output", "dense")
    lo, hi = qmath.activation_range(node.attrs["activation"], s_out, zy)
    tm = k.const("fx_mult", mult.astype(np.int32))
    tl = k.const("fx_lshift", np.maximum(shift, 0).astype(np.int32))
    te_ = k.const("fx_rshift", np.maximum(-shift, 0).astype(np.int32))
    i64 = "int64"

    def body(*idx):
        ch = idx[-1]
        a = (acc(*idx) << tl[ch]).astype(i64)             # int32 shift: wraps as TFLite's x * (1 << left)
        t = a * tm[ch].astype(i64) + c(1 << 30, i64)
        e = te_[ch].astype(i64)
        half = (c(1, i64) << e) >> c(1, i64)
        neg = tirx.Select(tirx.all(t < c(0, i64), e > c(0, i64)), c(1, i64), c(0, i64))
        v = (((t >> c(31, i64)) + half - neg) >> e) + c(zy, i64)
        return tirx.max(tirx.min(v, c(hi, i64)), c(lo, i64)).astype("int8")
    return te.compute(acc.shape, body, name="requant")


def lower_dense_16x8(k, node, xs):
    """16x8 dense (int16 input and output, int8 weights): the C rule's int32 accumulator (bounded
    at compile time: ``ops_nn.dense16_bias``) with ``fc_double_epilogue`` in place of its C
    helper, LiteRT's double requantisation as for int8."""
    if fixed_requant(node.attrs):
        return lower_node(k, node, xs)      # TensorFlow Lite Micro's: the C rule's integer requantisation
    tx, tw, ty = _check_16x8(k, node)
    x, w = xs[0], xs[1]
    K, N, lead = tx.shape[-1], tw.shape[0], tx.shape[:-1]
    b = dense16_bias(k, node, K, N)
    kk = te.reduce_axis((0, K), "k")
    acc = te.compute(lead + (N,), lambda *i: te.sum(
        x[i[:-1] + (kk,)].astype("int32") * w[i[-1], kk].astype("int32"), axis=[kk]), name="acc")
    if len(node.inputs) == 3:
        tb = k.const("bias32", b.astype(np.int32))
        acc = te.compute(acc.shape, lambda *i: acc(*i) + tb[i[-1]], name="bias")
    return fc_double_epilogue(k, acc, tx, tw, ty, N, node.attrs["activation"], out="int16")


# ---- softmax --------------------------------------------------------------------------------
def _rdbpot_var(x, e):
    """RoundingDivideByPOT(x, e) (qmath.rdbpot) for an int32 exponent expression ``e``
    (0 <= e <= 31), with ``e`` repeated rather than Let-bound: one Let fewer per output element."""
    def body(xv):
        mask = (c(1) << e) - c(1)
        thr = (mask >> c(1)) + tirx.Select(xv < c(0), c(1), c(0))
        return (xv >> e) + tirx.Select(tirx.bitwise_and(xv, mask) > thr, c(1), c(0))
    return qmath.let("rx", x, body)


def lower_softmax(k, node, xs):
    """int8 -> int8 softmax over the last axis, TFLite's reference kernel bit for bit: the exp
    table, the row sum and gemmlowp's reciprocal in per-row stages as ops_misc._softmax_int8; the
    step gets ``serial_schedule`` (``SERIAL_OPS``)."""
    x = xs[0]
    tx, ty = k.type(node.inputs[0]), k.type(node.name)
    if tx.dtype != "int8" or ty.dtype != "int8" or tx.quant is None:
        k.fail(f"softmax on CUDA needs int8 input and output, got {tx} -> {ty}")
    if abs(ty.quant.scale[0] - 1 / 256) > 0.001 / 256 or ty.quant.zero_point[0] != -128:
        k.fail(f"int8 softmax needs output scale 1/256 and zero point -128 (TFLite), got {ty}")
    if node.attrs["axis"] % len(tx.shape) != len(tx.shape) - 1:
        k.fail("int8 softmax runs over the last axis")
    acc_bits = SOFTMAX_ACCUMULATION_INTEGER_BITS
    mult, left, diff_min = softmax_params(tx.quant.scale[0])
    tab_lo, tab_e = softmax_exp_table(mult, left, diff_min)
    texp = k.const("exp", tab_e)
    D, lead = tx.shape[-1], tx.shape[:-1]
    R = lead or (1,)
    r = te.reduce_axis((0, D), "r")
    mx = te.compute(R, lambda *i: te.max(x[(i if lead else ()) + (r,)], axis=[r]), name="rowmax")

    def exp(i, col):
        dd = x[i + (col,)].astype("int32") - mx[i or (0,)].astype("int32")
        return texp[dd + c(255)] if tab_lo == -255 else texp[tirx.max(dd, c(tab_lo - 1)) - c(tab_lo - 1)]
    r2 = te.reduce_axis((0, D), "r2")
    sm = te.compute(R, lambda *i: te.sum(((exp(i if lead else (), r2).astype("uint32") + tirx.const(
        1 << (acc_bits - 1), "uint32")) >> tirx.const(acc_bits, "uint32")).astype("int32"), axis=[r2]), name="rowsum")

    scale, nbits = row_reciprocal(sm, R, acc_bits)      # per-row stages, each its own kernel

    def body(*i):
        ri = i[:-1] or (0,)
        v = _rdbpot_var(qmath.srdhm(scale[ri], exp(i[:-1], i[-1])), nbits[ri] + c(31 - 8))
        return qmath.clamp(v - c(128), -128, 127).astype("int8")
    return te.compute(ty.shape or (1,), body, name="softmax")


# ---- conv2d ---------------------------------------------------------------------------------
def lower_conv2d(k, node, xs):
    """int8 conv2d with dp4a (``cuda_dp4a.conv2d_acc``) and the C rule's requantisation; the C
    rule itself (int32 products) where dp4a does not apply (depthwise, run-time weights, int16)."""
    acc = cuda_dp4a.conv2d_acc(k, node, xs[0])
    if acc is None:
        return lower_node(k, node, xs)
    ty = k.type(node.name)
    return requant_epilogue(k, node, acc, ty, ty.shape[-1], lambda idx: idx[3], node.attrs["activation"])


CUDA_RULES = {"dense": lower_dense, "softmax": lower_softmax, "conv2d": lower_conv2d}
CUDA_RULES_16X8 = ("dense",)      # the CUDA rules that take int16 activations; others: the C rule


def lower_int8_node(k, node, xs):
    """One node of a quantised graph as a TE tensor: the CUDA rule for int8 activations, else
    the C backend's (its 16x8 rules for int16 activations)."""
    rule = CUDA_RULES.get(node.op)
    int16 = k.type(node.inputs[0]).dtype == "int16"
    if rule is not None and quantized(k, node) and (not int16 or node.op in CUDA_RULES_16X8):
        return rule(k, node, xs)
    return lower_node(k, node, xs)


# ---- the graph as PrimFuncs + a Relax main ----------------------------------------------------
def _storage(dtype, node=None):
    if dtype == "bool":
        return "uint8"
    if dtype in ("float16", "bfloat16", "float64"):
        where = f" (node {node.name!r}, {node.op})" if node is not None else ""
        raise KilnError(f"values of dtype {dtype} are not supported in a CUDA int8 package{where}")
    return dtype


def lower_one(graph: Graph, node, consts):
    """One node as (PrimFunc, [argument value names], out shape, out dtype, {constant: array the
    rule made}); raises KilnError naming the node and op when the CUDA int8 lowering refuses it
    (a dtype a package cannot store, no rule, a rule that calls a C helper)."""
    k = KernelBuilder(graph, None, RULE_TARGET, consts)
    k.node = node
    phs, xs = {}, []
    try:
        for j, v in enumerate(node.inputs):
            t = graph.types[v]
            # distinct names: launches_of matches kernel arguments to parameters by name too
            ph = te.placeholder(t.shape or (1,), _storage(t.dtype, node), name=f"in{j}")
            phs[ph] = v
            xs.append(ph)
        y = lower_int8_node(k, node, xs)
    except (LoweringError, NotImplementedError) as e:
        raise KilnError(f"cuda: {e}") from None
    want = graph.types[node.name]
    if tuple(int(s) for s in y.shape) != (tuple(want.shape) or (1,)) or y.dtype != _storage(want.dtype, node):
        raise KilnError(f"cuda: node {node.name!r} ({node.op}) lowered to {y.dtype}{list(y.shape)}, "
                        f"the graph says {want}")
    made = {}
    for ph, arg in k.placeholders.items():
        if arg.kind == "const" and arg.name in k.extra_consts:
            phs[ph] = arg.name
            made[arg.name] = k.extra_consts[arg.name]
    used = _used_placeholders(y)
    missing = [p.op.name for p in used if p not in phs]
    if missing:
        raise KilnError(f"cuda: node {node.name!r}: lowering reads unknown tensors {missing}")
    func = te.create_prim_func(used + [y])
    if "call_extern" in str(func):
        raise KilnError(f"cuda: node {node.name!r} ({node.op}): its int8 rule calls a C helper of the C backend, "
                        f"which a GPU kernel cannot call: run this model with the C backend (kiln compile)")
    if node.op in SERIAL_OPS:
        func = func.with_attr(SCHEDULE, "Serial").with_attr(NO_NARROW, True)
    elif node.op in BLOCKWISE_OPS:
        func = func.with_attr(SCHEDULE, "Blockwise")
    return func, [phs[p] for p in used], tuple(int(s) for s in y.shape), str(y.dtype), made


def node_funcs(graph: Graph):
    """Lower every node: [(node, PrimFunc, [argument value names], out shape, out dtype)] and the
    constants the rules made {name: array}."""
    register_pending()
    consts = dict(graph.tensors())
    made, out = {}, []
    for node in graph.nodes:
        func, args, shape, dtype, m = lower_one(graph, node, consts)
        made.update(m)
        out.append((node, func, args, shape, dtype))
    return out, made


def node_refusal(graph: Graph, node) -> str | None:
    """Why the CUDA int8 lowering refuses ``node`` of a quantised graph (None: it lowers it), by
    lowering it (``kiln inspect``'s cuda column)."""
    if graph.states:
        return (f"cuda: graph {graph.name!r} is stateful (states {', '.join(graph.states)}); cuda cannot keep "
                f"state between runs")
    register_pending()
    try:
        lower_one(graph, node, dict(graph.tensors()))
    except KilnError as e:
        return str(e)
    return None


def op_takes(op, int16=False) -> bool:
    """Whether the CUDA lowering has a rule for quantised nodes of ``op`` (an OpDef) with int8
    activations (``int16``: 16x8 ones), as ``lower_int8_node`` dispatches: a CUDA rule (for
    16x8, the ones in ``CUDA_RULES_16X8``), else the C backend's integer rule (a C kernel with
    the op's integer reference; 16x8: the op's ``int16`` prop), else the TE compute of a
    data-movement op. A rule may still refuse a node (``node_refusal`` says why)."""
    register_pending()
    c_rule = BACKEND in op.lower
    if op.name in CUDA_RULES and (not int16 or op.name in CUDA_RULES_16X8):
        return True
    integer = op.int8_ref is not None and (not int16 or INT16 in op.props)
    return (c_rule and integer) or (SHAPE in op.props and (c_rule or op.te is not None))


def serial_schedule(func):
    """Every block of ``func`` in a kernel of its own, one thread walking its loops (for small
    per-row stages such as the int8 softmax's, whose rows hold a few elements)."""
    from tvm import s_tir
    sch = s_tir.Schedule(func)
    for b in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(b)
        sch.bind(sch.add_unit_loop(loops[0] if loops else b), "threadIdx.x")
    return sch.mod["main"]


def blockwise_schedule(func, max_threads=256):
    """Every block of ``func`` in a kernel of its own, in program order, nothing inlined: its
    spatial loops fused and split over blocks x ``max_threads`` threads, its reduction loops
    serial in each thread (DLight's Fallback rule without its inlining, which is what costs time
    on a long chain of blocks)."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        raise KilnError("blockwise schedule: the function's blocks are not all in normal form")
    reductions = []
    for info in infos:
        b, loops = info.block_rv, sch.get_loops(info.block_rv)
        kind = {k: [lp for lp, d in zip(loops, info.dom_kind()) if d == k] for k in "SRO"}
        s_loops = kind["S"] or [sch.add_unit_loop(b)]
        sch.reorder(*s_loops, *kind["R"], *kind["O"])
        bx, tx = sch.split(sch.fuse(*s_loops), factors=[None, max_threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        if kind["R"]:
            reductions.append((b, kind["R"][0]))
    for b, r in reductions:
        sch.decompose_reduction(b, r)
    return sch.mod["main"]


def to_relax(graph: Graph):
    """(Relax module whose ``main`` takes ``runtime_args`` and returns the graph outputs,
    runtime_args, the rules' constants)."""
    from tvm import relax
    funcs, made = node_funcs(graph)
    names = list(graph.inputs)
    for _, _, args, _, _ in funcs:
        names += [a for a in args if a not in names and a not in graph.inputs and
                  (a in made or a not in {n.name for n in graph.nodes})]
    types = {n: (list(made[n].shape) or [1], str(made[n].dtype)) if n in made else
             (list(graph.types[n].shape) or [1], _storage(graph.types[n].dtype)) for n in names}
    bb = relax.BlockBuilder()
    rvars = {n: relax.Var(_safe(n), relax.TensorType(types[n][0], types[n][1])) for n in names}
    with bb.function("main", [rvars[n] for n in names]):
        with bb.dataflow():
            for node, func, args, shape, dtype in funcs:
                gv = bb.add_func(func.with_attr("global_symbol", _safe(node.name)), _safe(node.name))
                rvars[node.name] = bb.emit(relax.call_tir(gv, relax.Tuple([rvars[a] for a in args]),
                                                          relax.TensorType(list(shape), dtype)),
                                           name_hint=_safe(node.name))
            for o in graph.outputs:
                if o not in rvars:
                    raise KilnError(f"cuda: output {o!r} is not computed by a node (a constant output)")
            gv = bb.emit_output(relax.Tuple([rvars[o] for o in graph.outputs]))
        bb.emit_func_output(gv)
    return bb.get(), names, types, made


def _safe(name):
    s = "".join(ch if ch.isalnum() else "_" for ch in name)
    return s if s and not s[0].isdigit() else "v_" + s
