"""The one backend shape and the one registry (backends/base.py, backends/registry.py): every
backend compiles a graph into a package that runs and agrees with the reference executor; names
and options that do not exist are named."""
import numpy as np
import pytest

from kiln import backends
from kiln.backends import Backend, Package, get_backend
from kiln.frontend import executor
from kiln.frontend.errors import KilnError, UsageError
from tests.backends.server_models import make


@pytest.fixture(scope="module")
def mlp():
    fwd, _, x, _ = make("mlp")
    return fwd, x


def test_registry_holds_the_backends():
    assert backends.backend_names() == ["reference", "c", "host-llvm", "cuda"]
    for name in backends.backend_names():
        b = get_backend(name)
        assert isinstance(b, Backend) and b.name == name and b.description


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(UsageError, match=r"unknown backend 'gpu'; known: reference, c, host-llvm, cuda"):
        get_backend("gpu")


def test_unknown_option_is_named(mlp, tmp_path):
    with pytest.raises(UsageError, match=r"backend 'c' has no option 'tagret'; its options: target, out_dir"):
        get_backend("c").compile(mlp[0], {"tagret": "host", "out_dir": str(tmp_path)})


@pytest.mark.parametrize("name,options,tol", [
    ("reference", {}, 0.0),
    ("c", {"target": "host", "plot": False, "measure_size": False}, 1e-5),
    ("host-llvm", {}, 1e-5),
    ("cuda", {"interpret": True}, 1e-5),      # the launch plan executed on the CPU
])
def test_every_backend_runs_and_matches_the_reference(mlp, tmp_path, name, options, tol):
    g, x = mlp
    if name in ("c", "cuda"):
        options = dict(options, out_dir=str(tmp_path / name))
    pkg = get_backend(name).compile(g, options)
    assert isinstance(pkg, Package) and pkg.backend == name
    assert (pkg.manifest is None) == (name in ("reference", "host-llvm"))
    want = executor.run(g, x)
    for got in (pkg.run(x), pkg.run(feeds={g.inputs[0]: x})):
        assert len(got) == len(want)
        np.testing.assert_allclose(got[0], want[0], rtol=tol, atol=tol)


def test_a_package_folder_loads_back(mlp, tmp_path):
    g, x = mlp
    pkg = get_backend("c").compile(g, {"target": "host", "out_dir": str(tmp_path), "plot": False})
    again = get_backend("c").load(str(tmp_path))
    assert again.manifest == pkg.manifest
    np.testing.assert_array_equal(again.run(x)[0], pkg.run(x)[0])
    with pytest.raises(UsageError, match="weights compiled in"):
        again.run(x, params={"l1.weight": np.zeros((12, 32), np.float32)})


def test_in_memory_backends_have_no_package_folder(tmp_path):
    for name in ("reference", "host-llvm"):
        with pytest.raises(UsageError, match="keeps its compiled packages in memory"):
            get_backend(name).load(str(tmp_path))


def test_host_llvm_refuses_int8_models_and_cuda_takes_them(tmp_path):
    """host-llvm compiles float graphs only; the cuda backend compiles int8 graphs too
    (backends/cuda_int8.py), into an int8 package."""
    from kiln.frontend.graph import Graph
    from kiln.frontend.types import QParams, TensorType
    g = Graph("q")
    g.add_input("x", TensorType((2, 4), "int8", QParams(0.1, 0)))
    g.outputs = [g.add_node("reshape", ["x"], {"shape": [8]})]
    with pytest.raises(KilnError, match=r"a quantised model; the .* backend runs float"):
        get_backend("host-llvm").compile(g)
    pkg = get_backend("cuda").compile(g, {"out_dir": str(tmp_path / "pkg")})
    assert pkg.manifest.dtype == "int8"
