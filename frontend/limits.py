"""Resource limits for graphs, with documented, configurable defaults.

Defaults (override with :func:`set_limits`, the ``limits(...)`` context manager, or the
environment variables ``KILN_MAX_TENSOR_ELEMENTS``, ``KILN_MAX_NODES``, ``KILN_MAX_DEPTH``):

=====================  =============  ==================================================
limit                  default        what it bounds
=====================  =============  ==================================================
max_tensor_elements    268,435,456    elements of any one tensor type (2**28, 1 GiB f32)
max_nodes              1,000,000      nodes in one graph
max_depth              100,000        longest producer chain (graph depth)
=====================  =============  ==================================================

Exceeding a limit raises :class:`LimitError` naming the limit, the value found and how to raise
it; Kiln's graph walkers are iterative, so a deep graph never raises ``RecursionError``.
"""
import contextlib
import dataclasses
import os

from .errors import LimitError


@dataclasses.dataclass
class Limits:
    max_tensor_elements: int = int(os.environ.get("KILN_MAX_TENSOR_ELEMENTS", 2**28))
    max_nodes: int = int(os.environ.get("KILN_MAX_NODES", 1_000_000))
    max_depth: int = int(os.environ.get("KILN_MAX_DEPTH", 100_000))


LIMITS = Limits()


def set_limits(**kw):
    for k, v in kw.items():
        if not hasattr(LIMITS, k):
            raise KeyError(f"unknown limit {k!r}; known: {[f.name for f in dataclasses.fields(Limits)]}")
        setattr(LIMITS, k, int(v))


@contextlib.contextmanager
def limits(**kw):
    old = dataclasses.asdict(LIMITS)
    set_limits(**kw)
    try:
        yield LIMITS
    finally:
        set_limits(**old)


def check(name, value, where=""):
    lim = getattr(LIMITS, name)
    if value > lim:
        env = "KILN_" + name.upper()
        raise LimitError(
            f"{name} exceeded{(' at ' + where) if where else ''}: {value:,} > limit {lim:,}; "
            f"raise it with kiln.frontend.set_limits({name}=...) or ${env}")
