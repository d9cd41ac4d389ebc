"""Checkpoint files: one ``.npz`` holding named arrays plus a JSON header (``__meta__``).

The header records the format and version, the training configuration, the epoch and step, the
full state of every random generator (``bit_generator.state``, not just a seed), the schedule,
the optimiser's scalars, the metrics history, and a SHA-256 over every array (name, dtype,
shape, bytes). Arrays are named ``param/<name>``, ``buffer/<name>``, ``opt/<slot>/<name>`` and
``loader/perm``.

Writes are atomic: the file is written to ``<path>.tmp`` in the same folder, flushed and
``fsync``-ed, renamed over ``path`` and the folder is ``fsync``-ed, so a kill at any moment
leaves either the previous checkpoint or the new one, never a torn file; a write that fails (a
full disk) removes the ``.tmp`` and raises :class:`~kiln.frontend.errors.OutputError`. Reading a
truncated, corrupt or foreign file raises :class:`CheckpointError` saying what is wrong.

:class:`Checkpointer` writes a run's checkpoints one step late, so that the file on disk always
holds parameters whose next loss passed the divergence checks (the last good checkpoint).
"""
from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import zipfile

import numpy as np

from kiln.frontend.errors import KilnError, OutputError
from kiln.frontend.files import atomic_write

FORMAT = "kiln-checkpoint"
VERSION = 1
META = "__meta__"


class CheckpointError(KilnError):
    """A checkpoint is missing, corrupt, from a newer Kiln, or does not fit this run."""


def _digest(arrays):
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save(path, meta: dict, arrays: dict):
    """Write ``meta`` (JSON-able) and ``arrays`` (name -> ndarray) atomically to ``path``."""
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    for k, v in arrays.items():
        if v.dtype == object:
            raise CheckpointError(f"checkpoint array {k!r} has dtype object (not storable)")
    head = dict(meta, format=FORMAT, version=VERSION, sha256=_digest(arrays))
    blob = json.dumps(head, sort_keys=True).encode()
    buf = io.BytesIO()
    np.savez(buf, **{META: np.frombuffer(blob, np.uint8)}, **arrays)
    try:
        atomic_write(path, buf.getvalue())
    except OutputError as e:
        raise OutputError(f"{e} (the previous checkpoint, if any, is kept)") from e.__cause__
    return os.fspath(path)


class Checkpointer:
    """A run's checkpoint file, written one step late. ``take(meta, arrays)`` copies the state
    after step t; ``confirm()`` writes it once step t + 1's loss and gradients have passed the
    divergence checks, so a diverging step never reaches the disk; ``flush()`` writes a pending
    state unconfirmed (at the end of a run, or when it is interrupted). ``written_step`` is the
    step of the last checkpoint written (None: none yet)."""

    def __init__(self, path):
        self.path = path
        self.pending = None
        self.written_step = None

    def take(self, meta, arrays):
        if self.path:
            self.pending = (copy.deepcopy(meta), {k: np.array(v, copy=True) for k, v in arrays.items()})

    def confirm(self):
        if self.pending is not None:
            meta, arrays = self.pending
            self.pending = None
            save(self.path, meta, arrays)
            self.written_step = meta.get("step")

    flush = confirm


def load(path):
    """Read a checkpoint: returns (meta, arrays). Raises CheckpointError naming the problem."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            names = list(z.files)
            if META not in names:
                raise CheckpointError(f"{path}: not a Kiln checkpoint (no {META} header; arrays: {names[:5]})")
            head = json.loads(z[META].tobytes().decode("utf-8"))
            arrays = {k: z[k] for k in names if k != META}
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({type(e).__name__}: {e}); "
                              f"delete it (or restore a copy) and start again without --resume") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a Kiln checkpoint (header format {head.get('format')!r})")
    v = head.get("version")
    if not isinstance(v, int) or v > VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {v!r} is newer than this Kiln reads ({VERSION})")
    if head.get("sha256") != _digest(arrays):
        raise CheckpointError(f"{path}: checksum mismatch: the arrays do not match the header (corrupt checkpoint)")
    return head, arrays
