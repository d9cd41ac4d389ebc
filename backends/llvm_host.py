"""Host CPU backend: Kiln float graphs (inference and training-step graphs) compiled with TVM's
LLVM target and run with the Relax VM.

The steps (``build_module``; ``pipeline`` is the Relax pass sequence):
  to_relax        one ``emit_te`` per node with the TE rules of backends/tvm_te.py
  legalize+fuse   Relax LegalizeOps, AnnotateTIROpPattern, FuseOps, FuseTIR (epilogues fuse)
  schedule_cpu    a generic CPU schedule on every fused PrimFunc: inline producers/epilogues,
                  parallelise the outer spatial loops, vectorise the innermost loop when it is
                  contiguous and evenly divisible; reductions (conv, depthwise, conv gradients,
                  dense, matmul) get a register-tiled nest: packed weights, an unrolled block of
                  positions x a vector of output channels accumulated in registers
  lower+build     the Relax CPU lowering (static memory planning of intermediates) and
                  ``relax.build`` for ``llvm -mcpu=<host>``

Compiled modules are cached on disk (``$KILN_CACHE`` or ``~/.cache/kiln``) as shared libraries
keyed by a hash of the graph *structure* (types, nodes, folded scalar literals, target), never of
parameter values: retraining or loading new weights reuses the cache.

    cg = compile(graph)            # CompiledGraph
    outs = cg(x, params={...})     # list of np.ndarray, in graph.outputs order
"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from kiln.frontend.errors import GraphError, KilnError
from kiln.frontend.executor import prepare_feeds
from kiln.frontend.graph import Graph
from kiln.frontend.ops.nn import dropout_mask_values
from kiln.frontend.types import np_dtype

from . import tvm_te

SCHEDULE_VERSION = 7   # bump when the schedule changes: it is part of the cache key


def host_target(num_threads=None):
    import tvm
    from tvm.target import codegen
    d = {"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(), "fast-math-reassoc": True,
         "fast-math-contract": True}
    if num_threads:
        d["num-cores"] = int(num_threads)
    return tvm.target.Target(d)


def cache_dir():
    d = os.environ.get("KILN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    d = os.path.join(d, "host-llvm")
    os.makedirs(d, exist_ok=True)
    return d


# ---- schedule ---------------------------------------------------------------------------------
def _iter_kinds(sch, block):
    return [int(iv.iter_type) for iv in sch.get(block).iter_vars]   # 0 spatial, 2 reduction


def _try(f, *a, **k):
    try:
        return f(*a, **k)
    except Exception as e:   # a primitive that does not apply to this block: keep the block as it is
        if os.environ.get("KILN_SCHEDULE_DEBUG"):
            print(f"schedule: {getattr(f, '__name__', f)} skipped: {str(e).splitlines()[-1][:200]}")
        return None


def schedule_cpu_func(func, target):
    """Generic CPU schedule for one PrimFunc (any number of blocks)."""
    from tvm import s_tir
    sch = s_tir.Schedule(func)
    root = sch.get_sblock("root") if _has_root(sch) else None
    blocks = sch.get_child_blocks(root) if root is not None else []
    # 1. inline spatial producers (constant stages, pads, casts) and epilogues into their neighbours
    for b in list(blocks)[:-1]:
        if all(k == 0 for k in _iter_kinds(sch, b)):
            _try(sch.compute_inline, b)
    for b in reversed(list(sch.get_child_blocks(root))):
        if all(k == 0 for k in _iter_kinds(sch, b)) and len(sch.get_child_blocks(root)) > 1:
            _try(sch.reverse_compute_inline, b)
    vec = 16
    for b in sch.get_child_blocks(root):
        loops = sch.get_loops(b)
        kinds = _iter_kinds(sch, b)
        if len(loops) != len(kinds) or not loops:
            continue
        ns = sum(1 for k in kinds if k == 0)
        if any(k not in (0, 2) for k in kinds) or kinds[:ns] != [0] * ns:
            continue
        extents = [int(sch.get(lp).extent) for lp in loops]
        if ns == len(loops):
            # spatial: fuse everything, split off a vector lane, parallelise the rest
            fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
            total = int(np.prod(extents))
            if total >= 1024 and total % vec == 0:
                o, i = sch.split(fused, [None, vec])
                _try(sch.vectorize, i)
                sch.parallel(o)
            elif total >= 256:
                sch.parallel(fused)
            continue
        # reduction: first the register-tiled nest (_tiled_reduction); where it does not apply,
        # parallelise the outer spatial loops and move the innermost spatial loop (the channel,
        # contiguous in NHWC outputs) inside the reduction, vectorised
        if ns >= 2 and _try(_tiled_reduction, sch, b, loops, kinds, extents, vec) is not None:
            continue
        if ns == 1 and _try(_channel_reduction, sch, b, loops, extents, vec) is not None:
            continue
        if ns >= 2:
            outer = sch.fuse(*loops[:ns - 1]) if ns > 2 else loops[0]
            if int(np.prod(extents[:ns - 1])) >= 2:
                sch.parallel(outer)
            inner = loops[ns - 1]
            ext = extents[ns - 1]
            if 4 <= ext and (ext <= vec or ext % vec == 0) and _inner_contiguous(sch, b):
                if ext > vec:
                    _, inner = sch.split(inner, [None, vec])
                _try(_vector_reduction, sch, b, inner, loops[ns:])
        elif ns == 1 and extents[0] >= 64:
            sch.parallel(loops[0])
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _out_dim_vars(sch, block):
    """For each spatial iterator of the block: the dimension of the output it indexes (or None)."""
    blk = sch.get(block)
    if len(blk.writes) != 1:
        return None
    region = blk.writes[0].region
    iv = [v for v in blk.iter_vars if int(v.iter_type) == 0]
    out = []
    for v in iv:
        d = [j for j, r in enumerate(region) if hasattr(r.min, "name") and r.min.same_as(v.var)]
        out.append(d[0] if d else None)
    return out


def _tiled_reduction(sch, block, loops, kinds, extents, vec):
    """Register-tiled reduction (conv2d, depthwise, conv2d_grad_input/_weight, dense, matmul):
    a vector axis ``v`` (output channel: whole vectors of ``vec`` lanes, or its whole extent when
    4..vec) and a register-block axis ``u`` (up to 8 positions, unrolled) sit inside the
    reduction; the ``u x v`` accumulators live in a local buffer (registers) that is written back
    once. Operands whose ``v`` dimension is not the innermost one (OHWI weights of conv2d/
    depthwise, dense weights) are packed first so the vector loads are contiguous."""
    ns = sum(1 for k in kinds if k == 0)
    dims = _out_dim_vars(sch, block)
    if dims is None or len(dims) != ns:
        return None
    ndim = len(sch.get(block).writes[0].region)
    # vector axis: prefer the spatial iterator of the last output dimension, else the largest
    # iterator that is a multiple of vec
    cand = [j for j in range(ns) if dims[j] == ndim - 1]
    def ok(e):
        return e % vec == 0 or 4 <= e <= vec
    vi = cand[0] if cand and ok(extents[cand[0]]) else None
    if vi is None:
        mult = [j for j in range(ns) if extents[j] % vec == 0]
        if not mult:
            return None
        vi = max(mult, key=lambda j: extents[j])
    # register-block axis: the spatial iterator before v (or after it) with the best factor
    best = None
    for j in range(ns):
        if j == vi or extents[j] < 2:
            continue
        e = extents[j]
        f = next((c for c in (8, 6, 4, 5, 7, 3, 2) if e % c == 0), None)
        if f is None:
            continue
        score = (f, j)   # larger factor first, then the inner-most iterator
        if best is None or score > best[0]:
            best = (score, j, f)
    lanes = vec if extents[vi] % vec == 0 else extents[vi]
    # pack operands whose v-dimension is not innermost (weights, a few KB)
    ivs = sch.get(block).iter_vars
    rank = [(ivs[j].var, 0) for j in range(ns) if j not in (vi, best and best[1])]
    rank += [(ivs[ns + j].var, 1 + j) for j in range(len(kinds) - ns)]
    rank += ([(ivs[best[1]].var, 98)] if best else []) + [(ivs[vi].var, 99)]
    _pack_operands(sch, block, rank)
    loops = sch.get_loops(block)
    spatial, red = list(loops[:ns]), list(loops[ns:])
    if extents[vi] > lanes:
        v_o, v_i = sch.split(spatial[vi], [None, lanes])
    else:
        v_o, v_i = None, spatial[vi]
    if best is not None:
        _, ui, f = best
        if f == extents[ui]:
            u_o, u_i = None, spatial[ui]
        else:
            u_o, u_i = sch.split(spatial[ui], [None, f])
    else:
        ui, u_o, u_i = None, None, None
    rest = [spatial[j] for j in range(ns) if j not in (vi, ui)]
    tile = [lp for lp in (u_o, v_o) if lp is not None]
    order = rest + tile + red + [lp for lp in (u_i, v_i) if lp is not None]
    sch.reorder(*order)
    anchor = (tile or rest or [None])[-1]
    if rest:
        outer = sch.fuse(*rest) if len(rest) > 1 else rest[0]
        if int(np.prod([extents[j] for j in range(ns) if j not in (vi, ui)])) >= 2:
            sch.parallel(outer)
        if anchor is None or not tile:
            anchor = outer
    if anchor is None:
        return None
    sch.vectorize(v_i)
    if u_i is not None:
        sch.unroll(u_i)
    cw = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(cw, anchor)
    init = sch.decompose_reduction(block, red[0])
    for blk in (init, cw):
        _try(sch.vectorize, sch.get_loops(blk)[-1])
    return True


def _channel_reduction(sch, block, loops, extents, vec):
    """Per-channel reduction over the other axes of an NHWC tensor (BatchNorm statistics and
    their gradients, bias gradients): the channel loop goes innermost, vectorised, with the
    accumulators in a local buffer. Only when every operand that the channel indexes has it as
    its innermost (contiguous) dimension."""
    e = extents[0]
    if not (e % vec == 0 or 4 <= e <= vec) or len(loops) < 2:
        return None
    v = sch.get(block).iter_vars[0].var
    for r in sch.get(block).reads:
        reg = r.region
        uses = [j for j, x in enumerate(reg) if hasattr(x.min, "name") and x.min.same_as(v)]
        if uses and uses != [len(reg) - 1]:
            return None
    lanes = vec if e % vec == 0 else e
    sl, red = loops[0], list(loops[1:])
    v_o, v_i = sch.split(sl, [None, lanes]) if e > lanes else (None, sl)
    sch.reorder(*([v_o] if v_o is not None else []), *red, v_i)
    sch.vectorize(v_i)
    cw = sch.cache_write(block, 0, "local")
    if v_o is not None:
        sch.reverse_compute_at(cw, v_o)
    init = sch.decompose_reduction(block, red[0])
    for blk in (init, cw):
        _try(sch.vectorize, sch.get_loops(blk)[-1])
    return True


def _pack_operands(sch, block, rank):
    """cache_read + transform_layout: an operand indexed only by plain iterators (a weight) is
    copied into the loop order of the tiled nest (``rank``: iterator -> loop depth), so the
    innermost vector loads are contiguous and successive reduction steps read adjacent memory."""
    from tvm.tirx import IndexMap
    blk = sch.get(block)
    for idx, r in enumerate(list(blk.reads)):
        reg = r.region
        if len(reg) < 2:
            continue
        key = []
        for x in reg:
            hit = [rk for var, rk in rank if hasattr(x.min, "name") and x.min.same_as(var)]
            if not hit:
                break
            key.append(hit[0])
        if len(key) != len(reg) or key == sorted(key):
            continue
        buf = getattr(r, "buffer", None) or r.source
        if int(np.prod([int(e) for e in buf.shape])) > (1 << 18):
            continue
        perm = sorted(range(len(reg)), key=lambda j: key[j])
        cb = sch.cache_read(block, idx, "global")
        sch.transform_layout(cb, ("write", 0), IndexMap.from_func(_permuter(perm), ndim=len(reg)))
        blk = sch.get(block)


def _permuter(perm):
    return lambda *i: [i[j] for j in perm]


def _inner_contiguous(sch, block):
    """The block's output is indexed by its last spatial iterator in the last dimension."""
    blk = sch.get(block)
    if len(blk.writes) != 1:
        return False
    region = blk.writes[0].region
    iv = [v for v in blk.iter_vars if int(v.iter_type) == 0]
    if not iv or not region:
        return False
    last = region[-1].min
    return hasattr(last, "name") and last.same_as(iv[-1].var)


