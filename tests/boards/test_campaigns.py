"""Fault-injection campaigns (boards/campaign.py): misbehaving boards, resets at random and at
chosen moments, a lossy link. Each trial ends in the right answer or a clean DeviceError:
0 wrong results accepted, 0 hangs, 0 tracebacks. CI runs them small, the `slow` versions a
few times bigger; benchmarks/link_campaigns.py runs them at full size for docs/benchmarks.md."""
import numpy as np
import pytest

from kiln.boards import campaign as C
from kiln.boards.fake import RIGHT_ANSWER_MODES
from tests.firmware import helpers
from tests.firmware.helpers import make_tiny_dense as m

IO = ([640], [10])


def _reference(xs):
    return [m.reference(np.frombuffer(xs[0], np.int8)).tobytes()]


def _check(t: C.Tally, all_right=False):
    print(t.summary())
    assert t.ok, t.summary()
    if all_right:
        assert t.counts["right"] == t.tried, t.summary()


@pytest.fixture(scope="module")
def image(an386_image):
    helpers.need_qemu()
    return an386_image


def test_fake_board_campaign():
    t = C.fake_board_campaign(trials=1, seed=1)
    _check(t)
    assert t.tried == len(C.MODES) - 1
    assert t.counts["right"] >= len(RIGHT_ANSWER_MODES)


@pytest.mark.slow
def test_fake_board_campaign_long():
    _check(C.fake_board_campaign(trials=5, seed=2))


@pytest.mark.qemu
def test_targeted_resets(image):
    """Each reset scenario (between INVOKE and GET_OUTPUT, before INVOKE with the BOOT frame
    lost, between SET_INPUT chunks, while the model runs, ...) gives the right answer."""
    t = C.targeted_resets(image, _reference, *IO)
    _check(t, all_right=True)
    assert t.tried == len(C.SCENARIOS) and t.link["restarts"] >= len(C.SCENARIOS)


@pytest.mark.qemu
def test_random_resets(image):
    _check(C.reset_campaign(image, _reference, *IO, trials=40, seed=3))


@pytest.mark.qemu
def test_noisy_link(image):
    """1% of the bytes lost both ways: every inference right, none given up."""
    t = C.noisy_link_campaign(image, _reference, *IO, loss=0.01, inferences=10, sessions=1, seed=4)
    _check(t, all_right=True)
    assert t.link["retransmits"] + t.link["timeouts"] > 0


@pytest.mark.qemu
@pytest.mark.slow
def test_resets_long(image):
    _check(C.targeted_resets(image, _reference, *IO, repeat=5, seed=5), all_right=True)
    _check(C.reset_campaign(image, _reference, *IO, trials=300, seed=6))


@pytest.mark.qemu
@pytest.mark.slow
def test_noisy_link_long(image):
    t = C.noisy_link_campaign(image, _reference, *IO, loss=0.01, inferences=10, sessions=3, seed=7)
    _check(t, all_right=True)
