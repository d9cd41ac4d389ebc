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
    assert info.board.startswith(hil_board) and info.protocol == 2
    assert (info.input_sizes, info.output_sizes) == ((640,), (10,))
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


def test_counts_are_deterministic_under_icount(image_cache):
    """The plugin's instruction counts are exact and repeat. SysTick ticks repeat to within a
    few ticks: the firmware polls while a frame is half-received (its inter-byte timeout), so
    the timer's phase when INVOKE starts depends on when QEMU delivered the bytes."""
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
    assert a1.instructions == a2.instructions == b1.instructions == b2.instructions
    ticks = [r.ticks for r in (a1, a2, b1, b2)]
    assert max(ticks) - min(ticks) <= 64, ticks       # a SysTick wrap inside the run: ~20


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


def test_reset_redoes_the_transaction(image_cache):
    """After a reset the board has no input, no output and no session: the low-level calls say
    so (DeviceReset), and run()/infer() redo the whole transaction and get the right answer."""
    helpers.need_qemu()
    from kiln.boards.device import DeviceError, DeviceReset
    from kiln.boards.qemu import Qemu
    img = image_cache("mps2-an386")
    x, ref = helpers.sample()
    with Qemu(img, reboot=True, qmp=True) as q:
        dev = q.device(timeout=0.5)
        dev.set_input(x.tobytes())
        dev.reset()                                   # RESET command: new session afterwards
        assert dev.boot_count == 2 and dev.stats.reboots_seen == 1
        with pytest.raises(DeviceError, match="not on the board"):
            dev.invoke()
        out, _ = dev.run(x.tobytes())
        np.testing.assert_array_equal(helpers.as_int8(out), ref)
        q.system_reset()                              # the reset button, between INVOKE and GET_OUTPUT
        time.sleep(0.2)
        with pytest.raises(DeviceReset, match="rebooted"):
            dev.get_output()                          # was: zeros, accepted
        out, _ = dev.run(x.tobytes())
        np.testing.assert_array_equal(helpers.as_int8(out), ref)
        assert dev.boot_count == 3


def _raw(dev, ftype, body, session=None):
    """Send one request bypassing the Device's checks; returns the reply (or NAK) frame."""
    from kiln.boards.protocol import Decoder, T, encode
    s = dev.session if session is None else session
    port = dev._link.port
    frame = encode(ftype, 200, s.to_bytes(4, "little") + body)
    d = Decoder()
    for _ in range(5):          # retransmitted on silence, like the Device (same frame)
        port.write(frame)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            for f in d.feed(port.read(64)):
                if f.seq == 200 and f.type != T.ACK:
                    return f
    raise AssertionError(f"no reply to {ftype!r}")


def test_firmware_refuses_stale_sessions_inputs_and_invocations(image_cache):
    """The firmware itself never runs a request of another session, never invokes on an input
    that is not the one the host sent, never hands out another invocation's output."""
    import struct
    import zlib
    helpers.need_qemu()
    from kiln.boards.protocol import NakError, T
    from kiln.boards.qemu import Qemu
    x, ref = helpers.sample()
    with Qemu(image_cache("mps2-an386")) as q:
        dev = q.device()
        nak = lambda f: (f.type, f.payload[4]) if f.type == T.NAK else (f.type, None)   # noqa: E731
        assert nak(_raw(dev, T.INFO, b"", session=dev.session ^ 1)) == (T.NAK, NakError.SESSION)
        dev.set_input(x.tobytes())
        good = struct.pack("<III", 5, 640, zlib.crc32(x.tobytes()))
        bad = struct.pack("<III", 5, 640, zlib.crc32(x.tobytes()) ^ 1)
        assert nak(_raw(dev, T.INVOKE, bad)) == (T.NAK, NakError.INPUT)
        assert nak(_raw(dev, T.INVOKE, struct.pack("<III", 5, 639, zlib.crc32(x.tobytes())))) == (T.NAK, NakError.INPUT)
        assert nak(_raw(dev, T.GET_OUTPUT, struct.pack("<IBIH", 5, 0, 0, 10))) == (T.NAK, NakError.STALE)
        assert _raw(dev, T.INVOKE, good).type == T.INVOKE | 0x80
        assert nak(_raw(dev, T.GET_OUTPUT, struct.pack("<IBIH", 6, 0, 0, 10))) == (T.NAK, NakError.STALE)
        r = _raw(dev, T.GET_OUTPUT, struct.pack("<IBIH", 5, 0, 0, 10))
        assert r.payload[4:8] == struct.pack("<I", 5)
        np.testing.assert_array_equal(helpers.as_int8(r.payload[8:]), ref)
        assert nak(_raw(dev, T.GET_OUTPUT, struct.pack("<IBIH", 5, 1, 0, 10))) == (T.NAK, NakError.ARGS)


def test_a_frame_cut_short_is_nakked_after_the_inter_byte_timeout(image_cache):
    import struct
    helpers.need_qemu()
    from kiln.boards.protocol import Decoder, NakError, T, encode
    from kiln.boards.qemu import Qemu
    with Qemu(image_cache("mps2-an386")) as q:
        dev = q.device()
        port = dev._link.port
        frame = encode(T.SET_INPUT, 77, struct.pack("<IBI", dev.session, 0, 0) + bytes(100))
        port.write(frame[:-1])                   # the last byte never comes
        d, got, deadline = Decoder(), [], time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            got = d.feed(port.read(64))
        assert got and (got[0].type, got[0].seq, got[0].payload[4:]) == (T.NAK, 77, bytes([NakError.GAP, T.SET_INPUT]))
        dev.set_input(bytes(640))                # and the link works on at once
