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

import os

import numpy as np

from kiln.frontend.errors import KilnError

from .cuda_plan import expand_inputs, from_storage, load_manifest, storage_bytes


class CudaUnavailable(KilnError):
    """No usable CUDA device/toolchain for this package."""


class CudaLaunchError(KilnError):
    pass


def _arch_cc(arch):
    try:
        return int(arch.split("_")[1])
    except (IndexError, ValueError):
        raise KilnError(f"bad CUDA arch {arch!r} (expected e.g. 'sm_90')") from None


def probe(arch="sm_90"):
    """(cupy module, device compute capability as int) or raise CudaUnavailable describing what
    was found."""
    try:
        import cupy
    except ImportError as e:
        raise CudaUnavailable(f"the CUDA runner needs CuPy (pip install cupy-cuda12x); import failed: {e}. "
                              f"Package generation (kiln.backends.cuda.compile) works without it.") from None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:   # noqa: BLE001 - CuPy raises several driver/runtime error types
        raise CudaUnavailable(f"CuPy {cupy.__version__} found but no usable CUDA device/driver: "
                              f"{type(e).__name__}: {e}") from None
    if n == 0:
        raise CudaUnavailable(f"CuPy {cupy.__version__} found but 0 CUDA devices")
    dev = cupy.cuda.Device()
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
    def __init__(self, pkg, nvrtc_options=("--std=c++17",), device=None):
        self.pkg = pkg
        self.m = load_manifest(pkg)
        cupy, self.cc = probe(self.m.arch)
        self.cp = cupy
        if device is not None:
            cupy.cuda.Device(device).use()
        with open(os.path.join(pkg, self.m.sources[0])) as f:
            src = f.read()
        try:
            self.module = cupy.RawModule(code=src, options=tuple(nvrtc_options), backend="nvrtc")
            self.kernels = {k: self.module.get_function(k) for k in self.m.kernels}
        except Exception as e:   # noqa: BLE001
            raise KilnError(f"{pkg}: NVRTC could not compile {self.m.sources[0]} for compute capability "
                            f"{self.cc}: {type(e).__name__}: {str(e)[:2000]}") from None
        self.arena = self._alloc(self.m.arena_bytes, "arena")
        self.weights = self._alloc(max(self.m.weights_bytes, 1), "weights blob")
        blob = np.fromfile(os.path.join(pkg, self.m.weights_file), np.uint8)
        if blob.size:
            self.weights[:blob.size].set(blob)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.graph = None
        self._plan = [(self.kernels[L.kernel], L, tuple(self._arg(a) for a in L.args))
                      for st in self.m.steps for L in st.launches]

    def _alloc(self, nbytes, what):
        cp = self.cp
        try:
            return cp.zeros(nbytes, cp.uint8)
        except cp.cuda.memory.OutOfMemoryError:
            free, total = cp.cuda.runtime.memGetInfo()
            raise KilnError(f"{self.pkg}: out of GPU memory allocating the {what}: asked {nbytes} bytes, "
                            f"{free} of {total} bytes free") from None

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
            self.weights[w.offset:w.offset + w.bytes].set(storage_bytes(v, w.dtype, w.shape))

    def _launch_all(self):
        for k, L, args in self._plan:
            try:
                k(tuple(L.grid), tuple(L.block), args, shared_mem=L.shared_bytes, stream=self.stream)
            except Exception as e:   # noqa: BLE001
                raise CudaLaunchError(f"launch of kernel {L.kernel} failed (grid {L.grid}, block {L.block}, "
                                      f"dynamic shared memory {L.shared_bytes} B, {len(args)} args): "
                                      f"{type(e).__name__}: {e}") from None

    def capture(self):
        """Record the whole launch sequence as one CUDA graph; later calls replay it."""
        with self.stream:
            self.stream.begin_capture()
            try:
                self._launch_all()
            finally:
                self.graph = self.stream.end_capture()
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


def run_package(pkg, inputs, capture=False):
    """Convenience: compile, upload, run once; returns the outputs."""
    r = CudaRunner(pkg)
    if capture:
        r.capture()
    return r(*inputs)
