"""16x8 FULLY_CONNECTED whose accumulator can pass int32 (long inputs, large int64 biases): the C
kernel accumulates in int64 as LiteRT does and requantises with round(double(acc) * eff)
(backends/ops_nn._fc_rq_double); equal to LiteRT's BUILTIN_REF, Kiln's reference, host C and the
firmware on mps2-an386. Below the bound the int32 kernel stays."""

import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.frontend import Graph, TensorType, run, save
from kiln.quantize.tflite_export import export_tflite
from tests.firmware.helpers import need_qemu
from tests.quantize.litert_util import assert_same, litert_run, q

LIMIT = 2 ** 31 - 515 * 127 * 32768          # the bias that puts K = 515, |w| = 127 at 2**31


def dense16(K, N, w, b, s_in, s_w, s_out, act="none"):
    g = Graph(f"dense16_k{K}")
    g.add_input("x", TensorType((2, K), "int16", q(s_in)))
    g.add_const("w", np.asarray(w, np.int8).reshape(N, K), q(s_w))
    names = ["x", "w"]
    if b is not None:
        g.add_const("b", np.asarray(b, np.int64), q(float(np.float32(s_in) * np.float32(s_w))))
        names.append("b")
    g.add_node("dense", names, {"activation": act}, name="y", out_type=TensorType((2, N), "int16", q(s_out)))
    g.outputs = ["y"]
    return g


def cases():
    rng = np.random.default_rng(11)
    speech_w = rng.integers(-127, 128, (3, 3920))
    return {
        # just below the old bound (int32 kernel) and at it (int64): extreme weights and inputs
        "k515_int32": (dense16(515, 2, np.full((2, 515), 127), [LIMIT - 1, -(LIMIT - 1)], 2.0 ** -10, 2.0 ** -3,
                               2.0 ** -5), "int32"),
        "k515_int64": (dense16(515, 2, np.full((2, 515), 127), [LIMIT, -LIMIT], 2.0 ** -10, 2.0 ** -3, 2.0 ** -5),
                       "int64"),
        # the refused case of old (K = 600), eff = 2**-8 exactly: many products end in .5
        "k600_ties": (dense16(600, 4, np.full((4, 600), 127) * np.array([[1], [-1], [1], [-1]]), None, 2.0 ** -10,
                              2.0 ** -3, 2.0 ** -5), "int64"),
        # micro_speech_lstm's dense shape (3920 -> 3), float scales, int64 biases past int32, relu
        "k3920": (dense16(3920, 3, speech_w, [1 << 40, -(1 << 35), 123456789], 3.1e-5, 4.7e-3, 2.9e-2, "relu"),
                  "int64"),
    }


def feeds(rng, K):
    return [np.concatenate([np.full((1, K), -32768), rng.integers(-32768, 32768, (1, K))]).astype(np.int16),
            rng.integers(-32768, 32768, (2, K)).astype(np.int16), np.full((2, K), 32767, np.int16)]


@pytest.mark.parametrize("name", list(cases()))
def test_dense_16x8_long_inputs_on_host_c(name, tmp_path):
    g, acc_type = cases()[name]
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    kernels = (tmp_path / "kernels.c").read_text()
    assert ("kiln_fc_s8" in kernels) == (acc_type == "int32"), "int64 accumulator and double requantisation"
    model = export_tflite(g)
    rng = np.random.default_rng(len(name))
    for x in feeds(rng, g.types["x"].shape[1]):
        want = litert_run(model, [x])[0]
        assert_same(run(g, x)[0], want, f"{name} reference")
        assert_same(pkg.run(x)[0], want, f"{name} host C")


@pytest.mark.qemu
@pytest.mark.slow
def test_dense_16x8_long_inputs_on_mps2_an386(tmp_path):
    """The int64 path on the Cortex-M4 (no double FPU: libgcc's soft double) = reference."""
    need_qemu()
    from kiln import hil
    rng = np.random.default_rng(5)
    for name in ("k600_ties", "k3920"):
        g = cases()[name][0]
        img, pkg = hil.build_for_board(save(g, str(tmp_path / f"{name}.json")), "mps2-an386", str(tmp_path / name))
        samples = feeds(rng, g.types["x"].shape[1])
        res = hil.run_on_board(img, pkg, samples)
        want = [litert_run(export_tflite(g), [x])[0] for x in samples]
        assert all(hil.same_outputs(a, b) for a, b in zip(res.outputs, want)), name
