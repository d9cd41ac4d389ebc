"""The host against a misbehaving board (boards/fake.py): every misbehaviour ends in the right
answer or a clean DeviceError that names what was wrong and quotes the last bytes received;
never a hang, a traceback or a wrong answer accepted."""
import re

import pytest

from kiln.boards.campaign import trial
from kiln.boards.device import (
    Device,
    DeviceError,
    DeviceFault,
    DeviceMismatch,
    DeviceProtocolError,
    DeviceReset,
    DeviceTimeout,
    DeviceVersionError,
    IOSpec,
)
from kiln.boards.fake import MODES, RIGHT_ANSWER_MODES, FakeBoard, random_inputs

INS, OUTS, COMMANDS = (300, 200), (10, 700), 5

# mode -> (error class, what the message must say)
ERRORS = {
    "max-payload-0": (DeviceProtocolError, "advertises a maximum payload of 0 bytes; Kiln needs 64..512"),
    "max-payload-4": (DeviceProtocolError, "advertises a maximum payload of 4 bytes"),
    "short-hello": (DeviceProtocolError, "HELLO reply has 5 bytes, expected 12"),
    "short-info": (DeviceProtocolError, "INFO reply has 20 bytes, expected at least 40"),
    "short-invoke": (DeviceProtocolError, "INVOKE reply has 10 bytes, expected 22"),
    "short-profile": (DeviceProtocolError, "GET_PROFILE reply with 3 stamps has 20 bytes"),
    "long-reply": (DeviceProtocolError, "HELLO reply has 512 bytes, expected 12"),
    "empty-output": (DeviceProtocolError, "GET_OUTPUT 0 at 0: reply of 4 bytes, expected the invocation id"),
    "huge-output": (DeviceProtocolError, "INFO reports output bytes 4294967280"),
    "many-stamps": (DeviceProtocolError, "stamps 0..+6 of 65535; asked for"),
    "ack-no-reply": (DeviceTimeout, "INVOKE acknowledged, but no reply within 1.0 s"),
    "silent": (DeviceTimeout, "no valid reply to HELLO"),
    "garbage": (DeviceTimeout, "no valid reply to HELLO"),
    "wrong-session": (DeviceTimeout, "ignored a reply of session"),
    "stale-output": (DeviceProtocolError, "expected the invocation id"),
    "old-firmware": (DeviceVersionError, "the firmware speaks protocol v1, this Kiln speaks v2: rebuild"),
    "nak-args": (DeviceProtocolError, "device rejected SET_INPUT: NAK ARGS"),
    "fault": (DeviceFault, "device faulted while handling INVOKE: exception 3 at pc=0x00001000"),
    "boot-loop": (DeviceError, "the board lost its state 4 times in one inference"),
}


def test_every_mode_has_an_expectation():
    assert set(MODES) == set(ERRORS) | set(RIGHT_ANSWER_MODES) | {"wrong-answer"}


def _session(fb, **kw):
    kw = {"timeout": 0.3, "patience": 1.0, "invoke_timeout": 1.0, **kw}
    dev = Device.open(fb.url, expect=IOSpec(INS, OUTS, COMMANDS), **kw)
    try:
        outs, res = dev.infer(random_inputs(INS, 1))
        prof = dev.get_profile()
        dev.get_stack()
        return outs, res, prof, dev.stats
    finally:
        dev.close()


@pytest.mark.parametrize("mode", sorted(ERRORS))
def test_misbehaviour_gives_a_clean_error(mode):
    cls, what = ERRORS[mode]
    with FakeBoard(INS, OUTS, commands=COMMANDS, mode=mode) as fb:
        outcome, detail, _ = trial(lambda: _session(fb)[0], fb.expected(random_inputs(INS, 1)),
                                   hard_timeout=30)
        assert outcome == "clean_error", detail
        assert fb.errors == []
    name, msg = detail.split(": ", 1)
    assert name == cls.__name__, detail
    assert msg.startswith(fb.url) and what in msg, detail
    assert re.search(r"last bytes received: ([0-9a-f]{2}( |;|$)|\(nothing\))", msg), detail


