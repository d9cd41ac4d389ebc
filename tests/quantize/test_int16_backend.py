"""16x8 (int16 activation) models through the C backend, bit-exact with Kiln's int16 reference on
the host and on an emulated board; TFLite Micro's seanet int16 integration models (input and
golden output from TFLM) imported, run on the reference and on the host.

tests/data/seanet16 holds four of TFLM's seanet models (conv, add, pad; Apache-2.0, from
github.com/tensorflow/tflite-micro tensorflow/lite/micro/integration_tests/seanet) with their data;
set KILN_SEANET_DIR to a checkout's seanet folder to run all of them."""
import dataclasses
import glob
import os
import shutil

import numpy as np
import pytest

from kiln.backends import compile as compile_pkg
from kiln.backends import cpus
from kiln.frontend import run, save
from kiln.frontend.tflite_import import load_tflite

from .int16_graphs import elementwise_graph, i16, linear_graph

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "seanet16")


def _check_host(g, pkg, feeds_fn, trials=3):
    for _ in range(trials):
        feeds = feeds_fn()
        want, got = run(g, *feeds), pkg.run(*feeds)
        got = got if isinstance(got, (list, tuple)) else [got]
        for name, w, gt in zip(g.outputs, want, got):
            assert gt.dtype == w.dtype, name
            np.testing.assert_array_equal(gt, w, err_msg=name)


@pytest.mark.parametrize("target", ["host", "cortex-m3-plain"])
def test_int16_kernels_bit_exact_on_host(target, tmp_path):
    t = dataclasses.replace(cpus.get("cortex-m3"), kernels=False) if target.endswith("plain") else target
    rng = np.random.default_rng(3)
    g = linear_graph(rng)
    pkg = compile_pkg(g, target=t, out_dir=tmp_path / "lin", plot=False, measure_size=False)
    _check_host(g, pkg, lambda: [i16(rng, (1, 6, 5, 4))])
    g2 = elementwise_graph()
    pkg2 = compile_pkg(g2, target=t, out_dir=tmp_path / "ew", plot=False, measure_size=False)
    _check_host(g2, pkg2, lambda: [i16(rng, (2, 3, 20)), i16(rng, (2, 1, 20))])


def _seanet_models(root):
    return sorted(glob.glob(os.path.join(root, "*.tflite")) + glob.glob(os.path.join(root, "*", "*.tflite")))


def _seanet_io(path):
    base = path[:-len(".tflite")]
    if os.path.exists(base + ".npz"):
        z = np.load(base + ".npz")
        return [z[k] for k in sorted(z.files) if k.startswith("in_")], z["golden"]
    ins = sorted(glob.glob(base + "_input*_int16.csv"))
    gold = glob.glob(base + "_golden_int16.csv")[0]
    return ([np.loadtxt(f, delimiter=",", dtype=np.int64).astype(np.int16) for f in ins],
            np.loadtxt(gold, delimiter=",", dtype=np.int64).astype(np.int16))


def test_seanet_models_match_tflm_golden_on_reference_and_host(tmp_path):
    models = _seanet_models(DATA)
    assert len(models) == 4
    for path in models:
        g = load_tflite(path)
        ins, golden = _seanet_io(path)
        feeds = [x.reshape(g.types[v].shape) for x, v in zip(ins, g.inputs)]
        ref = run(g, *feeds)[0]
        np.testing.assert_array_equal(ref.ravel(), golden.ravel(), err_msg=f"{path} reference")
        pkg = compile_pkg(g, target="host", out_dir=tmp_path / os.path.basename(path), plot=False,
                          measure_size=False)
        got = pkg.run(*feeds)
        np.testing.assert_array_equal(np.asarray(got).ravel(), golden.ravel(), err_msg=f"{path} host C")


@pytest.mark.skipif(not os.environ.get("KILN_SEANET_DIR"), reason="KILN_SEANET_DIR (TFLM's seanet folder) not set")
def test_all_seanet_models_in_kilns_ops(tmp_path):
    """Every seanet model whose ops Kiln imports: reference and host C equal TFLM's golden output."""
    from kiln.frontend.tflite_verify import TFLiteImportError
    done = 0
    for path in _seanet_models(os.environ["KILN_SEANET_DIR"]):
        try:
            g = load_tflite(path)
        except TFLiteImportError as e:
            if "unsupported TFLite op" in str(e) or "int32" in str(e):
                continue        # ops other work adds (SUB, LEAKY_RELU, ...) and int32 QUANTIZE
            raise
        ins, golden = _seanet_io(path)
        feeds = [x.reshape(g.types[v].shape) for x, v in zip(ins, g.inputs)]
        np.testing.assert_array_equal(run(g, *feeds)[0].ravel(), golden.ravel(), err_msg=path)
        pkg = compile_pkg(g, target="host", out_dir=tmp_path / str(done), plot=False, measure_size=False)
        np.testing.assert_array_equal(np.asarray(pkg.run(*feeds)).ravel(), golden.ravel(), err_msg=path)
        done += 1
    assert done >= 58


@pytest.mark.qemu
@pytest.mark.slow
def test_int16_model_on_mps2_an386(tmp_path):
    """The two 16x8 graphs and a seanet conv on QEMU mps2-an386 (Cortex-M4): firmware output equals
    the int16 reference bit for bit."""
    if not shutil.which("arm-none-eabi-gcc") or not shutil.which("qemu-system-arm"):
        pytest.skip("arm-none-eabi-gcc / qemu-system-arm not installed (bash scripts/setup.sh)")
    from kiln import hil
    rng = np.random.default_rng(5)
    cases = [(save(linear_graph(rng), str(tmp_path / "lin.json")), lambda: i16(rng, (1, 6, 5, 4))),
             (save(elementwise_graph(), str(tmp_path / "ew.json")),
              lambda: [i16(rng, (2, 3, 20)), i16(rng, (2, 1, 20))]),
             (os.path.join(DATA, "conv3.tflite"), None)]
    for k, (model, sample) in enumerate(cases):
        img, pkg = hil.build_for_board(model, "mps2-an386", str(tmp_path / f"b{k}"))
        g = hil.package_graph(pkg)
        if sample is None:
            ins, golden = _seanet_io(model)
            samples = [ins[0].reshape(g.types[g.inputs[0]].shape)]
        else:
            samples = [sample() for _ in range(2)]
        res = hil.run_on_board(img, pkg, samples)
        want = hil.reference_outputs(g, samples)
        assert all(hil.same_outputs(a, b) for a, b in zip(res.outputs, want)), model
        if sample is None:
            np.testing.assert_array_equal(np.asarray(res.outputs[0]).ravel(), golden.ravel())


def test_int16_dense_accumulator_bound_is_refused(tmp_path):
    from kiln.backends.lower import LoweringError
    from kiln.frontend import Graph, TensorType

    from .int16_graphs import q
    g = Graph("wide_fc")
    g.add_input("x", TensorType((1, 600), "int16", q(1e-3)))
    g.add_const("w", np.full((4, 600), 127, np.int8), q(0.01))
    g.add_node("dense", ["x", "w"], {"activation": "none"}, name="y", out_type=TensorType((1, 4), "int16", q(1.0)))
    g.outputs = ["y"]
    with pytest.raises(LoweringError, match=r"16x8 dense: the accumulator may reach \d+ \(K = 600\)"):
        compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
