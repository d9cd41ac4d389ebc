"""Build and run the host fuzzer for the frame parser and command loop (firmware/fuzz).

The firmware's own kiln_frame.c and main.c are compiled for the host with
-fsanitize=address,undefined; see firmware/fuzz/fuzz_frame.c for what is checked.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from .build import FIRMWARE_DIR, FirmwareError

FUZZ_DIR = FIRMWARE_DIR / "fuzz"
RUNTIME_DIR = FIRMWARE_DIR / "runtime"
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g", "-O2",
            "-DKILN_PROFILE", f"-I{FUZZ_DIR}", f"-I{RUNTIME_DIR}"]


def build_fuzzer(out_dir: str | Path, cc: str | None = None) -> Path:
    cc = cc or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise FirmwareError("no host C compiler for the fuzzer")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    obj = out / "fw_main.o"
    exe = out / "fuzz_frame"
    for cmd in ([cc, *SANITIZE, "-Dmain=kiln_fw_main", "-c", str(RUNTIME_DIR / "main.c"), "-o", str(obj)],
                [cc, *SANITIZE, str(FUZZ_DIR / "fuzz_frame.c"), str(RUNTIME_DIR / "kiln_frame.c"),
                 str(obj), "-o", str(exe)]):
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise FirmwareError(f"building the fuzzer failed:\n  {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return exe


def run_fuzzer(exe: str | Path, iterations: int = 100_000, seed: int = 1,
               timeout: float = 120.0) -> dict:
    """Run it; returns the summary counters, raises FirmwareError with the report on failure."""
    p = subprocess.run([str(exe), str(iterations), str(seed)], capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise FirmwareError(f"fuzzer failed (exit {p.returncode}, seed {seed}):\n"
                            f"{(p.stdout + p.stderr)[-4000:]}")
    m = re.search(r"kiln-fuzz: (.*) ok", p.stdout)
    if not m:
        raise FirmwareError(f"fuzzer printed no summary:\n{p.stdout[-2000:]}")
    return {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
