"""The QEMU plugin's instruction mix: the Thumb-2 classifier on assembled encodings, and on the
emulated boards the class counts summing exactly to the instruction counts (per command and in
total) with the cycle estimate attached."""
import ctypes
import shutil
import subprocess

import pytest

from kiln.boards.timing import CLASSES, EVENTS
from kiln.firmware.plugin import build_classifier
from tests.firmware import helpers

MARCH = {"cortex-m4": ["-mcpu=cortex-m4", "-mfpu=fpv4-sp-d16"],
         "cortex-m55": ["-march=armv8.1-m.main+mve.fp+fp.dp"]}


class Insn(ctypes.Structure):
    _fields_ = [("cls", ctypes.c_int), ("cond_branch", ctypes.c_int), ("regs", ctypes.c_int),
                ("load_rt", ctypes.c_int), ("addr_regs", ctypes.c_uint), ("size", ctypes.c_int)]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("no host gcc")
    lib = ctypes.CDLL(str(build_classifier(tmp_path_factory.mktemp("cls") / "libthumb_classes.so")))
    names = [n.decode() for n in (ctypes.c_char_p * len(CLASSES)).in_dll(lib, "kiln_class_names")]
    return lib, names


def classify(classifier, tmp_path, core, lines):
    """Assemble ``lines`` (one instruction each) and classify the bytes one instruction at a
    time, as the plugin does: [(class, registers)] per line."""
    helpers.need_toolchain()
    lib, names = classifier
    src = tmp_path / "a.s"
    src.write_text(".syntax unified\n.thumb\n" + "\n".join(lines) + "\n")
    obj, binf = tmp_path / "a.o", tmp_path / "a.bin"
    subprocess.run(["arm-none-eabi-as", *MARCH[core], "-mthumb", str(src), "-o", str(obj)], check=True)
    subprocess.run(["arm-none-eabi-objcopy", "-O", "binary", "-j", ".text", str(obj), str(binf)], check=True)
    code, out, i, prev = binf.read_bytes(), [], 0, -1
    while i < len(code):
        d = Insn()
        chunk = code[i:i + 4]
        assert lib.kiln_classify(chunk, len(chunk), prev, ctypes.byref(d)) == 0
        out.append((names[d.cls] if not d.cond_branch else "cond_branch", d.regs))
        prev, i = d.load_rt, i + d.size
    assert len(out) == len(lines)
    return out


def test_class_names_match_the_timing_model(classifier):
    lib, names = classifier
    assert tuple(names) == CLASSES
    events = [n.decode() for n in (ctypes.c_char_p * len(EVENTS)).in_dll(lib, "kiln_event_names")]
    assert events == list(EVENTS)


M4 = [("adds r0, r1, #1", "alu"), ("add r0, r1, r2, lsl #2", "alu"), ("sxtb16 r0, r1", "alu"),
      ("sadd16 r0, r1, r2", "alu"), ("ssat r0, #8, r1", "alu"), ("pkhbt r0, r1, r2, lsl #16", "alu"),
      ("muls r0, r1, r0", "mul"), ("mul r0, r1, r2", "mul"), ("smuad r0, r1, r2", "mul"),
      ("mla r0, r1, r2, r3", "mac"), ("smlad r0, r1, r2, r3", "mac"), ("smlabb r0, r1, r2, r3", "mac"),
      ("smull r0, r1, r2, r3", "mul_long"), ("umull r0, r1, r2, r3", "mul_long"),
      ("smlal r0, r1, r2, r3", "mac_long"), ("smlald r0, r1, r2, r3", "mac_long"),
      ("sdiv r0, r1, r2", "div"), ("udiv r0, r1, r2", "div"),
      ("ldr r0, [r1]", "load"), ("ldr r2, [r1, #4]", "load_pipelined"),      # after a load: pipelined
      ("ldr r3, [r2]", "load"),                                              # address from that load
      ("ldrsb.w r4, [r5, r6]", "load_pipelined"), ("ldrd r0, r1, [r2]", "load_dual"),
      ("str r0, [r1]", "store"), ("ldr r1, [r2]", "load"), ("str r0, [r3]", "store_pipelined"),
      ("strd r0, r1, [r2, #8]", "store_dual"), ("b .", "branch"), ("bl .+100", "branch"), ("bx lr", "branch"),
      ("beq .", "cond_branch"), ("bne.w .+1000", "cond_branch"), ("cbz r0, .+20", "cond_branch"),
      ("tbb [r0, r1]", "table_branch"), ("it eq", "it"), ("addeq r0, r0, #1", "alu"), ("nop", "system"),
      ("dmb", "system"), ("svc #0", "system"), ("mov pc, r0", "branch"), ("ldr pc, [r0]", "branch"),
      ("vadd.f32 s0, s1, s2", "fp"), ("vneg.f32 s0, s1", "fp"), ("vmla.f32 s0, s1, s2", "fp_mac"),
      ("vfma.f32 s0, s1, s2", "fp_mac"), ("vdiv.f32 s0, s1, s2", "fp_div"), ("vsqrt.f32 s0, s1", "fp_div"),
      ("vldr s0, [r0]", "fp_load"), ("vstr s0, [r0, #4]", "fp_store"), ("vmov r0, s0", "fp")]
