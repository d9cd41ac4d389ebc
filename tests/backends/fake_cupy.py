"""A stand-in for CuPy that records what backends/cuda_runner.py asks of it (no GPU here): which
stream every copy, fill and launch goes on, the selected device, stream capture. Device memory is
NumPy memory; kernels do not run (a launch is recorded, or raises when told to)."""
import contextlib
import types

import numpy as np

LEGACY = "legacy"


class Memory:
    def __init__(self, arr, base=None):
        self.arr, self.base = arr, base

    @property
    def ptr(self):
        return self.arr.ctypes.data


class Array:
    def __init__(self, cp, arr):
        self.cp, self.a = cp, arr

    @property
    def data(self):
        return Memory(self.a)

    @property
    def size(self):
        return self.a.size

    def __getitem__(self, k):
        return Array(self.cp, self.a[k])

    def __eq__(self, v):
        return Array(self.cp, self.a == v)

    def all(self):
        return bool(self.a.all())

    def set(self, x, stream=None):
        self.cp.log.append(("set", stream.name if stream else self.cp.current_stream()))
        self.a[...] = np.asarray(x).reshape(self.a.shape)

    def get(self, stream=None):
        self.cp.log.append(("get", stream.name if stream else self.cp.current_stream()))
        return self.a.copy()


def make(devices=(90,), fail_launch=None):
    """A fake ``cupy`` module with devices of the given compute capabilities (current: device 0);
    ``fail_launch(kernel, capturing)`` -> True makes that launch raise."""
    cp = types.SimpleNamespace(__version__="fake", log=[], uint8=np.uint8, uint64=np.uint64, stack=[],
                               current=[0], capturing=[False])
    cp.current_stream = lambda: cp.stack[-1].name if cp.stack else LEGACY

    class Stream:
        n = 0

        def __init__(self, non_blocking=False):
            Stream.n += 1
            self.name = f"stream{Stream.n}" + ("-nb" if non_blocking else "")

        def __enter__(self):
            cp.stack.append(self)
            return self

        def __exit__(self, *a):
            cp.stack.pop()

        def synchronize(self):
            cp.log.append(("sync", self.name))

        def begin_capture(self):
            cp.capturing[0] = True
            cp.log.append(("begin_capture", self.name))

        def end_capture(self):
            cp.capturing[0] = False
            cp.log.append(("end_capture", self.name))
            return types.SimpleNamespace(launch=lambda s: cp.log.append(("graph", s.name)))

    class Device:
        def __init__(self, i=None):
            self.id = cp.current[0] if i is None else i
            self.compute_capability = str(devices[self.id])

        def use(self):
            cp.current[0] = self.id
            cp.log.append(("use", self.id))

    def full(n, v, dtype):
        cp.log.append(("full", cp.current_stream(), v))
        return Array(cp, np.full(n, v, dtype))

    class RawModule:
        def __init__(self, code, options, backend):
            cp.log.append(("nvrtc", tuple(options)))
            cp.options = options

        def get_function(self, name):
            def launch(grid, block, args, shared_mem=0, stream=None):
                if fail_launch and fail_launch(name, cp.capturing[0]):
                    raise RuntimeError(f"launch of {name} failed")
                cp.log.append(("launch", name, stream.name if stream else cp.current_stream()))
            return launch

    class OutOfMemoryError(Exception):
        pass

    cp.full, cp.zeros = full, (lambda n, dtype: full(n, 0, dtype))
    cp.RawModule = RawModule
    cp.cuda = types.SimpleNamespace(
        Stream=Stream, Device=Device, memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
        runtime=types.SimpleNamespace(getDeviceCount=lambda: len(devices),
                                      getDeviceProperties=lambda i: {"name": f"fake sm_{devices[i]}".encode()},
                                      memGetInfo=lambda: (0, 0)))
    cp.null = contextlib.nullcontext
    return cp
