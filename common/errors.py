"""The root of every error Kiln raises on purpose (a leaf module: it imports nothing, so every
package, boards/ and firmware/ included, can subclass it).

The command line maps them to exit codes: :class:`CheckFailed` (a check ran and the answer was
wrong: a mismatch, a diverged training run) exits 1; every other :class:`KilnError` (bad
arguments, a malformed model, a missing tool, a board that does not answer) exits 2."""


class KilnError(Exception):
    """Base class of every error Kiln raises on purpose. The message says what was expected, what
    was found, where, and what to do next."""


class CheckFailed(KilnError):
    """A check ran to completion and failed (exit code 1)."""


class UsageError(KilnError):
    """The command was called wrongly: a bad argument or a combination that cannot work (exit 2)."""
