"""Instruction counts do not depend on when interrupts arrive. The fixture is built a second time
with a short SysTick period (-DKILN_SYSTICK_RELOAD: an interrupt every ~1,000-1,600 instructions,
dozens inside every inference, landing at different points of each one); its windows must count
exactly what the default build counts (instructions, per-command marks and the whole instruction
mix, taken / not-taken branches included) over many inferences on every emulated board. Counting
the interrupt handlers too (as the plugin did before) makes the same runs disagree."""
import re
import subprocess

import pytest

from kiln.boards.qemu import Qemu, uncounted_ranges
from tests.firmware import helpers

pytestmark = pytest.mark.qemu

RELOAD = 2047           # SysTick period 2,048 clocks: 1,000 to 1,600 instructions at shift 6
INFERENCES = 40
BRANCH = re.compile(r"^(b|b(eq|ne|cs|cc|hs|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le))(\.n|\.w)?$|^cbn?z$")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    cache = {}

    def get(board, reload=None):
        if (board, reload) not in cache:
            helpers.need_qemu()
            flags = [f"-DKILN_SYSTICK_RELOAD={reload}"] if reload else []
            out = tmp_path_factory.mktemp(f"irq-{board}-{reload or 'default'}")
            cache[board, reload] = helpers.build_fixture(board, out, extra_cflags=flags)
        return cache[board, reload]
    return get


def windows(image, n, **kw):
    """Run n inferences: [(instructions, marks, mix at the end)] from the plugin's log, and the
    timer ticks of the last inference."""
    x, ref = helpers.sample()
    with Qemu(image, **kw) as q:
        dev = q.device()
        dev.set_input(x.tobytes())
        for _ in range(n):
            res = dev.invoke()
        assert (helpers.as_int8(dev.get_output()) == ref).all()
        dev.exit(0)
        q.wait()
        lines = q.icount_log.read_text().splitlines()
    counts = [ln for ln in lines if ln.startswith("kiln-icount: window=")]
    mixes = [ln.split()[-1] for ln in lines if ln.startswith("kiln-mix: window=") and " end " in ln]
    assert len(counts) == len(mixes) == n
    return [(c.split(" ", 2)[2], m) for c, m in zip(counts, mixes)], res.ticks


@pytest.mark.parametrize("board", helpers.EMULATED)
def test_counts_do_not_depend_on_interrupts(images, board):
    quiet, _ = windows(images(board), 3)
    assert len(set(quiet)) == 1                       # "insns=N marks=...", mix: all the same
    busy, ticks = windows(images(board, RELOAD), INFERENCES)
    interrupts = ticks // (RELOAD + 1)
    assert interrupts >= 40                           # the short period really interrupts
    assert set(busy) == set(quiet), f"{board}: counts moved with {interrupts} interrupts per inference"


def test_counting_the_handlers_counts_the_interrupts(images):
    """The same busy runs with nothing left out (as the plugin counted before): every inference
    counts its interrupts' handler instructions (5 per SysTick interrupt), so the interrupts do
    land inside the measured windows."""
    board = "mps2-an386"
    quiet, _ = windows(images(board), 1, uncounted=[])
    busy, _ = windows(images(board, RELOAD), INFERENCES, uncounted=[])
    exact = int(quiet[0][0].split()[0].split("=")[1])
    counted = sorted({int(w[0].split()[0].split("=")[1]) for w in busy})
    assert counted[0] > exact + 5 * 40


@pytest.mark.parametrize("board", helpers.EMULATED)
def test_uncounted_code_is_the_handlers_and_the_timer_read(images, board):
    """The plugin leaves out whole functions by address, so they must be leaf functions: no call
    or branch out of them (a callee's instructions would still be counted)."""
    helpers.need_toolchain()
    img = images(board)
    ranges = uncounted_ranges(img.elf)
    assert {name for name, _, _ in ranges} == {"kiln_systick_irq", "kiln_uart_rx_irq",
                                               "kiln_fault_handler", "kiln_timer_now"}
    for name, lo, hi in ranges:
        assert img.symbols[name] & ~1 == lo
        if name == "kiln_fault_handler":      # reports the fault and exits: never returns
            continue
        dis = subprocess.run(["arm-none-eabi-objdump", "-d", f"--start-address=0x{lo:x}",
                              f"--stop-address=0x{hi:x}", str(img.elf)],
                             capture_output=True, text=True, check=True).stdout
        for line in dis.splitlines():
            parts = line.split("\t")
            if len(parts) < 4:
                continue
            op, args = parts[2].strip(), parts[3].split("@")[0].strip()
            assert not op.startswith(("bl", "blx")), f"{board}: {name} calls out: {line}"
            if BRANCH.match(op):
                target = int(args.split("<")[0].split(",")[-1], 16)
                assert lo <= target < hi, f"{board}: {name} branches out: {line}"
