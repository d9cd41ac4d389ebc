"""Estimated cycles from an executed instruction mix: a timing model per Cortex-M core.

The QEMU plugin (firmware/qemu_plugin/icount.c) counts executed instructions per class (the
class names of thumb_classes.h); :func:`estimate` turns such a mix into cycles and milliseconds
at a board's core clock. Cycles per class follow the cores' Technical Reference Manuals
(instruction timing tables); where a manual gives a range (SDIV 2-12, pipeline refill P 1-3)
the model takes a stated middle value, and the Cortex-M7 (dual issue), Cortex-M33 and
Cortex-M55 (whose manuals publish no full table) are approximations, said so in
:attr:`CoreTiming.note`. An estimate, never a measurement: docs/firmware.md ("Measurement")
gives the model, how it was checked and its error.

    est = estimate(mix, board)           # mix: {class name: count}
    est.cycles, est.ms, est.by_class
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .schema import BoardError

# the instruction classes of firmware/qemu_plugin/thumb_classes.h, in its order
CLASSES = ("alu", "it", "mul", "mac", "mul_long", "mac_long", "div", "load", "load_pipelined", "load_dual",
           "load_multiple", "store", "store_pipelined", "store_dual", "store_multiple", "branch",
           "branch_cond_taken", "branch_cond_not_taken", "load_multiple_pc", "table_branch", "loop", "fp",
           "fp_mac", "fp_div", "fp_load", "fp_store", "fp_multiple", "mve", "mve_load", "mve_store", "system",
           "other")
# counts of registers (words) moved by the *_multiple classes, and which class each goes with
EVENTS = {"regs_load_multiple": ("load_multiple", "load_multiple_pc"), "regs_store_multiple": ("store_multiple",),
          "words_fp_multiple": ("fp_multiple",)}
# classes that redirect the fetch: each pays the pipeline refill P (plus flash wait states)
REFILL = ("branch", "branch_cond_taken", "load_multiple_pc", "table_branch")


@dataclass(frozen=True)
class CoreTiming:
    """Cycles per instruction class on one core. ``cycles``: fixed cycles per instruction (classes
    not named cost 1); ``per_register``: extra cycles per register (word) moved, for the classes
    in EVENTS; ``refill``: P, the pipeline refill a taken branch adds; ``issue_width``: 2 on a
    dual-issue core, whose estimate is at least the count of its single-pipe ``one_per_cycle``
    classes; ``mve_overlap``: cycles one Helium load/store and one Helium data instruction in
    sequence share (beat overlap)."""
    core: str
    cycles: dict
    per_register: float
    refill: float
    note: str
    source: str
    issue_width: int = 1
    one_per_cycle: tuple = ()
    mve_overlap: float = 0.0
    ranges: dict = field(default_factory=dict)   # class -> (low, high) the manual gives

    def cost(self, cls: str, bound: str = "mid") -> float:
        """Cycles of one instruction of ``cls``: the model's value, or with ``bound`` "low" /
        "high" the end of the range the manual gives (where it gives one)."""
        if bound != "mid" and cls in self.ranges:
            return self.ranges[cls][0 if bound == "low" else 1]
        return self.cycles.get(cls, 1.0)

    def refill_cycles(self, bound: str = "mid") -> float:
        if bound != "mid" and "refill" in self.ranges:
            return self.ranges["refill"][0 if bound == "low" else 1]
        return self.refill


# Cortex-M4 TRM r0p1, 3.3.1 Table 3-1 and 3.3.2 "Load/store timings": loads 2 cycles, 1 when
# pipelined after a load single; STR with an immediate offset 1 cycle; LDRD/STRD and LDM/STM 1+N;
# taken branch 1+P (P 1..3, here 2); POP {..,PC} 1+N+P; TBB/TBH 2+P; MUL/MLA/SMLAD/UMULL/SMLAL 1;
# SDIV/UDIV 2..12 (here 7); IT 1 (0 when folded); VADD/VMUL 1, VMLA/VFMA 3, VDIV/VSQRT 14, VLDR 2.
_M4 = {"alu": 1, "it": 1, "mul": 1, "mac": 1, "mul_long": 1, "mac_long": 1, "div": 7, "load": 2,
       "load_pipelined": 1, "load_dual": 3, "load_multiple": 1, "store": 1, "store_pipelined": 1,
       "store_dual": 3, "store_multiple": 1, "branch": 1, "branch_cond_taken": 1, "branch_cond_not_taken": 1,
       "load_multiple_pc": 1, "table_branch": 2, "loop": 1, "fp": 1, "fp_mac": 3, "fp_div": 14, "fp_load": 2,
       "fp_store": 2, "fp_multiple": 1, "mve": 1, "mve_load": 1, "mve_store": 1, "system": 1, "other": 1}
_M4_RANGES = {"div": (2, 12), "refill": (1, 3), "it": (0, 1), "store": (1, 2)}   # STR: 2 with a register offset

TIMINGS: dict[str, CoreTiming] = {t.core: t for t in [
    CoreTiming("cortex-m0plus", {**_M4, "load_pipelined": 2, "store": 2, "store_pipelined": 2, "load_dual": 3,
                                 "store_dual": 3, "table_branch": 3},
               per_register=1, refill=1,
               note="2-stage pipeline, no load pipelining; single-cycle multiplier (the fast option, as on "
                    "the RP2040); BL is counted as B (2 cycles, the manual says 3)",
               source="Cortex-M0+ TRM r0p1, 3.3 Instruction set summary (cycle counts)"),
    CoreTiming("cortex-m3", {**_M4, "mac": 2, "mul_long": 4, "mac_long": 5.5},
               per_register=1, refill=2,
               note="as the Cortex-M4, but MLA/MLS 2 cycles, UMULL/SMULL 3-5 (4), UMLAL/SMLAL 4-7 (5.5)",
               source="Cortex-M3 TRM r2p1, 18.2 Table 18-1", ranges={**_M4_RANGES, "mul_long": (3, 5),
                                                                    "mac_long": (4, 7)}),
    CoreTiming("cortex-m4", dict(_M4), per_register=1, refill=2,
               note="Cortex-M4 TRM timings; P (pipeline refill, 1-3) taken as 2, SDIV 2-12 as 7; a store "
                    "with a register offset (2 cycles) counts as 1",
               source="Cortex-M4 TRM r0p1, 3.3.1 Table 3-1, 3.3.2 Load/store timings", ranges=_M4_RANGES),
    CoreTiming("cortex-m33", {**_M4, "div": 6.5}, per_register=1, refill=2,
               note="approximation: the Cortex-M33 TRM publishes no full cycle table; its 3-stage pipeline "
                    "is taken to time like the Cortex-M4's (SDIV 2-11); dual issue of 16-bit pairs is not "
                    "modelled (the estimate is on the high side)",
               source="Cortex-M4 TRM table applied to the Cortex-M33 (TRM r0p4: 3-stage pipeline)",
               ranges={**_M4_RANGES, "div": (2, 11)}),
    CoreTiming("cortex-m7", {**{c: 1 for c in _M4}, "load_dual": 2, "store_dual": 2, "load_multiple": 1,
                             "store_multiple": 1, "load_multiple_pc": 2, "table_branch": 3, "branch": 2,
                             "branch_cond_taken": 2, "div": 7, "fp_mac": 2, "fp_div": 14},
               per_register=0.5, refill=0, issue_width=2,
               one_per_cycle=("mul", "mac", "mul_long", "mac_long"),
               note="approximation of a dual-issue core: every class but divides, FP divides, dual / multiple "
                    "transfers and taken branches issues two per cycle (half its cycles), taken branches "
                    "predicted (2 cycles, no misprediction modelled), at least one cycle per multiply (one "
                    "MAC pipe); TCM / zero-wait memory",
               source="Cortex-M7 TRM r1p2 (6-stage dual-issue pipeline, branch prediction); no per-instruction "
                      "table is published", ranges={"div": (2, 12)}),
    CoreTiming("cortex-m55", {**_M4, "div": 6.5, "mve": 2, "mve_load": 2, "mve_store": 2, "loop": 1},
               per_register=1, refill=2, mve_overlap=1,
               note="approximation: scalar code timed as on the Cortex-M4 / M33; a Helium instruction takes "
                    "2 cycles (128-bit vectors, dual-beat: 64 bits per cycle), and a vector load/store next "
                    "to a vector data instruction overlaps it by one cycle; LE counted 1 cycle (0 when the "
                    "loop is cached)",
               source="Cortex-M55 TRM r1p0 (dual-beat MVE, 4-stage scalar pipeline); Armv8.1-M beat-wise "
                      "execution", ranges={**_M4_RANGES, "div": (2, 11)}),
]}


@dataclass(frozen=True)
class Estimate:
    cycles: int
    low: int                # with the low / high ends of the manual's ranges
    high: int
    ms: float | None
    clock_hz: int
    core: str
    instructions: int
    by_class: dict          # class -> estimated cycles (non-zero classes only)

    def to_dict(self) -> dict:
        return {"estimated_cycles": self.cycles, "estimated_cycles_low": self.low,
                "estimated_cycles_high": self.high, "estimated_ms": self.ms, "clock_hz": self.clock_hz,
                "core": self.core, "instructions": self.instructions,
                "cycles_per_instruction": round(self.cycles / self.instructions, 4) if self.instructions else None,
                "estimated_cycles_by_class": self.by_class}


def check_mix(mix: dict) -> None:
    """A named error for a mix with a class or event this model does not know."""
    unknown = sorted(set(mix) - set(CLASSES) - set(EVENTS))
    if unknown:
        raise BoardError(f"instruction mix: unknown class(es) {', '.join(unknown)}: the QEMU plugin and "
                         f"boards/timing.py disagree (rebuild the plugin: scripts/setup.sh)")


def estimate_cycles(mix: dict, core: str, wait_states: int = 0, bound: str = "mid") -> tuple[float, dict]:
    """(cycles, cycles per class) of ``mix`` on ``core``; taken branches pay the refill plus
    ``wait_states`` (straight-line fetch is taken to be hidden by the prefetch buffer). ``bound``
    "low" / "high" takes the ends of the manual's ranges (P 1-3, SDIV 2-12, IT 0-1...)."""
    check_mix(mix)
    t = TIMINGS.get(core)
    if t is None:
        raise BoardError(f"no timing model for core {core!r} (known: {', '.join(TIMINGS)})")
    by = {}
    for c in CLASSES:
        n = mix.get(c, 0)
        if n:
            by[c] = n * (t.cost(c, bound) + (t.refill_cycles(bound) + wait_states if c in REFILL else 0))
    for ev, classes in EVENTS.items():
        if mix.get(ev):
            by[classes[0]] = by.get(classes[0], 0) + mix[ev] * t.per_register
    if t.issue_width > 1:           # dual issue: single-cycle classes issue in pairs
        serial = set(REFILL) | {"div", "fp_div", "load_dual", "store_dual", "load_multiple", "store_multiple",
                                "fp_multiple", "load_multiple_pc"}
        by = {c: v if c in serial else v / t.issue_width for c, v in by.items()}
    total = sum(by.values())
    if t.mve_overlap:
        total -= t.mve_overlap * min(mix.get("mve_load", 0) + mix.get("mve_store", 0), mix.get("mve", 0))
    floor = sum(mix.get(c, 0) for c in t.one_per_cycle)
    return max(total, floor), {c: round(v) for c, v in by.items()}


def estimate(mix: dict, board) -> Estimate:
    """The estimate for ``board`` (a kiln.boards Board: its core, flash wait states and the clock
    Kiln's firmware runs the core at)."""
    ws = getattr(board, "flash_wait_states", 0)
    cycles, by = estimate_cycles(mix, board.core, ws)
    low, high = (int(round(estimate_cycles(mix, board.core, ws, b)[0])) for b in ("low", "high"))
    hz = board.run_clock_hz
    ins = sum(mix.get(c, 0) for c in CLASSES)
    return Estimate(int(round(cycles)), low, high, round(cycles / hz * 1e3, 3) if hz else None, hz, board.core,
                    ins, by)
