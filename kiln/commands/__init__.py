"""Shared argument helpers of the commands."""
import argparse


def add_optimize_argument(p):
    """--optimize size|speed (C backend weight storage: backends/cpus.py, schedules.weight_bits)."""
    from kiln.backends.cpus import OPTIMIZE
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
