"""Packaging: every folder that holds Python modules or shipped data is listed in pyproject.toml,
so a regular (non-editable) install has all of Kiln (an editable install would hide an omission);
the distribution name, Python version, tested version ranges and the lock in constraints.txt agree."""
import os
import platform
import re
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

import kiln

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


# ---- metadata, version ranges and the lock ------------------------------------------------------
def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _requirements():
    p = _project()
    return [Requirement(r) for r in p["dependencies"] + p["optional-dependencies"]["test"]]


def _constraints():
    pins = {}
    with open(os.path.join(ROOT, "constraints.txt")) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line:
                r = Requirement(line)
                spec = list(r.specifier)
                assert len(spec) == 1 and spec[0].operator == "==", f"constraints.txt: {line!r} is not an exact pin"
                pins[canonicalize_name(r.name)] = Version(spec[0].version)
    return pins


def test_names_python_and_version():
    p = _project()
    assert p["name"] == "kiln-ml"                       # "kiln" on PyPI is another project
    assert p["scripts"] == {"kiln": "kiln.cli:main"}    # the command stays `kiln`
    assert metadata.version("kiln-ml") == kiln.__version__   # the installed distribution is this Kiln
    spec = SpecifierSet(p["requires-python"])
    assert "3.11.0" in spec and "3.10.12" not in spec   # boards/ reads TOML with tomllib (3.11)
    assert platform.python_version() in spec


def test_pyproject_has_ranges_and_constraints_pin_each_inside_its_range():
    pins = _constraints()
    for r in _requirements():
        name = canonicalize_name(r.name)
        assert r.specifier, f"pyproject.toml: {r.name} has no version range"
        assert name in pins, f"constraints.txt does not lock {r.name}"
        assert r.specifier.contains(pins[name], prereleases=True), \
            f"constraints.txt locks {r.name}=={pins[name]}, outside pyproject.toml's {r.specifier}"
    assert not {"kiln", "kiln-ml"} & set(pins), "constraints.txt must not pin Kiln itself"


def test_installed_dependencies_are_inside_the_ranges():
    for r in _requirements():
        v = Version(metadata.version(r.name)).public        # 2.13.0+cpu -> 2.13.0
        assert r.specifier.contains(v, prereleases=True), f"installed {r.name} {v} is outside {r.specifier}"


def test_tvm_ffi_range_excludes_the_versions_that_crash():
    (ffi,) = [r for r in _requirements() if r.name == "apache-tvm-ffi"]
    assert "0.1.14.post1" in ffi.specifier
    assert "0.1.15.post1" not in ffi.specifier and "0.1.15.post2" not in ffi.specifier


def test_setup_installs_the_lock_and_reinstalls_when_it_changes():
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        text = f.read()
    assert re.search(r'pip install -q -e "\.\$extras" -c constraints\.txt', text)
    assert re.search(r"req_hash=\$\(cat pyproject\.toml constraints\.txt \|", text)
