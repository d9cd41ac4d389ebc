"""The per-core timing model (kiln.boards.timing) on synthetic instruction mixes."""
import tomllib

import pytest

from kiln import boards
from kiln.boards import load_file
from kiln.boards.schema import BoardError
from kiln.boards.timing import CLASSES, TIMINGS, estimate, estimate_cycles
from kiln.common.cores import CORES

MIX = {"alu": 100, "mac": 50, "load": 10, "load_pipelined": 20, "load_dual": 5, "store": 8,
       "load_multiple": 2, "regs_load_multiple": 6, "load_multiple_pc": 1, "store_multiple": 1,
       "regs_store_multiple": 5, "branch": 3, "branch_cond_taken": 10, "branch_cond_not_taken": 4,
       "div": 1, "it": 2}


def test_every_core_has_a_model():
    assert set(TIMINGS) == set(CORES)


def test_cortex_m4_by_hand():
    # TRM: ALU 1, MAC 1, LDR 2 (1 pipelined), LDRD 3, STR 1, LDM/POP/PUSH 1+N, taken branch 1+P
    # (P = 2), not taken 1, POP {pc} 1+N+P, SDIV 7 (2-12), IT 1
    want = (100 + 50 + 2 * 10 + 20 + 3 * 5 + 8 + (2 + 6) + (1 + 5) + 3 * 3 + 3 * 10 + 4 + 7 + 2
            + (1 + 2))                                      # POP {pc}: 1 + P, its registers counted above
    cycles, by = estimate_cycles(MIX, "cortex-m4")
    assert cycles == want
    assert by["load"] == 20 and by["branch_cond_taken"] == 30 and by["alu"] == 100


def test_wait_states_add_to_every_taken_branch():
    base, _ = estimate_cycles(MIX, "cortex-m4")
    slow, _ = estimate_cycles(MIX, "cortex-m4", wait_states=3)
    taken = MIX["branch"] + MIX["branch_cond_taken"] + MIX["load_multiple_pc"]
    assert slow - base == 3 * taken


def test_cortex_m3_long_multiplies_and_m0plus_loads():
    m3, _ = estimate_cycles({"mul_long": 10, "mac_long": 10, "mac": 10}, "cortex-m3")
    assert m3 == 10 * 4 + 10 * 5.5 + 10 * 2
    m0, _ = estimate_cycles({"load": 3, "load_pipelined": 3, "store_pipelined": 2}, "cortex-m0plus")
    assert m0 == 2 * 8                              # no load/store pipelining on the Cortex-M0+


def test_cortex_m7_dual_issue_and_its_mac_floor():
    alu, _ = estimate_cycles({"alu": 1000}, "cortex-m7")
    assert alu == 500                               # two ALU instructions per cycle
    macs, _ = estimate_cycles({"mac": 1000}, "cortex-m7")
    assert macs == 1000                             # one MAC pipe: at least a cycle each
    m7, _ = estimate_cycles(MIX, "cortex-m7")
    m4, _ = estimate_cycles(MIX, "cortex-m4")
    assert m7 < m4


def test_cortex_m55_helium_beats_overlap():
    cycles, _ = estimate_cycles({"mve": 100, "mve_load": 60}, "cortex-m55")
    assert cycles == 2 * 100 + 2 * 60 - 60          # each load overlaps one data instruction


def test_estimate_at_the_board_clock():
    b = boards.load("mps2-an386")
    e = estimate({"alu": 25_000}, b)
    assert e.cycles == 25_000 and e.ms == 1.0 and e.instructions == 25_000 and e.core == "cortex-m4"
    d = e.to_dict()
    assert d["estimated_cycles"] == 25_000 and d["cycles_per_instruction"] == 1.0


def test_unknown_class_or_core_is_a_named_error():
    with pytest.raises(BoardError, match="unknown class.*vfoo"):
        estimate_cycles({"vfoo": 1}, "cortex-m4")
    with pytest.raises(BoardError, match="no timing model for core 'cortex-m85'"):
        estimate_cycles({"alu": 1}, "cortex-m85")


def test_every_class_costs_at_least_nothing_negative():
    for t in TIMINGS.values():
        assert all(t.cost(c) >= 0 for c in CLASSES) and t.refill >= 0 and t.per_register > 0


def test_low_and_high_take_the_ends_of_the_manuals_ranges():
    mix = {"alu": 10, "branch": 4, "div": 2, "store": 3}
    low, _ = estimate_cycles(mix, "cortex-m4", bound="low")
    mid, _ = estimate_cycles(mix, "cortex-m4")
    high, _ = estimate_cycles(mix, "cortex-m4", bound="high")
    assert (low, mid, high) == (10 + 4 * 2 + 2 * 2 + 3, 10 + 4 * 3 + 2 * 7 + 3, 10 + 4 * 4 + 2 * 12 + 3 * 2)
    e = estimate(mix, boards.load("mps2-an386"))
    assert (e.low, e.cycles, e.high) == (low, mid, high)


@pytest.mark.parametrize("value, message", [(-1, "expected a non-negative integer"), (16, "expected 0..15, found 16"),
                                            ("2", "expected integer")])
def test_flash_wait_states_in_the_board_file(tmp_path, value, message):
    with open(boards.BOARD_DIR / "mps2-an386.toml", "rb") as f:
        text = f.read().decode()
    assert tomllib.loads(text)["flash_wait_states"] == 0
    bad = tmp_path / "mps2-an386.toml"
    bad.write_text(text.replace("flash_wait_states = 0", f"flash_wait_states = {value!r}".replace("'", '"')))
    with pytest.raises(BoardError, match=f"field 'flash_wait_states': {message}"):
        load_file(bad)
    good = tmp_path / "ok" / "mps2-an386.toml"
    good.parent.mkdir()
    good.write_text(text.replace("flash_wait_states = 0", "flash_wait_states = 3"))
    assert load_file(good).flash_wait_states == 3