def _vector_reduction(sch, block, inner, rloops):
    sch.reorder(*rloops, inner)
    sch.vectorize(inner)
    init = _try(sch.decompose_reduction, block, rloops[0])
    if init is not None:
        _try(sch.vectorize, sch.get_loops(init)[-1])


def _has_root(sch):
    try:
        sch.get_sblock("root")
        return True
    except Exception:
        return False


def schedule_cpu_pass(target):
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="KilnScheduleCPU")
    def _pass(mod, _ctx):
        updates = {}
        for gv, f in mod.functions.items():
            if isinstance(f, tvm.tirx.PrimFunc) and not (f.attrs and f.attrs.get("tirx.is_scheduled")):
                try:
                    updates[gv] = schedule_cpu_func(f, target)
                except Exception:   # an unusual PrimFunc: leave it unscheduled (correct, slower)
                    pass
        for gv, f in updates.items():
            mod[gv] = f
        return mod
    return _pass


def pipeline(target):
    """The host pipeline as a Relax pass: CPU legalisation + fusion, our schedule, CPU lowering."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    @tvm.transform.module_pass(opt_level=0, name="KilnHostPipeline")
    def _pipeline(mod, _ctx):
        with target:
            seq = tvm.transform.Sequential(cpu.library_dispatch_passes(target) + cpu.legalize_passes(target)
                                           + [relax.transform.DeadCodeElimination(), schedule_cpu_pass(target)]
                                           + cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target))
            return seq(mod)
    return _pipeline



# ---- compile / run ----------------------------------------------------------------------------
class CompiledGraph:
    """A graph compiled for the host CPU: the ``host-llvm`` backend's package (kept in memory;
    ``path`` is the cached shared library). ``cg(*inputs, params=None, feeds=None)`` (or
    ``cg.run``) returns the outputs as NumPy arrays; ``params`` overrides parameters or
    (non-folded) constants by name."""
    backend = "host-llvm"
    manifest = None

    def __init__(self, graph: Graph, lib_path: str, with_updates=False, num_threads=None, build_seconds=0.0,
                 cached=False):
        import tvm
        from tvm import relax
        self.graph = graph
        self.compiled_graph, self.masks = tvm_te.externalize_dropout(graph)
        self.lib_path = lib_path
        self.with_updates = with_updates
        self.build_seconds = build_seconds
        self.cached = cached
        self.arg_names = tvm_te.runtime_args(self.compiled_graph)
        self.folded = tvm_te.folded_consts(graph)
        self.dev = tvm.cpu()
        self._lib = tvm.runtime.load_module(lib_path)
        self.vm = relax.VirtualMachine(self._lib, self.dev)
        self._main = self.vm["main"]
        self._tensors = {}
        self._set_tensors(graph.tensors())
        if num_threads:
            set_num_threads(num_threads)

    def _to_dev(self, name, value):
        import tvm
        t = self.compiled_graph.types[name]
        v = np.asarray(value, dtype=np_dtype(t.dtype))
        if not v.flags.c_contiguous:
            v = v.copy(order="C")
        if v.shape != t.shape:
            raise GraphError(f"{name!r}: expected shape {t.shape}, got {v.shape}")
        return tvm.runtime.tensor(v, self.dev)

    def _set_tensors(self, tensors):
        for k, v in tensors.items():
            if k in self.folded:
                if not np.array_equal(np.asarray(v), np.asarray(self.folded[k])):
                    raise KilnError(f"constant {k!r} was folded into the compiled module as "
                                    f"{np.asarray(self.folded[k]).ravel()[0]!r}; recompile the graph with the new value")
                continue
            self._tensors[k] = self._to_dev(k, v)

    def set_params(self, params):
        """Upload new parameter/constant values (kept for later calls)."""
        unknown = set(params) - set(self.graph.params) - set(self.graph.consts)
        if unknown:
            raise GraphError(f"graph {self.graph.name!r} has no parameter or constant {sorted(unknown)}")
        self._set_tensors(params)

    def run_tvm(self, *inputs, feeds=None, params=None):
        """Like ``__call__`` but returns TVM tensors (no copy back)."""
        if params:
            self.set_params(params)
        env = prepare_feeds(self.graph, inputs, feeds)
        if self.masks:
            env.update(dropout_mask_values(self.masks, env))
        args = [self._to_dev(n, env[n]) if n in env else self._tensors[n] for n in self.arg_names]
        return self._main(*args)

    def __call__(self, *inputs, feeds=None, params=None):
        res = self.run_tvm(*inputs, feeds=feeds, params=params)
        return [r.numpy() for r in res]

    run = __call__

    @property
    def path(self):
        return self.lib_path

    def run_updates(self, *inputs, **kw):
        """(outputs, {buffer: new value}) for graphs compiled with ``with_updates=True``."""
        if not self.with_updates:
            raise KilnError("compile(graph, with_updates=True) to get buffer updates")
        res = self(*inputs, **kw)
        n = len(self.graph.outputs)
        return res[:n], dict(zip(self.graph.updates, res[n:]))

    def __repr__(self):
        return f"<CompiledGraph {self.graph.name!r} host-llvm {os.path.basename(self.lib_path)}>"


def set_num_threads(n):
    """Threads of TVM's CPU thread pool (like torch.set_num_threads)."""
    import tvm
    os.environ["TVM_NUM_THREADS"] = str(int(n))
    f = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
    if f is not None:
        f(-1, int(n))   # -1: big cores first, as many as asked


