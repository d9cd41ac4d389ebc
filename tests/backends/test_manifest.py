"""The typed manifest (backends/manifest.py): one loader and saver for C and CUDA packages, the
on-disk format unchanged (a load and save gives the same bytes), named errors."""
import json
import os

import pytest

from kiln.backends import cuda, get_backend
from kiln.backends.manifest import Manifest, ManifestError, load_manifest, save_manifest
from tests.backends.server_models import make
from tests.firmware import helpers


@pytest.fixture(scope="module")
def c_pkg(tmp_path_factory):
    fwd, _, _, _ = make("mlp")
    out = tmp_path_factory.mktemp("c")
    get_backend("c").compile(fwd, {"target": "host", "out_dir": str(out), "plot": False})
    return str(out)


def _same_bytes_after_a_round_trip(pkg, tmp_path):
    m = load_manifest(pkg)
    save_manifest(tmp_path, m)
    assert (tmp_path / "manifest.json").read_bytes() == open(os.path.join(pkg, "manifest.json"), "rb").read()
    return m


def test_c_manifest_round_trip_and_types(c_pkg, tmp_path):
    m = _same_bytes_after_a_round_trip(c_pkg, tmp_path)
    assert not m.is_cuda and m.format == "kiln-c-package" and m.target == "host"
    assert [t.name for t in m.inputs] == ["x"] and m.inputs[0].shape == [8, 12] and m.inputs[0].scale is None
    assert m.input_bytes == m.inputs[0].bytes == 8 * 12 * 4
    assert m.commands and all(c.c_function in m.kernels for c in m.commands)
    assert m.macs == sum(c.macs for c in m.commands)


def test_cuda_manifest_round_trip_and_types(tmp_path):
    fwd, _, _, _ = make("mlp")
    pkg = cuda.compile(fwd, str(tmp_path / "pkg"))
    (tmp_path / "again").mkdir()
    m = _same_bytes_after_a_round_trip(pkg, tmp_path / "again")
    assert m.is_cuda and m.model == fwd.name and m.steps and m.launches == sum(len(s.launches) for s in m.steps)
    assert all(a.space in ("arena", "weights") for s in m.steps for a in s.args)


def test_a_sparse_manifest_gets_defaults():
    """The firmware fixture's manifest has only what the firmware reads."""
    m = load_manifest(helpers.TINY_DENSE)
    assert m.model == "tiny_dense" and m.arena_bytes > 0 and m.input_bytes == 640 and m.output_bytes == 10
    assert [c.name for c in m.commands] == ["fc1_relu", "fc2"] and m.commands[0].ops is None


def test_unknown_keys_are_kept(c_pkg, tmp_path):
    d = json.load(open(os.path.join(c_pkg, "manifest.json")))
    d["vendor_note"] = {"x": 1}
    m = Manifest.from_dict(d)
    assert m.extra == {"vendor_note": {"x": 1}} and m.to_dict() == d


@pytest.mark.parametrize("content,msg", [
    (None, r"no manifest.json \(not a Kiln package\)"),
    ("{not json", "not a readable Kiln package"),
    ('{"target": "host", "inputs": [], "outputs": []}', "missing key 'arena_bytes'"),
    ('[1, 2]', "expected a JSON object"),
])
def test_bad_manifests_are_named(tmp_path, content, msg):
    if content is not None:
        (tmp_path / "manifest.json").write_text(content)
    with pytest.raises(ManifestError, match=msg):
        load_manifest(tmp_path)
