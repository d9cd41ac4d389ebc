"""Locate (and build on demand) the QEMU instruction-count plugin, firmware/qemu_plugin/icount.c
(which includes the Thumb instruction classifier thumb_classes.c: the instruction mix).

scripts/setup.sh builds it into ``<venv>/share/kiln/libicount.so``; when that file is missing or
older than any of its sources, :func:`plugin_path` rebuilds it there (or under ~/.cache/kiln if
the venv is read-only) with the host gcc. :func:`build_classifier` builds the classifier alone
as a shared library (what the tests load with ctypes to check it on assembled encodings).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import FirmwareError

SOURCE = Path(__file__).resolve().parent / "qemu_plugin" / "icount.c"
CLASSIFIER = SOURCE.parent / "thumb_classes.c"
SOURCES = (SOURCE, CLASSIFIER, SOURCE.parent / "thumb_classes.h")


def _candidates() -> list[Path]:
    env = os.environ.get("KILN_ICOUNT_PLUGIN")
    out = [Path(env)] if env else []
    out.append(Path(sys.prefix) / "share" / "kiln" / "libicount.so")
    out.append(Path.home() / ".cache" / "kiln" / "libicount.so")
    return out


def _fresh(p: Path) -> bool:
    return p.exists() and p.stat().st_mtime >= max(s.stat().st_mtime for s in SOURCES)


def plugin_path(build: bool = True) -> Path:
    """Path of a libicount.so at least as new as its source; builds one if needed."""
    cands = _candidates()
    for p in cands:
        if _fresh(p):
            return p
    if not build:
        raise FirmwareError(f"QEMU plugin not built: run scripts/setup.sh (looked in "
                            f"{', '.join(map(str, cands))})")
    errors = []
    for target in cands[-2:]:
        try:
            return build_plugin(target)
        except OSError as e:
            errors.append(f"{target}: {e}")
    raise FirmwareError("cannot write the QEMU plugin: " + "; ".join(errors))


def build_plugin(target: str | os.PathLike) -> Path:
    """Compile icount.c into ``target`` (atomically) with the host gcc, as setup.sh does."""
    return _compile(SOURCE, target, "the QEMU plugin")


def build_classifier(target: str | os.PathLike) -> Path:
    """Compile thumb_classes.c alone into the shared library ``target``: ``kiln_classify`` and
    the class names, without QEMU's plugin API (for tests and tools)."""
    return _compile(CLASSIFIER, target, "the Thumb instruction classifier")


def _compile(source: Path, target: str | os.PathLike, what: str) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise FirmwareError(f"no host C compiler (gcc) to build {what}")
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    cmd = [cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(source)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise FirmwareError(f"building {what} failed:\n  {' '.join(cmd)}\n{p.stderr}")
    os.replace(tmp, target)
    return target
