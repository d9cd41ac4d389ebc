"""Dense weights shared by several int8 layers (the time steps of an unrolled RNN: one weight
matrix, each step with its own input zero point and bias): the C backend packs them once with
zero biases, each layer passes its own folded biases (``kiln_fc_mv_s8_b``), and the package
stays bit-exact with the int8 reference on the host and on QEMU (SMLAD assembly on the M4, the
portable C on the M3)."""
import os
import re
import shutil

import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.frontend import Graph, QParams, TensorType, run, save
from tests.backends.fc_kernel_util import fc_case
from tests.backends.test_kernel_dedup import gru


def _shared_weights_graph(rng):
    """Five dense layers (K = N = 22: a column tail and a reduction tail), each with its own input
    zero point, scales and bias: d0 and d1 read one weight constant, d2 and d3 a copy of it
    (equal bytes, another name), d4 weights of its own."""
    g = Graph("shared_dense")
    K = 22
    g.add_input("x", TensorType((1, K), "int8", QParams((0.05,), (3,))))
    src, qin = "x", QParams((0.05,), (3,))
    w_shared = None
    for i in range(5):
        w, b, (tx, tw, tb), ty, attrs = fc_case(rng, 1, K, K, i % 2 == 0, "relu" if i == 2 else "none", qin=qin)
        if i < 4:
            w_shared = w if w_shared is None else w_shared
            w = w_shared
        name = "w0" if i < 2 else ("w2" if i < 4 else "w4")
        if name not in g.consts:
            g.add_const(name, w, tw.quant)
        g.add_const(f"b{i}", b, tb.quant)
        g.add_node("dense", [src, name, f"b{i}"], attrs, name=f"d{i}", out_type=ty)
        src, qin = f"d{i}", ty.quant
    g.outputs = [src]
    return g


def _weight_arrays(pkg_dir):
    return re.findall(r"static const int8_t (c_\w*w_dense\w*)\[", open(os.path.join(pkg_dir, "model.c")).read())


def test_shared_weights_stored_once_bit_exact_on_host(tmp_path):
    rng = np.random.default_rng(5)
    g = _shared_weights_graph(rng)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path / "p", plot=False, measure_size=False)
    kernels = open(tmp_path / "p" / "kernels.c").read()
    assert kernels.count("kiln_fc_mv_s8_b(") == 4 and kernels.count("kiln_fc_mv_s8(") == 1   # d4: its own weights
    assert len(_weight_arrays(tmp_path / "p")) == 2           # d0-d3 share one stream, d4 has its own
    for _ in range(4):
        x = rng.integers(-128, 128, (1, 22)).astype(np.int8)
        np.testing.assert_array_equal(pkg.run(x)[0], run(g, x)[0])


def test_int8_gru_steps_share_their_weight_streams(tmp_path):
    q = gru(17, int8=True)
    pkg = compile_pkg(q, target="host", out_dir=tmp_path / "q", plot=False, measure_size=False)
    # one input-to-hidden and one hidden-to-hidden stream for the 17 steps (before: one per step)
    assert len(_weight_arrays(tmp_path / "q")) == 2
    rng = np.random.default_rng(6)
    for _ in range(3):
        x = rng.integers(-128, 128, (1, 17, 3)).astype(np.int8)
        np.testing.assert_array_equal(pkg.run(x)[0], run(q, x)[0])


@pytest.mark.parametrize("board", ["mps2-an386", "mps2-an385"])
def test_shared_weights_on_qemu(board, tmp_path):
    if not shutil.which("arm-none-eabi-gcc") or not shutil.which("qemu-system-arm"):
        pytest.skip("arm-none-eabi-gcc / qemu-system-arm not installed (bash scripts/setup.sh)")
    from kiln import hil
    rng = np.random.default_rng(7)
    model = save(_shared_weights_graph(rng), str(tmp_path / "shared.json"))
    img, pkg = hil.build_for_board(model, board, str(tmp_path / "b"))
    assert "kiln_fc_mv_s8_b(" in open(os.path.join(pkg, "kernels.c")).read()
    assert len(_weight_arrays(pkg)) == 2
    g = hil.package_graph(pkg)
    samples = [rng.integers(-128, 128, (1, 22)).astype(np.int8) for _ in range(3)]
    res = hil.run_on_board(img, pkg, samples)
    want = hil.reference_outputs(g, samples)
    assert all(hil.same_outputs(a, b) for a, b in zip(res.outputs, want))
