"""frontend/files.py: atomic files and staged folders leave nothing half-written."""
import errno
import os

import pytest

from kiln.frontend.errors import OutputError
from kiln.frontend.files import atomic_write, ensure_output_dir, staged_dir


def test_staged_dir_appears_whole_or_not_at_all(tmp_path):
    out = tmp_path / "pkg"
    with pytest.raises(KeyboardInterrupt):
        with staged_dir(out) as tmp:
            (open(os.path.join(tmp, "a.c"), "w")).close()
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []
    with staged_dir(out, last="manifest.json") as tmp:
        for n in ("a.c", "manifest.json"):
            with open(os.path.join(tmp, n), "w") as f:
                f.write("new")
        assert not out.exists()                      # nothing at the destination until the block ends
    assert sorted(os.listdir(out)) == ["a.c", "manifest.json"] and os.listdir(tmp_path) == ["pkg"]
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(out).st_mode & 0o777 == 0o777 & ~mask        # not mkdtemp's private 0700


def test_staged_dir_into_an_existing_folder_keeps_other_files(tmp_path):
    out = tmp_path / "pkg"
    (out / "sub").mkdir(parents=True)
    (out / "mine.txt").write_text("mine")
    (out / "sub" / "old").write_text("old")
    (out / "manifest.json").write_text("old")
    with staged_dir(out, last="manifest.json") as tmp:
        os.mkdir(os.path.join(tmp, "sub"))
        for n in ("manifest.json", os.path.join("sub", "new")):
            with open(os.path.join(tmp, n), "w") as f:
                f.write("new")
    assert (out / "mine.txt").read_text() == "mine" and (out / "manifest.json").read_text() == "new"
    assert sorted(os.listdir(out / "sub")) == ["new", "old"] and sorted(os.listdir(tmp_path)) == ["pkg"]


def test_nested_stages_name_the_real_destination(tmp_path):
    out = tmp_path / "pkg"
    with pytest.raises(OutputError) as e:
        with staged_dir(out, "package folder") as outer:
            with staged_dir(outer, "package folder"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert str(e.value).startswith(f"cannot write package folder {out}: No space left on device")
    assert os.listdir(tmp_path) == []


def test_atomic_write_and_output_dir_errors(tmp_path):
    f = tmp_path / "f"
    f.write_text("old")
    with pytest.raises(OutputError, match="is an existing file, not a folder"):
        ensure_output_dir(f)
    with pytest.raises(OutputError, match="a file stands where a folder should be"):
        atomic_write(f / "x.json", b"{}")
    with pytest.raises(OutputError, match="Is a directory"):
        atomic_write(tmp_path, b"{}")
    assert f.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["f"]
