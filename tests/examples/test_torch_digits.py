"""examples/torch_digits.py really runs: PyTorch training, torch.export, then `kiln import`,
`kiln quantize` and `kiln run --board mps2-an386` with accuracy for float, int8 and the board
(fewer epochs and test images than the README's run); the README shows the script's commands."""
import importlib.util
import os
import re
import shlex
import shutil

import pytest

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def example():
    spec = importlib.util.spec_from_file_location("torch_digits", os.path.join(ROOT, "examples", "torch_digits.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_shows_the_example_commands():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    for c in example().kiln_commands("runs/torch-digits"):
        assert "kiln " + shlex.join(c) in readme


@pytest.mark.qemu
def test_example_runs_end_to_end(tmp_path, capsys):
    if not (shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm")):
        pytest.skip("needs arm-none-eabi-gcc and qemu-system-arm (bash scripts/setup.sh)")
    out = str(tmp_path / "td")
    assert example().main(["--out", out, "--epochs", "4", "--limit", "60"]) == 0
    text = capsys.readouterr().out
    for f in ("digits_cnn.pt2", "digits.npz", "digits_cnn.json", "digits_cnn_int8.json"):
        assert os.path.exists(os.path.join(out, f))
    assert "check       torch on 8 random inputs" in text and "(OK" in text
    acc = {k: float(v) for k, v in re.findall(r"^\s+(float \(host\)|reference \(host\)|C package \(host\)|"
                                              r"board \(mps2-an386\))\s+([\d.]+)%", text, re.M)}
    assert set(acc) == {"float (host)", "reference (host)", "C package (host)", "board (mps2-an386)"}
    assert acc["float (host)"] >= 85 and acc["reference (host)"] >= 85
    assert acc["board (mps2-an386)"] == acc["reference (host)"] == acc["C package (host)"]   # bit-exact
    assert "vs Kiln's reference executor: match" in text