@pytest.mark.parametrize("mode", RIGHT_ANSWER_MODES)
def test_resets_and_boot_bursts_give_the_right_answer(mode):
    """A reset at any point (BOOT frame seen or lost), or 2,000 BOOT frames in a burst (was:
    RecursionError), redo the transaction: right outputs, never the zeros of a rebooted board."""
    with FakeBoard(INS, OUTS, commands=COMMANDS, mode=mode) as fb:
        # draining 2,000 BOOT frames takes ~0.5 s on an idle machine: room for a loaded CI host
        outs, res, prof, stats = _session(fb, **({"patience": 5.0} if mode == "boot-burst" else {}))
        assert outs == fb.expected(random_inputs(INS, 1))
        assert prof.ticks == fb.cycles and res.timer == "dwt" and res.instructions is None
        assert (stats.restarts >= 1) == (mode != "ok")
        assert fb.errors == []


def test_wrong_answer_is_not_the_protocols_to_catch():
    """A board that computes a wrong output answers it correctly framed: the host returns it and
    the comparison with the reference (kiln run / verify) reports the mismatch."""
    with FakeBoard(INS, OUTS, commands=COMMANDS, mode="wrong-answer") as fb:
        outs = _session(fb)[0]
        want = fb.expected(random_inputs(INS, 1))
        assert [o[1:] for o in outs] == [w[1:] for w in want] and outs != want


def test_board_running_another_model_is_refused():
    with FakeBoard((300, 201), OUTS, commands=COMMANDS) as fb:
        with pytest.raises(DeviceMismatch, match=r"inputs \[300, 201\] B.*manifest says inputs "
                                                 r"\[300, 200\] B.*flash the firmware built from this package"):
            _session(fb)


def test_transaction_deadline_bounds_everything():
    """One overall deadline per inference, whatever each wait allows."""
    with FakeBoard(INS, OUTS, commands=COMMANDS, mode="ack-no-reply") as fb:
        dev = Device.open(fb.url, timeout=0.3, invoke_timeout=60.0, transaction_timeout=1.0)
        with pytest.raises(DeviceTimeout, match="transaction deadline passed while waiting for INVOKE"):
            dev.infer(random_inputs(INS, 2))
        assert fb.stats.requests["INVOKE"] <= 3
        dev.close()


def test_low_level_calls_report_a_reset_and_infer_redoes_it():
    with FakeBoard(INS, OUTS, commands=COMMANDS) as fb:
        dev = Device.open(fb.url, timeout=0.3)
        xs = random_inputs(INS, 3)
        for i, x in enumerate(xs):
            dev.set_input(x, i)
        dev.invoke()
        fb.reset(boot=False)                   # the BOOT frame is lost: only the session tells
        with pytest.raises(DeviceReset, match="does not know session"):
            dev.get_output(0)
        with pytest.raises(DeviceError, match=r"input\(s\) \[0, 1\] not on the board"):
            dev.invoke()                        # the host knows the inputs are gone
        outs, _ = dev.infer(xs)
        assert outs == fb.expected(xs) and dev.boot_count == 2
        dev.close()


def test_packed_run_splits_and_joins_several_inputs_and_outputs():
    with FakeBoard(INS, OUTS, commands=COMMANDS) as fb:
        dev = Device.open(fb.url)
        xs = random_inputs(INS, 4)
        out, res = dev.run(b"".join(xs))
        assert out == b"".join(fb.expected(xs)) and res.rc == 0
        info = dev.info()
        assert (info.input_sizes, info.output_sizes, info.num_commands) == (INS, OUTS, COMMANDS)
        with pytest.raises(DeviceError, match="input of 499 bytes, the board's model takes 500"):
            dev.run(bytes(499))
        dev.close()
