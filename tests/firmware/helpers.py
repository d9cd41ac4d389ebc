"""Shared helpers for the firmware and harness tests (imported by both conftests)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY_DENSE = FIXTURES / "tiny_dense"
sys.path.insert(0, str(FIXTURES))
import make_tiny_dense  # noqa: E402

EMULATED = ["mps2-an385", "mps2-an386", "mps2-an500", "mps2-an505", "mps3-an547"]
REAL = ["nucleo-l4r5zi", "stm32f746g-disco", "nrf52840-dk", "rpi-pico"]


def need_toolchain():
    if not shutil.which("arm-none-eabi-gcc"):
        pytest.skip("arm-none-eabi-gcc not installed (bash scripts/setup.sh)")


def need_qemu():
    need_toolchain()
    if not shutil.which("qemu-system-arm"):
        pytest.skip("qemu-system-arm not installed (bash scripts/setup.sh)")


def build_fixture(board: str, out_dir: Path, emulate: bool = True, **kw):
    from kiln.firmware import build
    return build(TINY_DENSE, board, out_dir, emulate=emulate, **kw)


def sample():
    x = make_tiny_dense.sample_input()
    return x, make_tiny_dense.reference(x)


def as_int8(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype=np.int8)


def selected_boards(config) -> list[str]:
    """Boards named by --board ('all-emulated' expands)."""
    names = []
    for b in config.getoption("--board").split(","):
        b = b.strip()
        if b == "all-emulated":
            names += EMULATED
        elif b == "all":
            names += EMULATED + REAL
        elif b:
            names.append(b)
    return list(dict.fromkeys(names))
