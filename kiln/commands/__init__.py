"""Shared argument helpers of the commands."""


def add_optimize_argument(p):
    """--optimize size|speed (C backend weight storage: backends/cpus.py, schedules.weight_bits)."""
    from kiln.backends.cpus import OPTIMIZE
    p.add_argument("--optimize", default=OPTIMIZE[0], choices=list(OPTIMIZE),
                   help="Cortex-M weight storage: size (int8 everywhere, default) or speed (int16-packed "
                        "weights for layers up to 4 KiB: fewer instructions, more flash)")
