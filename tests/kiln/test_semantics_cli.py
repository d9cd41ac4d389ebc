"""``--semantics litert|tflm`` end to end on MLPerf Tiny's anomaly-detection model (ten
FULLY_CONNECTED layers, where LiteRT's reference kernels and TensorFlow Lite Micro round
differently): `kiln golden` asks TFLite Micro's interpreter, `kiln verify` and `kiln run` give its
outputs bit for bit on the host and on the Cortex-M4 (mps2-an386) and Cortex-M55 (mps3-an547)
boards, `kiln compile` records the choice in the manifest, `kiln inspect` reports it; the
default stays LiteRT's; exit codes 0 / 1 / 2."""
import json
import os

import numpy as np
import pytest

from kiln import tflm
from kiln.cli import main
from tests.firmware.helpers import need_qemu

pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
AD01 = "/work/shared/models/ad01_int8.tflite"
GOLD = AD01.replace(".tflite", ".golden.npz")


@pytest.fixture(scope="module", autouse=True)
def _model():
    if not os.path.exists(AD01):
        pytest.skip(f"{AD01} not present")


def _json(capsys, argv):
    rc = main(argv + ["--json"])
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tflm_golden(tmp_path_factory):
    """Golden pairs of TFLite Micro's interpreter on the 8 inputs of the LiteRT goldens."""
    out = str(tmp_path_factory.mktemp("g") / "tflm.npz")
    assert main(["golden", AD01, "--data", GOLD, "--semantics", "tflm", "-o", out]) == 0
    return out


def test_golden_asks_tflm(tflm_golden, tmp_path, capsys):
    g, lit = np.load(tflm_golden), np.load(GOLD)
    ins = [(g[f"in_{k}"],) for k in range(8)]
    want = tflm.run_tflm(AD01, ins)
    differ = 0
    for k in range(8):
        np.testing.assert_array_equal(g[f"out_{k}"].reshape(-1), want[k][0].reshape(-1))
        differ += int((g[f"out_{k}"].reshape(-1) != lit[f"out_{k}"].reshape(-1)).sum())
    assert differ > 0
    rc, rep = _json(capsys, ["golden", AD01, "--inputs", "2", "--semantics", "tflm", "-o", str(tmp_path / "x.npz")])
    assert rc == 0 and rep["oracle"] == "tflm" and rep["semantics"] == "tflm" and "--semantics tflm" in rep["oracle_reason"]
    rc, rep = _json(capsys, ["golden", AD01, "--inputs", "2", "-o", str(tmp_path / "y.npz")])
    assert rc == 0 and rep["oracle"] == "litert" and rep["semantics"] == "litert"


def test_verify_on_host(tflm_golden, capsys):
    rc, rep = _json(capsys, ["verify", AD01, "--golden", tflm_golden, "--target", "host", "--semantics", "tflm"])
    assert rc == 0 and rep["ok"] and rep["matched"] == 8
    rc, rep = _json(capsys, ["verify", AD01, "--golden", tflm_golden, "--target", "reference"])
    assert rc == 1 and not rep["ok"]                       # LiteRT's semantics do not give TFLite Micro's answer
    rc, rep = _json(capsys, ["verify", AD01, "--golden", GOLD, "--target", "host"])
    assert rc == 0 and rep["matched"] == 8                 # the default: LiteRT's goldens, bit for bit


def test_verify_on_mps2_an386(tflm_golden, tmp_path, capsys):
    need_qemu()
    rc, rep = _json(capsys, ["verify", AD01, "--golden", tflm_golden, "--target", "mps2-an386", "--semantics", "tflm",
                             "-o", str(tmp_path / "b")])
    assert rc == 0 and rep["ok"] and rep["matched"] == 8
    src = (tmp_path / "b" / "package" / "kernels.c").read_text()
    assert "kiln_fc_mv_s8_fx(" in src


def test_run_on_mps3_an547_checks_against_tflm(capsys):
    need_qemu()
    rc, rep = _json(capsys, ["run", AD01, "--board", "mps3-an547", "--golden", GOLD, "--semantics", "tflm"])
    assert rc == 0 and rep["ok"] and rep["bit_exact"] and rep["semantics"] == "tflm"
    assert rep["compared_against"] == ["Kiln's reference executor", "TensorFlow Lite Micro's interpreter"]


def test_compile_records_semantics_and_packages_keep_it(tmp_path, capsys):
    pkg = str(tmp_path / "pkg")
    rc, rep = _json(capsys, ["compile", AD01, "--target", "host", "--semantics", "tflm", "-o", pkg, "--no-plot"])
    assert rc == 0 and rep["semantics"] == "tflm"
    with open(os.path.join(pkg, "manifest.json")) as f:
        assert json.load(f)["semantics"] == "tflm"
    rc, rep = _json(capsys, ["run", pkg, "--target", "host", "--golden", GOLD])
    assert rc == 0 and rep["ok"] and rep["semantics"] == "tflm"       # the package's own graph is the reference
    rc, rep = _json(capsys, ["run", pkg, "--target", "host", "--golden", GOLD, "--semantics", "litert"])
    assert rc == 2 and "compiled with --semantics tflm" in rep["error"]


def test_inspect_and_bad_value(capsys):
    rc, rep = _json(capsys, ["inspect", AD01, "--semantics", "tflm"])
    assert rc == 0 and rep["semantics"] == "tflm"
    assert all(r["attrs"].get("requant") == "fixed" for r in rep["ops"] if r["op"] == "dense")
    rc, rep = _json(capsys, ["inspect", AD01])
    assert rc == 0 and rep["semantics"] == "litert" and not any("requant" in r["attrs"] for r in rep["ops"])
    with pytest.raises(SystemExit) as e:
        main(["inspect", AD01, "--semantics", "micro"])
    assert e.value.code == 2
