"""Shared argument helpers of the commands."""
import argparse
import shutil
import tempfile

from kiln.backends.cpus import OPTIMIZE


def add_optimize_argument(p):
    """--optimize size|speed (C backend weight storage: backends/cpus.py, schedules.weight_bits)."""
    p.add_argument("--optimize", default=OPTIMIZE[0], choices=list(OPTIMIZE),
                   help="Cortex-M weight storage: size (int8 everywhere, default) or speed (int16-packed "
                        "weights for layers up to 4 KiB: fewer instructions, more flash)")


def positive_int(text):
    """argparse type: an integer >= 1 (argparse reports anything else as a usage error, exit 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


class BuildFolder:
    """A command's build folder: ``out`` when the user gave one, else a new temporary folder that
    is removed when the ``with`` block ends, unless ``keep``, or unless the error that ends it
    names a file inside (QEMU's logs): that folder stays so the paths in the message can be read.
    ``kept``: the folder left behind (None when it was removed)."""

    def __init__(self, out, keep, prefix):
        self.temp = not out
        self.path = out or tempfile.mkdtemp(prefix=prefix)
        self.keep = keep
        self.removed = False

    @property
    def kept(self):
        return None if self.removed else self.path

    def __enter__(self):
        return self

    def __exit__(self, etype, error, tb):
        if self.temp and not self.keep and not (error is not None and self.path in str(error)):
            shutil.rmtree(self.path, ignore_errors=True)
            self.removed = True
        return False
