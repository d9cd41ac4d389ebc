"""nn.GRU exported as the graph the TFLite converter writes for a Keras GRU of static length (TFLite
has no fused GRU): per step one FULLY_CONNECTED of the input and one of the state (3H-stacked
kernels, gates z, r, n), each SPLIT in three, then ADD, LOGISTIC, MUL, SUB, TANH; one CONCATENATION
of the steps. Float:
LiteRT agrees with Kiln to float32 rounding; int8 (``ptq``): LiteRT's reference kernels, Kiln's
reference, the re-imported file, the host C package and (slow) the mps2-an386 firmware agree
element for element."""
from pathlib import Path

import numpy as np
import pytest
import tflite

import kiln.frontend as kf
from kiln.backends import compile as compile_pkg
from kiln.frontend import functional as F
from kiln.frontend import run
from kiln.frontend.tflite_import import load_tflite, opcode_name
from kiln.quantize import ptq
from kiln.quantize.tflite_export import export_tflite
from tests.quantize.litert_util import assert_same, litert_run


@pytest.fixture(autouse=True, scope="module")
def _keep_layer_rng():
    """These tests seed the layer generator; later tests' random layers stay as they would be."""
    from kiln.frontend import module
    saved, count = module._rng, module.Dropout._count
    yield
    module._rng, module.Dropout._count = saved, count


def gru_model(n, t, i, h, seed=0, head=False):
    kf.manual_seed(seed)
    gru = kf.GRU(i, h)
    lin = kf.Linear(h, 3)
    if head:      # a classifier on the last step
        return kf.trace(lambda x: lin(F.reshape(F.slice(gru(x), [0, t - 1, 0], [n, t, h]), [n, h])), (n, t, i))
    return kf.trace(gru, (n, t, i))


def ops_of(model: bytes):
    m = tflite.Model.GetRootAsModel(model, 0)
    sg = m.Subgraphs(0)
    return [opcode_name(m.OperatorCodes(sg.Operators(k).OpcodeIndex())) for k in range(sg.OperatorsLength())]


def int8_gru(n, t, i, h, seed=0, head=False):
    g = gru_model(n, t, i, h, seed, head)
    cal = np.random.default_rng(seed + 1).standard_normal((32, t, i)).astype(np.float32)
    return ptq(g, cal, int8_io=True)


