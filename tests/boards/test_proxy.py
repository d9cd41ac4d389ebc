"""The harness over a bad link: resync, retransmit, reconnect, or fail quoting the wire."""
import time

import numpy as np
import pytest

from kiln.boards.device import Device, DeviceTimeout
from kiln.boards.proxy import FaultProxy
from tests.firmware import helpers
from tests.firmware.helpers import make_tiny_dense as m

pytestmark = pytest.mark.qemu


@pytest.fixture
def qemu386(an386_image):
    helpers.need_qemu()
    from kiln.boards.qemu import Qemu
    with Qemu(an386_image) as q:
        yield q


def _check_run(dev, seed=0):
    x = m.sample_input(seed)
    out, res = dev.run(x.tobytes())
    np.testing.assert_array_equal(helpers.as_int8(out), m.reference(x))
    return res


def test_random_drops_corruption_garbage_both_ways(qemu386):
    with FaultProxy(qemu386.port, seed=11) as px:
        dev = Device.open(px.url, timeout=0.25, retries=10, invoke_timeout=5.0)
        for d in ("to_device", "to_host"):
            px.set_faults(d, drop=0.002, corrupt=0.002, garbage=0.002)
        for seed in range(3):
            _check_run(dev, seed)
        hurt = sum(px.stats.dropped.values()) + sum(px.stats.corrupted.values())
        assert hurt > 0 and dev.stats.retransmits > 0
        dev.close()


def _windows(q):
    """Inferences the firmware ran so far (the plugin writes one window line per run)."""
    text = q.icount_log.read_text() if q.icount_log.exists() else ""
    return text.count("kiln-icount: window=")


def test_lost_reply_is_served_from_cache(qemu386):
    with FaultProxy(qemu386.port) as px:
        dev = Device.open(px.url, timeout=0.25)
        dev.set_input(m.sample_input().tobytes())
        first = dev.invoke()
        ran = _windows(qemu386)
        px.drop_next("to_host", 30)              # the ACK (16 B) and the start of the reply
        again = dev.invoke()
        assert again.rc == first.rc == 0 and dev.stats.retransmits >= 1
        deadline = time.monotonic() + 5
        while _windows(qemu386) == ran and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _windows(qemu386) == ran + 1      # the retransmitted INVOKE did not run again
        px.corrupt_next("to_device", 1)          # request damaged: NAK, then retransmit
        assert dev.info().input_bytes == 640
        assert dev.stats.naks + dev.stats.timeouts >= 2
        dev.close()


def test_delay_is_tolerated(qemu386):
    with FaultProxy(qemu386.port) as px:
        dev = Device.open(px.url, timeout=0.5)
        px.set_faults("to_host", delay=0.01)
        px.set_faults("to_device", delay=0.005)
        _check_run(dev)
        dev.close()


def test_reconnect_after_link_reset(qemu386):
    with FaultProxy(qemu386.port) as px:
        dev = Device.open(px.url, timeout=0.3)
        dev.set_input(m.sample_input().tobytes())
        px.disconnect()
        res = dev.invoke()                       # connection lost -> reopen, handshake, retry
        assert res.rc == 0 and dev.stats.reconnects == 1
        np.testing.assert_array_equal(helpers.as_int8(dev.get_output()),
                                      m.reference(m.sample_input()))
        px.disconnect(drop_upstream=True)        # the board side drops too (in-flight bytes lost)
        _check_run(dev, 1)
        assert dev.stats.reconnects == 2 and px.stats.connections == 3
        dev.close()


def test_dead_link_fails_quoting_last_bytes(qemu386):
    with FaultProxy(qemu386.port) as px:
        dev = Device.open(px.url, timeout=0.1, retries=2, patience=0.5)
        px.set_faults("to_host", corrupt=1.0)    # every reply byte damaged
        with pytest.raises(DeviceTimeout) as e:
            dev.info()
        msg = str(e.value)
        assert "no valid reply to INFO" in msg
        attempts = int(msg.split(" attempts in ")[0].rsplit(" ", 1)[1])
        assert attempts >= 3                     # retries=2, then as long as the patience lasts
        tail = msg.split("last bytes received: ")[1].split(" (log")[0]
        assert len(bytes.fromhex(tail.replace(" ", ""))) > 10   # the damaged bytes, quoted
        dev.close()
