"""The error root of firmware/ (a KilnError: the CLI's exit codes apply)."""
from kiln.common.errors import KilnError


class FirmwareError(KilnError, RuntimeError):
    """The firmware could not be built (toolchain missing, compile or link error)."""
