"""Kiln's error types. Every error says what was expected, what was found and where."""
from kiln.common.errors import CheckFailed, KilnError, UsageError  # noqa: F401  (the one root: common/errors.py)


class GraphError(KilnError):
    """A graph is malformed: names the node and what is wrong."""


class ShapeError(GraphError):
    """An op received operands whose shapes or dtypes it cannot accept."""


class TraceError(KilnError):
    """Tracing met something it cannot record (e.g. data-dependent control flow)."""


class LimitError(KilnError):
    """A configured resource limit was exceeded; names the limit and how to raise it."""


class SerializationError(KilnError):
    """A file could not be read or written: corrupt, truncated or from a newer Kiln."""


class NumericsError(KilnError):
    """A node produced NaN or Inf (check mode): names the node and the op."""

    def __init__(self, message, node=None, op=None):
        super().__init__(message)
        self.node = node
        self.op = op


class OutputError(UsageError):
    """A file or folder could not be written (a file where a folder should be, a read-only
    folder, a full disk): names the path, the reason and what to do; nothing half-written is
    left behind."""
