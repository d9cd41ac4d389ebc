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
from kiln.frontend.ops import elementwise_int16
from kiln.frontend.tflite_import import load_tflite

from .int16_graphs import elementwise_graph, i16, linear_graph
from .litert_util import litert_run

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


def _csv(f):
    return np.loadtxt(f, delimiter=",", dtype=np.int64).astype(np.int32 if f.endswith("_int32.csv") else np.int16)


def _seanet_io(path):
    base = path[:-len(".tflite")]
    if os.path.exists(base + ".npz"):
        z = np.load(base + ".npz")
        return [z[k] for k in sorted(z.files) if k.startswith("in_")], z["golden"]
    ins = sorted(glob.glob(base + "_input*.csv"))
    return [_csv(f) for f in ins], _csv(glob.glob(base + "_golden_*.csv")[0])


def _family(path):
    return os.path.basename(path)[:-len(".tflite")].rstrip("0123456789")


def _sub_as_litert(g, feeds):
    """The reference with SUB's int16 multipliers formed as LiteRT forms them (double), the one
    documented place where TFLite Micro's arithmetic, which Kiln follows, differs from LiteRT's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(elementwise_int16, "sub16_params", elementwise_int16.sub16_params_litert)
        return run(g, *feeds)[0]


def _check_seanet(paths, tmp_path):
    """Each model on LiteRT (BUILTIN_REF), Kiln's reference and host C. Host C always equals the
    reference; a model passes when the reference also equals the golden output and LiteRT's. A
    model that does not pass must be the documented TFLite Micro / LiteRT difference (int16 SUB's
    multipliers): returns ({family: [models, passed]}, [paths that differ that way])."""
    stats, tflm_differs = {}, []
    for k, path in enumerate(paths):
        g = load_tflite(path)
        ins, golden = _seanet_io(path)
        feeds = [x.reshape(g.types[v].shape) for x, v in zip(ins, g.inputs)]
        with open(path, "rb") as f:
            lite = litert_run(f.read(), feeds)[0]
        np.testing.assert_array_equal(lite.ravel(), golden.ravel(), err_msg=f"{path}: LiteRT vs golden")
        ref = run(g, *feeds)[0]
        pkg = compile_pkg(g, target="host", out_dir=tmp_path / str(k), plot=False, measure_size=False)
        np.testing.assert_array_equal(np.asarray(pkg.run(*feeds)).ravel(), ref.ravel(), err_msg=f"{path}: host C")
        fam = stats.setdefault(_family(path), [0, 0])
        fam[0] += 1
        if np.array_equal(ref.ravel(), golden.ravel()):
            fam[1] += 1
            continue
        assert any(n.op == "sub" for n in g.nodes), f"{path}: Kiln's reference differs from the golden output"
        np.testing.assert_array_equal(_sub_as_litert(g, feeds).ravel(), golden.ravel(), err_msg=path)
        tflm_differs.append(os.path.basename(path))
    return stats, tflm_differs


def test_seanet_models_match_tflm_golden_on_reference_and_host(tmp_path):
    """One or two models per op family, so CI covers each (KILN_SEANET_DIR runs them all)."""
    models = _seanet_models(DATA)
    stats, tflm_differs = _check_seanet(models, tmp_path)
    assert sorted(stats) == ["add", "conv", "leaky_relu", "pad", "quantize", "strided_slice", "sub", "transpose_conv"]
    assert tflm_differs == ["sub1.tflite"]       # TFLM's float32 multipliers round one element differently
    assert sum(p for _, p in stats.values()) == len(models) - 1


@pytest.mark.skipif(not os.environ.get("KILN_SEANET_DIR"), reason="KILN_SEANET_DIR (TFLM's seanet folder) not set")
def test_all_seanet_models(tmp_path):
    """Every seanet model (127 in TFLM's folder): at least 90% bit-exact with the golden output
    and LiteRT on Kiln's reference and host C; host C equals the reference on all of them."""
    models = _seanet_models(os.environ["KILN_SEANET_DIR"])
    stats, tflm_differs = _check_seanet(models, tmp_path)
    passed = sum(p for _, p in stats.values())
    print("seanet int16:", ", ".join(f"{f} {p}/{n}" for f, (n, p) in sorted(stats.items())),
          f"- {passed}/{len(models)} bit-exact; TFLite Micro's SUB arithmetic: {tflm_differs}")
    assert passed >= 0.9 * len(models), stats


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


@pytest.mark.qemu
@pytest.mark.slow
def test_seanet_models_on_mps2_an386(tmp_path):
    """The seanet models of tests/data (every op family) on QEMU mps2-an386 (Cortex-M4): the firmware's output
    equals Kiln's reference bit for bit, and the golden output where the reference does (int32
    inputs and outputs included: QUANTIZE's requantisations, TRANSPOSE_CONV's shape input)."""
    if not shutil.which("arm-none-eabi-gcc") or not shutil.which("qemu-system-arm"):
        pytest.skip("arm-none-eabi-gcc / qemu-system-arm not installed (bash scripts/setup.sh)")
    from kiln import hil
    families = set()
    for k, model in enumerate(_seanet_models(DATA)):
        families.add(_family(model))
        img, pkg = hil.build_for_board(model, "mps2-an386", str(tmp_path / f"s{k}"))
        g = hil.package_graph(pkg)
        ins, golden = _seanet_io(model)
        feeds = [x.reshape(g.types[v].shape) for x, v in zip(ins, g.inputs)]
        samples = [feeds[0] if len(feeds) == 1 else feeds]
        res = hil.run_on_board(img, pkg, samples)
        want = hil.reference_outputs(g, samples)
        assert hil.same_outputs(res.outputs[0], want[0]), model
        if np.array_equal(np.asarray(want[0]).ravel(), golden.ravel()):
            np.testing.assert_array_equal(np.asarray(res.outputs[0]).ravel(), golden.ravel(), err_msg=model)
    assert len(families) == 8
