"""`kiln run` and `kiln golden` read a .tflite model once: picking the oracle (kiln/tflm.oracle_for) and LiteRT's
check for models it cannot run (kiln/litert.refuse_unsupported) use the graph the package was
built from instead of importing the file again."""
import json
import os

import pytest

from kiln.cli import main
from kiln.frontend import loader
from tests.firmware.helpers import need_qemu, need_toolchain
from tests.frontend.svdf_util import KWS


@pytest.fixture
def loads(monkeypatch):
    """The paths .tflite files are imported from while the test runs."""
    seen = []
    real = loader.load_tflite

    def counting(p, *a, **kw):
        seen.append(os.fspath(p))
        return real(p, *a, **kw)
    monkeypatch.setattr(loader, "load_tflite", counting)
    return seen


@pytest.mark.qemu
@pytest.mark.parametrize("name,oracle", [("keyword_scrambled", "LiteRT's reference kernels (BUILTIN_REF)"),
                                         ("keyword_scrambled_8bit", "TensorFlow Lite Micro's interpreter")])
def test_kiln_run_imports_the_tflite_once(name, oracle, loads, tmp_path, capsys):
    need_toolchain()
    need_qemu()
    path = os.path.join(KWS, f"{name}.tflite")
    rc = main(["run", path, "--board", "mps2-an386", "--inputs", "2", "-o", str(tmp_path), "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and rep["bit_exact"] and rep["compared_against"][-1] == oracle, rep
    assert loads == [path], loads


@pytest.mark.parametrize("name,oracle", [("keyword_scrambled", "litert"), ("keyword_scrambled_8bit", "tflm")])
def test_kiln_golden_imports_the_tflite_once(name, oracle, loads, tmp_path, capsys):
    """`kiln golden` too: the oracle's choice and LiteRT's check use the graph it loaded."""
    path = os.path.join(KWS, f"{name}.tflite")
    if oracle == "tflm":
        pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
    rc = main(["golden", path, "-o", str(tmp_path / "g.npz"), "--inputs", "2", "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and rep["oracle"] == oracle, rep
    assert loads == [path], loads
