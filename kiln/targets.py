"""Verification targets, found by name. A target is a function
``runner(model_path, inputs: list[np.ndarray], options: dict) -> list[np.ndarray]`` (one output per
input) plus a comparison rule. Folders register their own targets when imported:
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


def all_targets():
    _load_providers()
    return dict(TARGETS)
