"""The two flash figures in the CLI: `kiln build`, `kiln run` and `kiln bench` report the whole
image (flash_bytes) and the model's share counted like TFLM's library + model (model_flash_bytes)."""
import json
import os
import shutil

import pytest

from kiln.cli import main
from kiln.commands import bench
from tests.firmware import helpers


def _json(capsys, argv):
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)


def _check_split(rep_flash, model, harness, breakdown):
    assert model + harness == rep_flash
    assert sum(breakdown.values()) == rep_flash
    assert breakdown["kernels_code"] + breakdown["model_constants"] + breakdown["runtime"] == model


def test_build_reports_model_and_image_flash(capsys, tmp_path):
    helpers.need_toolchain()
    pkg = tmp_path / "pkg"
    shutil.copytree(helpers.TINY_DENSE, pkg)
    man = json.loads((pkg / "manifest.json").read_text())
    man["target"] = "cortex-m4"           # the fixture is core-neutral; kiln build checks the core
    (pkg / "manifest.json").write_text(json.dumps(man))
    rc, rep = _json(capsys, ["build", str(pkg), "--board", "mps2-an386", "-o", str(tmp_path / "b"), "--json"])
    assert rc == 0
    assert rep["flash_bytes"] == rep["sizes"]["flash_used"]
    _check_split(rep["flash_bytes"], rep["model_flash_bytes"], rep["harness_flash_bytes"], rep["flash_breakdown"])
    assert rep["model_flash_bytes"] >= man["weight_bytes"]
    assert sum(rep["flash_by_file"].values()) == rep["flash_bytes"]
    rc = main(["build", str(pkg), "--board", "mps2-an386", "-o", str(tmp_path / "b")])
    out = capsys.readouterr().out
    assert rc == 0 and "flash, model" in out and "flash, whole image" in out
    assert f"{rep['model_flash_bytes']:,} B" in out and f"{rep['flash_bytes']:,} B" in out


@pytest.mark.qemu
def test_run_memory_reports_model_flash(capsys, shared_models, tmp_path):
    helpers.need_qemu()
    m = os.path.join(shared_models, "kws_ref_model.tflite")
    rc, rep = _json(capsys, ["run", m, "--board", "mps2-an386", "--inputs", "1", "-o", str(tmp_path), "--json"])
    assert rc == 0 and rep["bit_exact"]
    mem = rep["memory"]
    _check_split(mem["flash_bytes"], mem["model_flash_bytes"], mem["harness_flash_bytes"], mem["flash_breakdown"])
    with open(os.path.join(str(tmp_path), "package", "manifest.json")) as f:
        assert mem["model_flash_bytes"] >= json.load(f)["weight_bytes"]
    rc = main(["run", os.path.join(str(tmp_path), "package"), "--board", "mps2-an386", "--inputs", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and f"flash: model {mem['model_flash_bytes']:,} B" in out
    assert f"flash: whole image {mem['flash_bytes']:,} B" in out


def test_bench_markdown_has_both_flash_columns():
    row = {"model": "kws_ref_model", "board": "mps2-an386", "core": "cortex-m4", "bit_exact": True,
           "instructions": 4_000_000, "macs_per_instruction": 0.66, "arena_bytes": 9_000, "stack_bytes": 500,
           "flash_bytes": 64_321, "model_flash_bytes": 59_876, "harness_flash_bytes": 4_445}
    md = bench.markdown([row, dict(row, board="mps2-an385", core="cortex-m3", model_flash_bytes=None)], "kiln bench")
    assert "Image flash" in md and "Model flash" in md and "library .text" in md
    tflm = md[md.index("Against TensorFlow Lite Micro"):]
    header = next(l for l in tflm.splitlines() if l.startswith("| model"))
    assert "Kiln image flash" in header and "Kiln model flash" in header and "TFLM flash" in header
    line = next(l for l in tflm.splitlines() if l.startswith("| kws_ref_model"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert len(cells) == len(cols)
    assert cells[cols.index("Kiln image flash")] == "64,321"
    assert cells[cols.index("Kiln model flash")] == "59,876"
    assert cells[cols.index("TFLM flash (library + model)")] == "129,872"
    assert cells[cols.index("model flash / TFLM flash")] == f"{100 * 59_876 / 129_872:.2f}%"
    assert "| n/a |" in md          # a row without the split says so instead of failing