def build_module(graph: Graph, target=None, with_updates=False):
    """Build the Relax executable (no cache)."""
    from tvm import relax
    target = target or host_target()
    graph, _ = tvm_te.externalize_dropout(graph)
    mod = tvm_te.to_relax(graph, with_updates=with_updates)
    return relax.build(mod, target=target, relax_pipeline=pipeline(target))


def compile(graph: Graph, *, cache=True, with_updates=False, num_threads=None, target=None) -> CompiledGraph:
    """Compile a float Kiln graph for the host CPU. Raises NotImplementedError naming the node
    and op when an op has no TE definition."""
    graph.validate()
    tvm_te.check_lowerable(tvm_te.externalize_dropout(graph)[0], "host-llvm")
    target = target or host_target()
    key = tvm_te.graph_signature(graph, extra={"target": str(target), "schedule": SCHEDULE_VERSION,
                                               "updates": with_updates})
    path = os.path.join(cache_dir(), f"{_stem(graph.name)}-{key}.so")
    if cache and os.path.exists(path):
        return CompiledGraph(graph, path, with_updates, num_threads, 0.0, cached=True)
    t0 = time.time()
    ex = build_module(graph, target, with_updates)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    ex.export_library(tmp)
    if cache:
        os.replace(tmp, path)   # atomic: concurrent compiles of one graph never see half a file
    else:
        path = tmp
    return CompiledGraph(graph, path, with_updates, num_threads, time.time() - t0, cached=False)


def _stem(name):
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:40] or "graph"
