"""Helium (MVE) kernels (backends/ops_mve.py, kiln_mve.h) bit-exact with the int8 reference: int8
conv2d, depthwise and average-pooling layers over a table of geometries (padding, strides, odd
pixel counts, C_out not a multiple of 4, reductions not a multiple of 16, channel counts with and
without the 16-channel depthwise path, 1x1 convs reading their input in place, activations), run on the host
(the portable C versions) and on the emulated Cortex-M55 (mps3-an547: the MVE versions); the
packing and the requantisation table; the portable requantisation against TFLite's
MultiplyByQuantizedMultiplier on its corner cases."""
import ctypes
import os
import subprocess

import numpy as np
import pytest

from kiln import hil
from kiln.backends import compile as compile_pkg
from kiln.backends import ops_mve
from kiln.frontend import Graph, TensorType, run
from kiln.frontend.fixedpoint import multiply_by_quantized_multiplier
from kiln.quantize import ptq
from tests.firmware.helpers import need_qemu

INCLUDE = os.path.join(os.path.dirname(__file__), "..", "..", "backends", "include")

# (name, input NHWC, layers: (kind, C_out or None, kernel, stride, padding, activation[, dilation]))
CASES = [
    ("conv_pad_stride", (1, 9, 7, 3), [("conv", 20, (3, 3), (2, 1), 1, "relu"), ("dw", None, (3, 3), (1, 1), 1, None),
                                       ("conv", 36, (1, 1), (1, 1), 0, None)]),
    ("dw16_pointwise", (1, 7, 5, 32), [("dw", None, (3, 3), (1, 1), 1, "relu6"), ("conv", 32, (1, 1), (1, 1), 0, "relu"),
                                       ("dw", None, (3, 3), (2, 2), 1, None), ("conv", 13, (1, 1), (1, 1), 0, None)]),
    ("kws_like", (1, 15, 6, 1), [("conv", 16, (5, 4), (2, 2), 2, "relu"), ("dw", None, (3, 3), (1, 1), 1, "relu"),
                                 ("conv", 16, (1, 1), (1, 1), 0, "relu")]),
    ("strided_1x1_odd", (1, 6, 5, 20), [("conv", 6, (1, 1), (2, 2), 0, None), ("dw", None, (5, 3), (1, 1), 2, None)]),
    ("dw8_dilated", (1, 11, 9, 24), [("dw", None, (3, 3), (1, 1), 2, "relu", (2, 2)), ("conv", 8, (3, 3), (1, 1), 1, None),
                                      ("dw", None, (3, 3), (2, 2), 1, "relu6")]),
    ("small_k", (1, 8, 6, 5), [("conv", 7, (1, 1), (1, 1), 0, None), ("conv", 9, (1, 2), (1, 1), 0, "relu"),
                               ("conv", 4, (3, 1), (2, 1), 1, None), ("conv", 16, (1, 1), (1, 1), 0, None)]),
    # reductions of at most 16 in groups of pixels: padded patches, strides, O % 4 != 0, 35 pixels
    ("grouped_k16", (1, 13, 9, 2), [("conv", 6, (2, 2), (2, 2), 1, "relu6"), ("conv", 16, (1, 1), (1, 1), 0, None),
                                    ("conv", 5, (1, 1), (1, 1), 0, "relu")]),
    ("dw8_pairs", (1, 7, 9, 8), [("dw", None, (3, 3), (1, 1), 1, "relu"), ("dw", None, (3, 3), (1, 1), 0, None),
                                 ("dw", None, (3, 2), (2, 1), 1, None), ("dw", None, (2, 3), (1, 1), 0, "relu6")]),
    ("avgpool", (1, 9, 7, 12), [("conv", 12, (1, 1), (1, 1), 0, None), ("pool", None, (3, 2), (2, 2), 1, None),
                                ("dw", None, (3, 3), (1, 1), 1, None), ("pool", None, (4, 3), (1, 1), 0, None)]),
]


def _graph(name, shape, layers, rng):
    g = Graph(name)
    g.add_input("x", TensorType(shape))
    prev, c = "x", shape[-1]
    for i, (kind, co, (kh, kw), stride, pad, act, *dilation) in enumerate(layers):
        if kind == "pool":
            g.add_node("avg_pool2d", [prev], {"pool": [kh, kw], "stride": list(stride), "padding": [pad] * 4},
                       name=f"l{i}")
            prev = f"l{i}"
            continue
        co = c if kind == "dw" else co
        w_shape = (co, kh, kw, 1 if kind == "dw" else c)
        g.add_param(f"w{i}", rng.standard_normal(w_shape).astype(np.float32))
        g.add_param(f"b{i}", rng.standard_normal(co).astype(np.float32))
        attrs = {"stride": list(stride), "padding": [pad, pad, pad, pad]}
        if kind == "dw":
            attrs["groups"] = c
        if dilation:
            attrs["dilation"] = list(dilation[0])
        if act:
            attrs["activation"] = act
        g.add_node("conv2d", [prev, f"w{i}", f"b{i}"], attrs, name=f"l{i}")
        prev, c = f"l{i}", co
    g.outputs.append(prev)
    return g.validate()


