"""Errors of the serial harness. Every message names the link (URL), what was expected, what
came instead, and quotes the last bytes received where the wire matters."""
from __future__ import annotations

from kiln.common.errors import KilnError


class DeviceError(KilnError, RuntimeError):
    """Talking to the device failed; the message says what was expected and what was seen."""


class DeviceTimeout(DeviceError):
    """No valid reply within the deadline: a dead or too-noisy link, or a board that hangs."""


class DeviceFault(DeviceError):
    """The firmware reported a CPU fault (its registers are in ``fault``)."""

    def __init__(self, message: str, fault):
        super().__init__(message)
        self.fault = fault


class DeviceProtocolError(DeviceError):
    """The board answered with a frame whose CRC checked but whose content breaks the protocol
    (wrong length, a field out of range, an id it should have echoed): a firmware bug, or
    firmware that does not match this Kiln."""


class DeviceVersionError(DeviceError):
    """The firmware speaks another protocol version: rebuild and flash it."""


class DeviceMismatch(DeviceError):
    """The board runs firmware for another model (INFO disagrees with the package's manifest)."""


class DeviceReset(DeviceError):
    """The board lost its state (it rebooted, its input is not what the host sent, or it holds
    no result of the invocation asked for). The harness has already re-opened the session;
    the caller must redo the whole set-input / invoke / get-output transaction
    (:meth:`Device.infer` does it by itself)."""
