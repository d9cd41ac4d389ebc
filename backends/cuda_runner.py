"""Run a Kiln CUDA package (backends/cuda.py) on a GPU without TVM: CuPy compiles kernels.cu with
NVRTC (``RawModule``), one device arena holds inputs/activations/outputs/temporaries at the
manifest's offsets, the weights blob is uploaded once, and the launch plan runs in order (or as
one captured CUDA graph).

    r = CudaRunner("pkg/")          # compiles, allocates, uploads
    outs = r(x)                     # list of np.ndarray (float32 for float packages)
    r.capture()                     # record the launch sequence as one CUDA graph
    outs = r(x)                     # now replays the graph

CuPy is imported lazily; without CuPy, without a GPU, or on a GPU older than the package's
architecture, ``CudaRunner`` raises :class:`CudaUnavailable` saying what it found.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil

import numpy as np

from kiln.frontend.errors import KilnError

from . import nvrtc
from .cuda_plan import expand_inputs, from_storage, guard_bytes, load_manifest, storage_bytes


class CudaUnavailable(KilnError):
    """No usable CUDA device/toolchain for this package."""


class CudaLaunchError(KilnError):
    pass


def _cuda_version(include):
    """CUDA version (e.g. 13000) of the headers in folder ``include``, or None."""
    for h in ("cuda_runtime_api.h", "cuda.h"):
        try:
            with open(os.path.join(include, h), errors="replace") as f:
                m = re.search(r"#define\s+(?:CUDART_VERSION|CUDA_VERSION)\s+(\d+)", f.read())
        except OSError:
            continue
        if m:
            return int(m.group(1))
    return None


def _candidate_includes():
    """Header folders of the pip nvidia-* packages (CUDA 12: nvidia/cuda_runtime, nvidia/cuda_cccl;
    CUDA 13: nvidia/cu13) and of system toolkits ($CUDA_HOME, $CUDA_PATH, the toolkit holding nvcc
    on PATH, /usr/local/cuda), in that order."""
    dirs = []
    spec = importlib.util.find_spec("nvidia")
    for root in (list(spec.submodule_search_locations or []) if spec else []):
        dirs += [os.path.join(root, n, "include") for n in ("cuda_runtime", "cuda_cccl", "cu13", "cu12")]
    nvcc = shutil.which("nvcc")
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
             os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None, "/usr/local/cuda"]
    dirs += [os.path.join(h, "include") for h in homes if h]
    dirs += sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True)
    return [d for d in dict.fromkeys(os.path.realpath(d) for d in dirs) if os.path.isdir(d)]


def include_dirs(nvrtc_major=None):
    """-I folders for NVRTC: where cuda_fp16.h/cuda_bf16.h and libcu++ (cuda/std/...; CUDA 13 keeps
    it in include/cccl) are, from the pip nvidia-* packages or a system CUDA toolkit. With
    ``nvrtc_major`` (the NVRTC that CuPy uses), headers of another CUDA major version are left out
    unless no folder of that version has cuda_fp16.h."""
    found = []
    for d in _candidate_includes():
        major = _major(d)
        for sub in (d, os.path.join(d, "cccl")):
            if os.path.exists(os.path.join(sub, "cuda_fp16.h")) or os.path.isdir(os.path.join(sub, "cuda", "std")):
                found.append((sub, major))
    if nvrtc_major is not None:
        same = [(d, v) for d, v in found if v in (None, nvrtc_major)]
        if any(os.path.exists(os.path.join(d, "cuda_fp16.h")) for d, _ in same):
            found = same
    return [d for d, _ in found]


def _major(include):
    """CUDA major version of header folder ``include``: its own, or for CUDA 12's separate pip cccl
    package that of the nvidia/cuda_runtime beside it; None when unknown."""
    v = _cuda_version(include) or _cuda_version(os.path.join(os.path.dirname(os.path.dirname(include)),
                                                             "cuda_runtime", "include"))
    return v // 1000 if v else None


def _nvrtc_major(cupy):
    try:
        return int(cupy.cuda.nvrtc.getVersion()[0])
    except Exception:   # noqa: BLE001 - an old CuPy, or NVRTC missing: CuPy's compile error says so
        return None


def _arch_cc(arch):
    try:
        return int(arch.split("_")[1])
    except (IndexError, ValueError):
        raise KilnError(f"bad CUDA arch {arch!r} (expected e.g. 'sm_90')") from None


def probe(arch="sm_90", device=None):
    """(cupy module, compute capability as int of ``device``, default the current one) or raise
    CudaUnavailable describing what was found. The device is selected before it is checked."""
    try:
        import cupy
    except ImportError as e:
        raise CudaUnavailable(f"the CUDA runner needs CuPy (pip install cupy-cuda12x, and pip install -e .[cuda] "
                              f"for NVRTC's headers); import failed: {e}. Package generation "
                              f"(kiln.backends.cuda.compile) works without it.") from None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:   # noqa: BLE001 - CuPy raises several driver/runtime error types
        raise CudaUnavailable(f"CuPy {cupy.__version__} found but no usable CUDA device/driver: "
                              f"{type(e).__name__}: {e}") from None
    if n == 0:
        raise CudaUnavailable(f"CuPy {cupy.__version__} found but 0 CUDA devices")
    if device is not None and not 0 <= int(device) < n:
        raise CudaUnavailable(f"device {device} asked for, but CuPy sees {n} CUDA device(s) (0..{n - 1})")
    dev = cupy.cuda.Device(device) if device is not None else cupy.cuda.Device()
    dev.use()
    cc = int(dev.compute_capability)
    want = _arch_cc(arch)
    if cc < want:
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props.get("name", b"?")
        name = name.decode() if isinstance(name, bytes) else name
        raise CudaUnavailable(f"package built for {arch} (compute capability {want // 10}.{want % 10}) but device "
                              f"{dev.id} ({name}) has compute capability {cc // 10}.{cc % 10}; rebuild with "
                              f"kiln.backends.cuda.compile(..., arch='sm_{cc}')")
    return cupy, cc


class CudaRunner:
    """Every copy, fill and launch goes on one non-blocking stream (``self.stream``), so uploads
    and kernels are ordered. The arena is poisoned (every byte 0xFF: NaN in float32, float16 and
    bfloat16) and sits between two guard zones, as does the weights blob: kernels whose padding
    halo is read before its bounds check (DLight's conv tiles) stay inside the allocation."""

    def __init__(self, pkg, nvrtc_options=None, device=None):
        self.pkg = pkg
        self.m = load_manifest(pkg)
        cupy, self.cc = probe(self.m.arch, device)
        self.cp = cupy
        with open(os.path.join(pkg, self.m.sources[0])) as f:
            src = f.read()
        opts = tuple(nvrtc.options(includes=include_dirs(_nvrtc_major(cupy))) if nvrtc_options is None
                     else nvrtc_options)
        try:
            self.module = cupy.RawModule(code=src, options=opts, backend="nvrtc")
            self.kernels = {k: self.module.get_function(k) for k in self.m.kernels}
        except Exception as e:   # noqa: BLE001
            raise KilnError(f"{pkg}: NVRTC could not compile {self.m.sources[0]} for compute capability "
                            f"{self.cc}: {type(e).__name__}: {nvrtc.error_lines(str(e))}") from None
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.guard = guard_bytes(self.m)
        self._arena_raw = self._alloc(self.m.arena_bytes, "arena", 0xFF)
        self._weights_raw = self._alloc(max(self.m.weights_bytes, 1), "weights blob", 0)
        self.arena = self._arena_raw[self.guard:self.guard + self.m.arena_bytes]
        self.weights = self._weights_raw[self.guard:self.guard + max(self.m.weights_bytes, 1)]
        blob = np.fromfile(os.path.join(pkg, self.m.weights_file), np.uint8)
        if blob.size:
            self.weights[:blob.size].set(blob, stream=self.stream)
        self.stream.synchronize()
        self.graph = None
        self._plan = [(self.kernels[L.kernel], L, tuple(self._arg(a) for a in L.args))
                      for st in self.m.steps for L in st.launches]

    def _alloc(self, nbytes, what, fill):
        """``nbytes`` between two guard zones, filled with ``fill`` on the runner's stream."""
        cp = self.cp
        try:
            with self.stream:
                return cp.full(nbytes + 2 * self.guard, fill, cp.uint8)
        except cp.cuda.memory.OutOfMemoryError:
            free, total = cp.cuda.runtime.memGetInfo()
            raise KilnError(f"{self.pkg}: out of GPU memory allocating the {what}: asked {nbytes} bytes "
                            f"(+ {2 * self.guard} of guard zones), {free} of {total} bytes free") from None

    def guards_clean(self):
        """True when nothing wrote into the guard zones around the arena and the weights."""
        g = self.guard
        zones = [(self._arena_raw, 0xFF), (self._weights_raw, 0)]
        with self.stream:
            ok = [bool((r[:g] == v).all()) and bool((r[r.size - g:] == v).all()) for r, v in zones]
        return all(ok)

    def _arg(self, a):
        cp = self.cp
        if a.scalar is not None:
            return getattr(np, a.dtype)(a.scalar) if hasattr(np, a.dtype) else np.int32(a.scalar)
        base = self.arena if a.space == "arena" else self.weights
        return cp.uint64(base.data.ptr + a.offset)

    @property
    def weight_names(self):
        return {w.name for w in self.m.weights}

    def set_params(self, params):
        """Upload new weights by name (e.g. after a training step)."""
        by = {w.name: w for w in self.m.weights}
        for k, v in params.items():
            if k not in by:
                raise KilnError(f"package has no weight {k!r}")
            w = by[k]
            self.weights[w.offset:w.offset + w.bytes].set(storage_bytes(v, w.dtype, w.shape), stream=self.stream)

    def _launch_all(self):
        for k, L, args in self._plan:
            try:
                k(tuple(L.grid), tuple(L.block), args, shared_mem=L.shared_bytes, stream=self.stream)
            except Exception as e:   # noqa: BLE001
                raise CudaLaunchError(f"launch of kernel {L.kernel} failed (grid {L.grid}, block {L.block}, "
                                      f"dynamic shared memory {L.shared_bytes} B, {len(args)} args): "
                                      f"{type(e).__name__}: {e}") from None

    def capture(self):
        """Record the whole launch sequence as one CUDA graph; later calls replay it. One plain
        run first (module loading and lazy initialisation must not happen during capture); a
        capture that fails leaves no graph, and calls go on launching kernel by kernel."""
        self.graph = None
        self._launch_all()
        self.stream.synchronize()
        with self.stream:
            self.stream.begin_capture()
            try:
                self._launch_all()
            except BaseException:
                try:
                    self.stream.end_capture()
                except Exception:   # noqa: BLE001 - the launch error is the one to report
                    pass
                raise
            graph = self.stream.end_capture()
        self.graph = graph
        return self

    def upload(self, inputs):
        for spec, x in zip(self.m.inputs, expand_inputs(self.m, inputs)):
            x = np.asarray(x)
            if tuple(x.shape) != tuple(spec.shape):
                raise KilnError(f"input {spec.name!r}: expected shape {spec.shape}, got {list(x.shape)}")
            self.arena[spec.offset:spec.offset + spec.bytes].set(storage_bytes(x, spec.dtype), stream=self.stream)

    def run_device(self):
        if self.graph is not None:
            self.graph.launch(self.stream)
        else:
            self._launch_all()

    def download(self, which="outputs"):
        outs = []
        for o in getattr(self.m, which):
            src = self.arena if o.space == "arena" else self.weights
            raw = src[o.offset:o.offset + o.bytes].get(stream=self.stream)
            self.stream.synchronize()
            outs.append(np.array(from_storage(raw.tobytes(), o.dtype, o.shape)))
        return outs

    def __call__(self, *inputs):
        self.upload(inputs)
        self.run_device()
        try:
            self.stream.synchronize()
        except Exception as e:   # noqa: BLE001
            raise CudaLaunchError(f"{self.pkg}: a kernel failed while running the plan "
                                  f"({len(self._plan)} launches; run without capture() and with "
                                  f"CUDA_LAUNCH_BLOCKING=1 to name it): {type(e).__name__}: {e}") from None
        return self.download()

    def run_updates(self, *inputs):
        outs = self(*inputs)
        return outs, dict(zip([u.name for u in self.m.updates], self.download("updates")))

    def time_ms(self, *inputs, iters=100, warmup=10):
        """Median device time of one run (CUDA events), inputs uploaded once."""
        cp = self.cp
        self.upload(inputs)
        for _ in range(warmup):
            self.run_device()
        ts = []
        for _ in range(iters):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(self.stream)
            self.run_device()
            b.record(self.stream)
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b))
        return float(np.median(ts))


def scaled_errors(names, got, want, gradients=()):
    """{name: max |got - want| / scale} (want: a float64 reference). The scale is the value's own
    max |want|, or for a name in ``gradients`` the largest |want| over all of them: a bias in front
    of a train-mode BatchNorm has an exact gradient of 0, which any float32 computation returns as
    rounding noise, 100% off relative to itself and ~1e-8 relative to the step's gradients."""
    want = [np.asarray(w, np.float64) for w in want]
    grads = set(gradients)
    gscale = max((float(np.abs(w).max(initial=0)) for n, w in zip(names, want) if n in grads), default=0.0)
    out = {}
    for name, g, w in zip(names, got, want):
        scale = gscale if name in grads else float(np.abs(w).max(initial=0))
        diff = float(np.abs(np.asarray(g, np.float64) - w).max(initial=0))
        out[name] = diff / max(scale, float(np.finfo(np.float32).tiny)) if np.isfinite(diff) else float("inf")
    return out


def run_package(pkg, inputs, capture=False):
    """Convenience: compile, upload, run once; returns the outputs."""
    r = CudaRunner(pkg)
    if capture:
        r.capture()
    return r(*inputs)
