"""The int8 LSTM's gate activations in C (``kiln_logistic16`` / ``kiln_tanh16``, kiln_intrinsics.h:
gemmlowp's int16 fixed-point logistic and tanh) equal the NumPy reference
(frontend/ops/recurrent_int16.py) on every int16 input, for every integer-bit count the int8 LSTM
uses (the gates: 3; the cell's tanh: 15 + log2 of the cell scale, -6 .. 6 for the scales
2^-21 .. 2^-9 Kiln accepts), compiled with -O2 and -Os."""
import ctypes
import os
import subprocess

import numpy as np
import pytest

from kiln.frontend.ops.recurrent_int16 import logistic16, tanh16

INCLUDE = os.path.join(os.path.dirname(__file__), "..", "..", "backends", "include")
WRAPPER = r"""
#include "kiln_intrinsics.h"
void act_all(int32_t kind, int32_t ib, int16_t *out)
{
    for (int32_t a = -32768; a < 32768; ++a)
        out[a + 32768] = (int16_t)(kind ? kiln_tanh16(a, ib) : kiln_logistic16(a, ib));
}
"""


@pytest.fixture(scope="module", params=["-O2", "-Os"])
def lib(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("gates")
    src, so = d / "w.c", d / "w.so"
    src.write_text(WRAPPER)
    subprocess.run(["gcc", request.param, "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I", INCLUDE,
                    "-o", str(so), str(src)], check=True)
    return ctypes.CDLL(str(so))


ALL = np.arange(-32768, 32768, dtype=np.int64)


@pytest.mark.parametrize("kind,ib", [(0, 3)] + [(1, ib) for ib in range(-6, 7)] + [(0, ib) for ib in (0, 1, 2, 4, 5, 6)])
def test_gate_activation_every_input(lib, kind, ib):
    out = np.empty(65536, np.int16)
    lib.act_all(ctypes.c_int32(kind), ctypes.c_int32(ib), out.ctypes.data_as(ctypes.POINTER(ctypes.c_int16)))
    want = (tanh16 if kind else logistic16)(ALL, ib)
    bad = np.flatnonzero(out.astype(np.int64) != want)
    assert bad.size == 0, f"{bad.size} inputs differ, e.g. a = {ALL[bad[0]]}: C {out[bad[0]]}, reference {want[bad[0]]}"
