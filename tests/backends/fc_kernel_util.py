"""Shared by the FULLY_CONNECTED kernel tests (test_dense_kernel.py: ``kiln_fc_mv_s8``;
test_ops_mve_fc_add_mul.py: ``kiln_mve_fc_s8``): a C wrapper built as a shared library, pointers
for ctypes, random dense layers, and requantisation cases at and around halves."""
import ctypes
import os
import subprocess

import numpy as np

from kiln.frontend import QParams, TensorType

INCLUDE = os.path.join(os.path.dirname(__file__), "..", "..", "backends", "include")


def c_library(tmp_path_factory, name, source):
    """``source`` (C including the kernel headers) compiled with -Werror into a loaded library."""
    d = tmp_path_factory.mktemp(name)
    src, so = d / "w.c", d / "w.so"
    src.write_text(source)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I", INCLUDE, "-o", str(so),
                    str(src)], check=True)
    return ctypes.CDLL(str(so))


def ptr(a, t=ctypes.c_int32):
    return np.ascontiguousarray(a).ctypes.data_as(ctypes.POINTER(t))


def lim(q):
    """The fast requantisation's contract: the exact value, or one beyond int8 with the same sign
    (its exact path stops at +-2^16, where every output clamps alike)."""
    return np.clip(q, -(1 << 16), 1 << 16)


def near_halves(rng, n):
    """(acc, eff): eff = (k + 1/2) / |acc| and the doubles one and two units away (products on,
    just under and just over a half, where the fast path must hand over to kiln_fc_rq), eff < 0.49."""
    acc = rng.integers(1, 60_000, n) * rng.choice([-1, 1], n)
    eff0 = (rng.integers(0, 200, acc.size) + 0.5) / np.abs(acc)
    accs, effs = [], []
    for d in (-2, -1, 0, 1, 2):
        e = eff0.copy()
        for _ in range(abs(d)):
            e = np.nextafter(e, np.inf if d > 0 else 0)
        ok = e < 0.49
        accs.append(acc[ok]), effs.append(e[ok])
    return np.concatenate(accs), np.concatenate(effs)


def fc_case(rng, rows, K, N, per_channel, act, big_eff=False, qin=None):
    """A random int8 dense layer: (w, bias, (input, weight, bias types), output type, attrs);
    ``qin``: the input's quantisation; ``big_eff``: multipliers 1.2 to 1.5 (no fast path)."""
    zx, zy = (int(v) for v in rng.integers(-128, 128, 2))
    s_in, s_out = (float(np.float32(v)) for v in rng.uniform(0.005, 0.2, 2))
    if qin is not None:
        s_in, zx = float(qin.scale[0]), int(qin.zero_point[0])
    if big_eff:
        s_out = float(np.float32(s_in * 0.05 / 1.5))
    wlo = 0.04 if big_eff else 0.001
    ws = tuple(float(np.float32(v)) for v in (rng.uniform(wlo, 0.05, N) if per_channel else
                                                  [rng.uniform(wlo, 0.05)]))
    tw = TensorType((N, K), "int8", QParams(ws, (0,) * len(ws), 0 if per_channel else None))
    tx = TensorType((rows, K), "int8", QParams((s_in,), (zx,)))
    ty = TensorType((rows, N), "int8", QParams((s_out,), (zy,)))
    tb = TensorType((N,), "int32", QParams(tuple(s_in * s for s in ws), (0,) * len(ws), 0 if per_channel else None))
    w = rng.integers(-127, 128, (N, K)).astype(np.int8)
    b = rng.integers(-20_000, 20_000, N).astype(np.int32)
    return w, b, (tx, tw, tb), ty, {"activation": act}