@pytest.mark.parametrize("n,t,i,h", [(1, 4, 3, 5), (2, 6, 4, 3), (3, 1, 2, 8)])
def test_float_gru_exports_as_unrolled_builtins(n, t, i, h):
    g = gru_model(n, t, i, h)
    model = export_tflite(g)
    ops = ops_of(model)
    assert set(ops) <= {"SPLIT", "RESHAPE", "FULLY_CONNECTED", "LOGISTIC", "TANH", "MUL", "ADD", "SUB",
                        "CONCATENATION"}, ops
    assert ops.count("TANH") == t and ops.count("LOGISTIC") == 2 * t and ops.count("SUB") == t
    assert ops.count("FULLY_CONNECTED") == 2 * t - 1            # the zero state's product is its bias
    assert ops.count("SPLIT") == 2 * t + (t > 1)                # gates (the bias at step 0), the time steps
    step = ["FULLY_CONNECTED", "SPLIT", "FULLY_CONNECTED", "SPLIT", "ADD", "LOGISTIC", "MUL", "SUB", "ADD",
            "LOGISTIC", "MUL", "ADD", "TANH", "MUL", "ADD"]            # the converter's order for a Keras GRU
    if t > 1:
        at = ops.index("FULLY_CONNECTED", ops.index("TANH"))
        assert ops[at:at + len(step)] == step, ops
    x = np.random.default_rng(2).standard_normal((n, t, i)).astype(np.float32)
    want = litert_run(model, [x])[0]
    np.testing.assert_allclose(run(g, x)[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run(load_tflite(model), x)[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n,t,i,h,head", [(1, 4, 3, 5, False), (2, 6, 4, 3, True), (3, 1, 2, 8, False)])
def test_int8_gru_round_trip_bit_exact(n, t, i, h, head, tmp_path):
    q = int8_gru(n, t, i, h, head=head)
    model = export_tflite(q)
    back = load_tflite(model)
    pkg = compile_pkg(q, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = rng.integers(-128, 128, (n, t, i)).astype(np.int8)
        want = litert_run(model, [x])[0]
        assert_same(run(q, x)[0], want, "reference")
        assert_same(run(back, x)[0], want, "re-imported")
        assert_same(pkg.run(x)[0], want, "host C")


@pytest.mark.slow
@pytest.mark.qemu
def test_int8_gru_on_board(tmp_path):
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    path = tmp_path / "gru_int8.tflite"
    path.write_bytes(export_tflite(int8_gru(1, 5, 3, 6, head=True)))
    rng = np.random.default_rng(7)
    gold = str(tmp_path / "g.npz")
    golden(str(path), gold, [[rng.integers(-128, 128, (1, 5, 3)).astype(np.int8)] for _ in range(2)])
    rep = verify(str(path), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 2, rep["results"]


KERAS = Path(__file__).resolve().parents[1] / "data" / "converter_rnn"


def _keras_gru(which):
    w = np.load(KERAS / f"keras_gru_{which}_weights.npz")
    return kf.GRU(3, 4).load_keras([w["kernel"], w["recurrent_kernel"], w["bias"]])


def _steps(ops):
    """The compute operators (the converter slices the recurrent product three times where Kiln
    SPLITs it, UNPACKs the time steps where Kiln SPLITs and RESHAPEs)."""
    return [o for o in ops if o not in ("STRIDED_SLICE", "SPLIT", "RESHAPE", "UNPACK", "PACK", "CONCATENATION")]


def test_export_is_the_converters_graph_for_a_keras_gru():
    """The TFLite converter's file for a Keras GRU (unroll=True, tests/data/converter_rnn): Kiln's GRU
    with the layer's weights exports the same per-step operators, and LiteRT computes the same
    outputs from both files."""
    conv = (KERAS / "keras_gru_unrolled.tflite").read_bytes()
    g = kf.trace(_keras_gru("unrolled"), (1, 5, 3))
    ours = export_tflite(g)

    assert _steps(ops_of(ours)) == _steps(ops_of(conv))
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.standard_normal((1, 5, 3)).astype(np.float32)
        want = litert_run(conv, [x])[0]
        np.testing.assert_allclose(litert_run(ours, [x])[0], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(run(g, x)[0], want, rtol=1e-5, atol=1e-6)


def test_load_keras_checks_the_layout():
    with pytest.raises(kf.KilnError, match="reset_after=True"):
        kf.GRU(3, 4).load_keras([np.zeros((3, 12)), np.zeros((4, 12)), np.zeros(12)])


def test_converters_int8_keras_gru(tmp_path):
    """The converter's full-integer file for the same Keras GRU: Kiln imports it bit-exact with
    LiteRT (reference and host C), and Kiln's own PTQ of the layer gives the same compute
    operators."""
    conv = (KERAS / "keras_gru_unrolled_int8.tflite").read_bytes()
    g = load_tflite(conv)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    rng = np.random.default_rng(6)
    for _ in range(4):
        x = rng.integers(-128, 128, (1, 5, 3)).astype(np.int8)
        want = litert_run(conv, [x])[0]
        assert_same(run(g, x)[0], want, "reference")
        assert_same(pkg.run(x)[0], want, "host C")
    cal = np.random.default_rng(0).standard_normal((32, 5, 3)).astype(np.float32)
    ours = ops_of(export_tflite(ptq(kf.trace(_keras_gru("unrolled"), (1, 5, 3)), cal, int8_io=True)))
    # Kiln's PTQ requantises each step's state to the final CONCATENATION's scale; the converter
    # gives every step's state its PACK's one scale
    assert ours.count("QUANTIZE") == 5
    assert [o for o in _steps(ours) if o != "QUANTIZE"] == _steps(ops_of(conv))
