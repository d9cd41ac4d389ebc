"""Boot, handshake and a bit-exact round trip on the target; the same test runs on QEMU and on
a real board (--board/--port/--lab-map, see tests/conftest.py)."""
import time

import numpy as np
import pytest

from tests.firmware import helpers
from tests.firmware.helpers import make_tiny_dense as m

pytestmark = pytest.mark.qemu


def test_round_trip(hil_device, hil_board):
    dev = hil_device
    info = dev.info()
    assert (info.input_bytes, info.output_bytes, info.num_commands, info.arena_bytes) == (640, 10, 2, 112)
    assert info.board.startswith(hil_board) and info.protocol == 1
    assert info.arena_addr % 16 == 0
    for seed in (0, 1):
        x = m.sample_input(seed)
        out, res = dev.run(x.tobytes())
        np.testing.assert_array_equal(helpers.as_int8(out), m.reference(x))
        assert res.rc == 0 and res.ticks > 0 and res.marks == 3
    prof = dev.get_profile()
    assert len(prof.ticks) == 2 and all(t > 0 for t in prof.ticks)
    assert prof.ticks[0] > 10 * prof.ticks[1]          # fc1 has 64x the MACs of fc2
    assert prof.total_ticks <= res.ticks
    st = dev.get_stack()
    assert 0 < st.used < st.size == 8192


@pytest.mark.parametrize("board", helpers.EMULATED + helpers.REAL)
def test_every_board_runs_in_qemu(board, image_cache):
    """All emulated boards, and every real board's image (real memory sizes) on its stand-in."""
    helpers.need_qemu()
    from kiln.boards.qemu import Qemu
    img = image_cache(board, emulate=True)
    x, ref = helpers.sample()
    t0 = time.monotonic()
    with Qemu(img) as q:
        dev = q.device(timeout=2.0)
        boot = time.monotonic() - t0
        out, res = dev.run(x.tobytes())
        np.testing.assert_array_equal(helpers.as_int8(out), ref)
        assert res.instruction_source == "qemu-plugin" and res.instructions > 50000
        dev.exit(0)
        assert q.wait() == 0
    assert boot < 5.0


def test_ticks_are_deterministic_under_icount(image_cache):
    helpers.need_qemu()
    from kiln.boards.qemu import Qemu
    img = image_cache("mps2-an386")
    x, _ = helpers.sample()
    runs = []
    for _ in range(2):
        with Qemu(img) as q:
            dev = q.device()
            dev.set_input(x.tobytes())
            runs.append((dev.invoke(), dev.invoke()))
    (a1, a2), (b1, b2) = runs
    assert a1.ticks == a2.ticks == b1.ticks == b2.ticks
    assert a1.instructions == b1.instructions


def test_fault_is_reported_with_registers(tmp_path):
    helpers.need_qemu()
    import shutil
    from kiln.boards.device import DeviceFault
    from kiln.boards.qemu import Qemu
    from kiln.firmware import build
    pkg = tmp_path / "trap"
    shutil.copytree(helpers.TINY_DENSE, pkg)
    c = pkg / "model.c"
    c.write_text(c.read_text().replace("    MARK(0);", "    MARK(0);\n    __builtin_trap();", 1))
    img = build(pkg, "mps2-an386", tmp_path / "fw")
    with Qemu(img) as q:
        dev = q.device()
        dev.set_input(bytes(640))
        with pytest.raises(DeviceFault) as e:
            dev.invoke()
        f = e.value.fault
        start = img.symbols["kiln_model_run"] & ~1
        assert start <= f.pc < start + 0x100
        assert "exception 3" in str(e.value)          # HardFault (escalated UsageFault)
        assert f.cfsr & (1 << 16)                       # UNDEFINSTR
        assert q.wait() == 3                            # semihosting exit code after a fault


def test_reset_restores_input(image_cache):
    helpers.need_qemu()
    from kiln.boards.qemu import Qemu
    img = image_cache("mps2-an386")
    x, ref = helpers.sample()
    with Qemu(img, reboot=True) as q:
        dev = q.device(timeout=0.5)
        dev.set_input(x.tobytes())
        dev.reset()
        dev.invoke()
        np.testing.assert_array_equal(helpers.as_int8(dev.get_output()), ref)
        assert dev.stats.reboots_seen == 1 and dev._boot_count == 2