def _quantised(case, seed):
    name, shape, layers = case
    rng = np.random.default_rng(seed)
    q = ptq(_graph(name, shape, layers, rng), rng.standard_normal((16,) + shape[1:]).astype(np.float32),
            int8_io=True)
    xs = [rng.integers(-128, 128, shape).astype(np.int8) for _ in range(3)]
    return q, xs


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_mve_kernels_on_host_match_reference(case, tmp_path):
    q, xs = _quantised(case, 1)
    pkg = compile_pkg(q, target="cortex-m55", out_dir=tmp_path / "p", plot=False, measure_size=False)
    src = (tmp_path / "p" / "kernels.c").read_text()
    kinds = {k for k, *_ in case[2]}
    for kind, fn in (("conv", "kiln_mve_conv_"), ("dw", "kiln_mve_dw_s8"), ("pool", "kiln_mve_avgpool_s8")):
        assert (fn in src) == (kind in kinds)
    for x in xs:
        np.testing.assert_array_equal(pkg.run(x)[0], run(q, x)[0])


def test_other_cores_keep_their_kernels(tmp_path):
    q, _ = _quantised(CASES[0], 1)
    compile_pkg(q, target="cortex-m4", out_dir=tmp_path / "p", plot=False, measure_size=False)
    assert "kiln_mve_" not in (tmp_path / "p" / "kernels.c").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_mve_kernels_on_mps3_an547_match_reference(case, tmp_path):
    need_qemu()
    q, xs = _quantised(case, 2)
    img, pkg = hil.build_for_board(q, "mps3-an547", str(tmp_path / "b"))
    assert "kiln_mve_" in open(os.path.join(pkg, "kernels.c")).read()
    res = hil.run_on_board(img, pkg, xs)
    for x, got in zip(xs, res.outputs):
        np.testing.assert_array_equal(got[0] if isinstance(got, list) else got, run(q, x)[0])


def test_pack_gemm_layout():
    w = np.arange(6 * 20, dtype=np.int64).reshape(6, 20).astype(np.int8)
    p = ops_mve.pack_gemm(w)
    assert p.shape == (2, 2 * 64)
    for o in range(8):
        for k in range(32):
            want = w[o, k] if o < 6 and k < 20 else 0
            assert p[o // 4, (k // 16) * 64 + (o % 4) * 16 + k % 16] == want


def test_requant_table_layout():
    t = ops_mve.requant_table(np.array([5, -7, 9]), np.array([1 << 30, 3, 4]), np.array([-3, 2, 0]))
    np.testing.assert_array_equal(t.reshape(4, 4), [[5, -7, 9, 0], [1 << 30, 3, 4, 0], [0, 2, 0, 0], [-3, 0, 0, 0]])
    # a 16-channel depthwise block: vectors of channels {0,4,8,12}, {2,6,10,14}, {1,5,9,13}, {3,7,11,15}
    t = ops_mve.requant_table(np.arange(32), np.zeros(32), np.zeros(32), perm=16).reshape(8, 4, 4)
    np.testing.assert_array_equal(t[:4, 0], [[0, 4, 8, 12], [2, 6, 10, 14], [1, 5, 9, 13], [3, 7, 11, 15]])
    np.testing.assert_array_equal(t[4:, 0], 16 + t[:4, 0])
    # an 8-channel block: {0,2,4,6}, {1,3,5,7}
    t = ops_mve.requant_table(np.arange(16), np.zeros(16), np.zeros(16), perm=8).reshape(4, 4, 4)
    np.testing.assert_array_equal(t[:, 0], [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]])


WRAPPER = r"""
#include "kiln_mve.h"
void mbqm_many(const int32_t *acc, const int32_t *m, const int32_t *s, int32_t *out, int32_t n)
{
    for (int32_t i = 0; i < n; ++i) out[i] = kiln_mbqm(acc[i], m[i], s[i] > 0 ? s[i] : 0, s[i] < 0 ? s[i] : 0);
}
"""


def test_portable_requantisation_matches_tflite(tmp_path):
    src, so = tmp_path / "w.c", tmp_path / "w.so"
    src.write_text(WRAPPER)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-I", INCLUDE, "-o", str(so), str(src)],
                   check=True)
    lib = ctypes.CDLL(str(so))
    rng = np.random.default_rng(3)
    i32 = np.iinfo(np.int32)
    edge = np.array([i32.min, i32.min + 1, -1, 0, 1, i32.max, -(1 << 30), 1 << 30, -3, 3, -5, 5], np.int64)
    acc = np.concatenate([np.repeat(edge, 40), rng.integers(i32.min, i32.max, 4000, endpoint=True)])
    m = np.concatenate([np.tile([i32.min, i32.max, 1 << 30, 0, -(1 << 30)], 96), rng.integers(i32.min, i32.max, 4000)])
    s = np.concatenate([np.tile(np.arange(-31, 9), 12), rng.integers(-31, 8, 4000)])
    n = len(acc)
    acc, m, s = (np.ascontiguousarray(a[:n], np.int32) for a in (acc, m, s))
    out = np.zeros(n, np.int32)
    p = ctypes.POINTER(ctypes.c_int32)
    lib.mbqm_many(acc.ctypes.data_as(p), m.ctypes.data_as(p), s.ctypes.data_as(p), out.ctypes.data_as(p), n)
    want = multiply_by_quantized_multiplier(acc, m, s).astype(np.int64)
    np.testing.assert_array_equal(out, ((want + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32))


def test_group_inplace_shift_covers_own_reads_of_a_1x1_conv():
    G = {"N": 1, "H": 2, "W": 4, "C": 8, "O": 8, "oh": 2, "ow": 4, "sh": 1, "sw": 1, "pt": 0, "pl": 0}
    # pixel p reads bytes 8p..8p+7 while it writes its 8 outputs: the output must start a pixel below
    assert ops_mve.group_inplace_shift(G, True) == 8
    assert ops_mve.group_inplace_shift(G, False) == 0
    assert ops_mve.group_inplace_shift(G, True, group=4) == 32