MULTI = [("ldm r0!, {r1, r2, r3}", "load_multiple", 3), ("ldmia.w r0, {r1-r8}", "load_multiple", 8),
         ("pop {r4}", "load_multiple", 1), ("pop {r4-r7, pc}", "load_multiple_pc", 5),
         ("pop.w {r4-r11, pc}", "load_multiple_pc", 9), ("stm r0!, {r1, r2}", "store_multiple", 2),
         ("push {r4-r7, lr}", "store_multiple", 5), ("vpush {s16-s19}", "fp_multiple", 4),
         ("vpop {s16-s31}", "fp_multiple", 16)]
M55 = [("vldrb.s8 q0, [r0]", "mve_load"), ("vldrb.s16 q1, [r0, #8]", "mve_load"),
       ("vldrw.u32 q2, [r1], #16", "mve_load"), ("vld20.8 {q0, q1}, [r0]", "mve_load"),
       ("vstrb.8 q0, [r0]", "mve_store"), ("vstrb.16 q1, [r1]", "mve_store"),
       ("vmladava.s8 r0, q0, q1", "mve"), ("vadd.i8 q0, q1, q2", "mve"), ("vqrdmulh.s32 q0, q1, r2", "mve"),
       ("vdup.32 q0, r0", "mve"), ("vctp.8 r0", "mve"), ("1: dls lr, r0", "loop"), ("le lr, 1b", "loop"),
       ("lctp", "loop"), ("vadd.f32 s0, s1, s2", "fp"), ("smlad r0, r1, r2, r3", "mac")]


def test_cortex_m4_encodings(classifier, tmp_path):
    got = classify(classifier, tmp_path, "cortex-m4", [a for a, _ in M4])
    assert [(a, c) for (a, _), (c, _r) in zip(M4, got)] == M4


def test_multiple_transfers_count_registers(classifier, tmp_path):
    got = classify(classifier, tmp_path, "cortex-m4", [a for a, _, _ in MULTI])
    assert [(a, c, r) for (a, _, _), (c, r) in zip(MULTI, got)] == MULTI


def test_helium_and_low_overhead_loops(classifier, tmp_path):
    got = classify(classifier, tmp_path, "cortex-m55", [a for a, _ in M55])
    assert [(a, c) for (a, _), (c, _r) in zip(M55, got)] == M55


@pytest.mark.qemu
@pytest.mark.parametrize("board", helpers.EMULATED)
def test_class_counts_sum_to_the_instruction_count(board, image_cache):
    """Under QEMU the plugin's classes of a window sum exactly to its instruction count, for the
    whole inference and for every command, and the run carries a cycle estimate."""
    helpers.need_qemu()
    from kiln import hil
    img = image_cache(board)
    x, want = helpers.sample()
    run = hil.run_on_board(img, str(helpers.TINY_DENSE), [x])
    assert (run.outputs[0].reshape(-1) == want.reshape(-1)).all()
    assert run.instruction_source == "qemu-plugin" and run.mix
    assert sum(run.mix.get(c, 0) for c in CLASSES) == run.instructions[0]
    assert set(run.mix) <= set(CLASSES) | set(EVENTS) and "other" not in run.mix
    for row in run.profile:
        assert sum(row["mix"].get(c, 0) for c in CLASSES) == row["instructions"]
        assert row["estimated_cycles"] >= (row["instructions"] + 1) // 2
    e = run.estimate
    assert e["instructions"] == run.instructions[0] and e["estimated_cycles"] > 0
    assert e["estimated_ms"] == round(e["estimated_cycles"] / img.board.run_clock_hz * 1e3, 3)
    assert run.mix.get("mac", 0) + run.mix.get("mve", 0) > 0      # a dense layer: MACs, scalar or Helium
