"""`kiln run` and `kiln bench` report estimated cycles beside the exact instruction counts."""
import json
import os

import pytest

from kiln.boards.timing import CLASSES
from kiln.cli import main
from kiln.commands import bench


def _json(capsys, argv):
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.qemu
def test_run_reports_estimate_total_and_per_layer(capsys, shared_models, tmp_path):
    from tests.firmware import helpers
    helpers.need_qemu()
    m = os.path.join(shared_models, "ad01_int8.tflite")
    rc, rep = _json(capsys, ["run", m, "--board", "mps2-an386", "--inputs", "1", "-o", str(tmp_path), "--json"])
    assert rc == 0 and rep["bit_exact"]
    e = rep["estimate"]
    assert e["label"] == "estimated" and e["core"] == "cortex-m4" and e["clock_hz"] == 25_000_000
    assert e["instructions"] == rep["instructions_per_inference"] == sum(e["mix"].get(c, 0) for c in CLASSES)
    assert e["instructions"] <= e["estimated_cycles"] <= 3 * e["instructions"]     # the M4: >= 1 cycle each
    layers = rep["per_layer"]
    assert all(r["estimated_cycles"] >= r["instructions"] for r in layers)
    assert sum(r["estimated_cycles"] for r in layers) <= e["estimated_cycles"]
    assert all(k in layers[0] for k in ("macs_per_instruction", "of_limit", "estimated_ms", "mix"))
    rc = main(["run", os.path.join(str(tmp_path), "package"), "--board", "mps2-an386", "--inputs", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and f"estimated: {e['estimated_cycles']:,} cycles" in out
    assert "est. cycles" in out and "of ceiling" in out


def test_bench_tables_carry_the_estimate():
    row = {"model": "m", "board": "mps2-an386", "core": "cortex-m4", "optimize": "size", "bit_exact": True,
           "instructions": 1_000, "macs_per_instruction": 0.5, "estimated_cycles": 1_234, "estimated_ms": 0.049,
           "arena_bytes": 10, "stack_bytes": 20, "flash_bytes": 30, "model_flash_bytes": 25}
    md = bench.markdown([row], "kiln bench")
    header = next(line for line in md.splitlines() if line.startswith("| model | board"))
    line = next(line for line in md.splitlines() if line.startswith("| m |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[cols.index("estimated cycles")] == "1,234" and "an estimate, not a measurement" in md
    text = bench.text_table([row])
    assert "est. cycles" in text and "1,234" in text and "0.049" in text


def _log(tmp_path, end_alu):
    names = ",".join(CLASSES) + ",regs_load_multiple,regs_store_multiple,words_fp_multiple"
    zeros = [0] * (len(CLASSES) + 3)

    def vec(alu, load):
        v = list(zeros)
        v[CLASSES.index("alu")], v[CLASSES.index("load")] = alu, load
        return ",".join(map(str, v))
    p = tmp_path / "icount.log"
    p.write_text(f"kiln-mix: names={names}\n"
                 f"kiln-mix: window=0 mark=0 {vec(2, 0)}\nkiln-mix: window=0 mark=1 {vec(10, 4)}\n"
                 f"kiln-mix: window=0 mark=2 {vec(11, 4)}\nkiln-mix: window=0 end {vec(end_alu, 4)}\n"
                 f"kiln-icount: window=0 insns=17 marks=2,14,15\n")
    return p


def test_read_mix_per_command_and_its_consistency_check(tmp_path):
    from kiln import hil
    from kiln.firmware import FirmwareError
    total, per = hil.read_mix(_log(tmp_path, 13))
    assert total["alu"] == 13 and total["load"] == 4
    assert [(m["alu"], m["load"]) for m in per] == [(8, 4), (1, 0)]
    with pytest.raises(FirmwareError, match="classes sum to 18, the window counted 17"):
        hil.read_mix(_log(tmp_path, 14))
    old = tmp_path / "old.log"          # a plugin without the mix: no estimate, no error
    old.write_text("kiln-icount: window=0 insns=17 marks=2,14,15\n")
    assert hil.read_mix(old) is None and hil.read_mix(tmp_path / "missing.log") is None
