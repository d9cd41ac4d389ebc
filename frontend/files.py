"""Writing outputs so that a failure leaves nothing half-written.

- :func:`atomic_write`: one file, written to ``<path>.tmp``, flushed, ``fsync``-ed and renamed
  over ``path``; on any error the ``.tmp`` is removed and ``path`` keeps its old contents.
- :func:`ensure_output_dir`: a folder exists (created if needed) and files can be written in it.
- :func:`staged_dir`: a folder written in full in a temporary folder beside its destination and
  moved into place only when complete.

An ``OSError`` while writing (a full disk, a read-only folder, a file where a folder should be)
becomes an :class:`~kiln.frontend.errors.OutputError` naming the path, the reason and what to do.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile

from .errors import OutputError

_HINTS = {
    errno.ENOSPC: "the disk is full: free some space and run again",
    errno.EDQUOT: "the disk quota is used up: free some space and run again",
    errno.EROFS: "the file system is read-only: choose another folder",
    errno.EACCES: "no permission to write there: choose a folder you can write to",
    errno.EPERM: "no permission to write there: choose a folder you can write to",
    errno.ENOTDIR: "a file stands where a folder should be: choose another path",
    errno.EEXIST: "a file stands where a folder should be: choose another path",
    errno.EISDIR: "a folder stands where a file should be: choose another path",
}
# errors that are about the output itself, whichever file they name
_OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def output_error(e: OSError, path, what="file") -> OutputError:
    """An OutputError for ``e`` raised while writing ``path``."""
    reason = e.strerror or str(e)
    hint = _HINTS.get(e.errno, "check the path and the disk")
    err = OutputError(f"cannot write {what} {os.fspath(path)}: {reason}; {hint}")
    err.__cause__ = e
    return err


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass


def _fsync_dir(d):
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, data: bytes):
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one:
    temporary file in the same folder, flush, fsync, rename, fsync the folder. On an error
    (a full disk included) the temporary file is removed; OSErrors become OutputError."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    tmp = path + ".tmp"
    try:
        os.makedirs(d, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        _remove(tmp)
        if isinstance(e, OSError):
            raise output_error(e, path) from e
        raise
    _fsync_dir(d)


def ensure_output_dir(path, what="output folder"):
    """Create the folder ``path`` (and its parents) when missing and check that a file can be
    created in it; raise OutputError naming the problem otherwise. Returns ``path``."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{what} {path} is an existing file, not a folder: choose another name")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".kiln-write-test-", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise output_error(e, path, what) from e
    return path


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def staged_dir(path, what="output folder", last=None):
    """Write a whole folder or nothing. Yields a new empty folder beside ``path``; when the block
    ends without an error its contents move to ``path``: by one rename when ``path`` does not
    exist or is empty, else file by file into it (``last``, e.g. "manifest.json", is removed
    first and moved last, so the folder never holds an old manifest with new files; other files
    already in ``path`` stay). On any error the temporary folder is removed and ``path`` is left
    as it was; OSErrors about the output become OutputError."""
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{what} {path} is an existing file, not a folder: choose another name")
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
        if os.path.isdir(path) and not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=parent)
        os.chmod(tmp, 0o777 & ~_umask())
    except OSError as e:
        raise output_error(e, path, what) from e
    try:
        yield tmp
        _publish(tmp, path, last)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and (e.errno in _OUTPUT_ERRNOS
                                       or str(e.filename or "").startswith((tmp, path))):
            raise output_error(e, path, what) from e
        if isinstance(e, OutputError) and tmp in str(e):       # from a stage nested in this one:
            raise OutputError(str(e).replace(tmp, path)) from e.__cause__   # name the real destination
        raise


def _publish(tmp, path, last):
    try:
        os.rename(tmp, path)            # path missing or an empty folder: one atomic step
        return
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if last:
        _remove(os.path.join(path, last))
    for name in sorted(os.listdir(tmp), key=lambda n: n == last):
        src, dst = os.path.join(tmp, name), os.path.join(path, name)
        if os.path.isdir(src) and os.path.isdir(dst):
            _publish(src, dst, None)
        else:
            os.replace(src, dst)
    shutil.rmtree(tmp, ignore_errors=True)
