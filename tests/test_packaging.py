"""Every folder that holds Python modules or shipped data is listed in pyproject.toml, so a
regular (non-editable) install has all of Kiln (an editable install would hide an omission)."""
import os
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = (".py", ".c", ".h", ".j2", ".ld", ".toml", ".S")


def test_packages_cover_every_source_folder():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        cfg = tomllib.load(f)["tool"]["setuptools"]
    listed = set(cfg["packages"])
    missing = []
    for pkg, folder in cfg["package-dir"].items():
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if any(f.endswith(DATA) for f in files):
                rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
                name = pkg if rel == "." else pkg + "." + rel.replace(os.sep, ".")
                if name not in listed:
                    missing.append(f"{name} ({os.path.relpath(dirpath, ROOT)})")
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
