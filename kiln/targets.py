"""Verification targets, found by name. A target is a function
``runner(model_path, samples, options: dict) -> list`` (one result per sample) plus a comparison
rule. A ``multi_io`` runner takes each sample as a tuple of arrays (one per model input) and
returns a tuple of arrays (one per output); an older single-I/O runner takes and returns one array
per sample. :func:`run_target` hides the difference. Folders register their own targets when imported:
quantize/ registers ``reference``, backends/ registers ``host`` (and ``host-llvm``, ``cuda``),
kiln/board_targets.py registers one target per board
(boards/ imports nothing of the compiler, so the wiring lives in kiln/). ``kiln verify`` only calls ``get_target``."""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from kiln.frontend.errors import KilnError


@dataclasses.dataclass
class Target:
    name: str
    runner: Callable
    exact: bool = True          # int8 targets compare bit-exactly
    atol: float = 1e-5          # float comparison tolerance when not exact
    description: str = ""
    multi_io: bool = False      # runner takes/returns tuples of arrays (several inputs/outputs)


TARGETS: dict[str, Target] = {}
# modules that register targets when imported (a missing one just means that target is unavailable)
PROVIDERS = ("kiln.quantize.targets", "kiln.backends.targets", "kiln.backends.targets_server",
             "kiln.board_targets")


def register_target(target: Target):
    TARGETS[target.name] = target
    return target


def _load_providers():
    for m in PROVIDERS:
        try:
            importlib.import_module(m)
        except ModuleNotFoundError as e:
            if e.name != m:
                raise


def get_target(name) -> Target:
    _load_providers()
    if name not in TARGETS:
        raise KilnError(f"unknown target {name!r}; available: {', '.join(sorted(TARGETS)) or 'none'} "
                        f"(boards: see `kiln boards`)")
    return TARGETS[name]


def run_target(target: Target, model, samples, options=None) -> list[tuple]:
    """Run ``samples`` (each a tuple of input arrays) on ``target``; one tuple of output arrays
    per sample."""
    options = {} if options is None else options
    samples = [tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in samples]
    if target.multi_io:
        return [tuple(o) if isinstance(o, (tuple, list)) else (o,) for o in target.runner(model, samples, options)]
    if any(len(s) != 1 for s in samples):
        raise KilnError(f"target {target.name!r} runs single-input models only; this model's samples have "
                        f"{max(len(s) for s in samples)} inputs")
    return [(o,) for o in target.runner(model, [s[0] for s in samples], options)]
