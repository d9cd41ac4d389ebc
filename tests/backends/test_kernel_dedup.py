"""Kernels and constants shared across the time steps of an unrolled recurrent model: the C
backend builds structurally equal kernels once (lower.BuildCache) and emits one C function and
one copy of each constant array for all of them. The packages compute what unshared ones do."""
import numpy as np
import pytest
from tvm import te

import kiln.frontend as kf
from kiln.backends import compile as compile_pkg
from kiln.backends import families, pipeline
from kiln.backends.lower import Arg, BuildCache, Kernel
from kiln.backends.tirc import CParam
from kiln.frontend import run
from kiln.quantize import ptq


@pytest.fixture(autouse=True, scope="module")
def _keep_layer_rng():
    """These tests seed the layer generator; later tests' random layers stay as they would be."""
    from kiln.frontend import module
    saved, count = module._rng, module.Dropout._count
    yield
    module._rng, module.Dropout._count = saved, count


def gru(t, int8=False):
    kf.manual_seed(0)
    g = kf.trace(kf.GRU(3, 8), (1, t, 3))
    if int8:
        g = ptq(g, np.random.default_rng(1).standard_normal((16, t, 3)).astype(np.float32), int8_io=True)
    return g


class NoSharing(BuildCache):
    """Builds every kernel anew (what the backend did before kernels were shared)."""

    def build(self, func, kname, ro, kinds):
        self._by_hash.clear()
        return super().build(func, kname, ro, kinds)


def _compile(g, path):
    return compile_pkg(g, target="host", out_dir=path, plot=False, measure_size=False)


def _count(path, prefix):
    return (path / "kernels.c" if prefix == "static void k" else path / "model.c").read_text().count(prefix)


def test_distinct_kernels_do_not_grow_with_the_time_steps(tmp_path):
    # past MIN_FAMILY steps the time steps' slices of the input (one offset each) share a function
    short, long_ = _compile(gru(17), tmp_path / "t17"), _compile(gru(36), tmp_path / "t36")
    assert len(long_.manifest.commands) > 2 * len(short.manifest.commands)
    assert len(long_.manifest.kernels) == len(short.manifest.kernels) < 20
    assert _count(tmp_path / "t36", "static void k") == len(long_.manifest.kernels)
    # the CONCATENATION of the 36 steps keeps its offsets in an array: the command records stay small
    cmd_h = (tmp_path / "t36" / "kiln_cmd.h").read_text()
    assert "#define KILN_MAX_IO    3\n" in cmd_h, cmd_h
    # each step's SUB reads a constant 1.0 of its own: one array in flash
    assert _count(tmp_path / "t36", "static const float c_const_") == 1
    # every command names the shared function it calls
    assert {c.c_function for c in long_.manifest.commands} == set(long_.manifest.kernels)


def test_shared_float_package_computes_what_an_unshared_one_does(tmp_path, monkeypatch):
    g = gru(6)
    shared = _compile(g, tmp_path / "shared")
    monkeypatch.setattr(pipeline, "BuildCache", NoSharing)
    alone = _compile(g, tmp_path / "alone")
    assert len(alone.manifest.kernels) > 3 * len(shared.manifest.kernels)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.standard_normal((1, 6, 3)).astype(np.float32)
        np.testing.assert_array_equal(shared.run(x)[0], alone.run(x)[0])
        np.testing.assert_allclose(shared.run(x)[0], run(g, x)[0], rtol=1e-5, atol=1e-6)


def test_int8_steps_share_kernels_and_stay_bit_exact(tmp_path):
    # each step has its own scales, so its kernels differ in their literals (families.py)
    q = gru(17, int8=True)
    pkg = _compile(q, tmp_path / "q")
    assert len(pkg.manifest.commands) > 350 and len(pkg.manifest.kernels) < 20
    assert "kiln_lits" in (tmp_path / "q" / "kernels.c").read_text()
    rng = np.random.default_rng(4)
    for _ in range(3):
        x = rng.integers(-128, 128, (1, 17, 3)).astype(np.int8)
        np.testing.assert_array_equal(pkg.run(x)[0], run(q, x)[0])


def _func(names, scale):
    a = te.placeholder((16,), "float32", name=names[0])
    b = te.compute((16,), lambda i: a[i] * scale + 1.0, name=names[1])
    return te.create_prim_func([a, b])


def test_build_cache_ignores_names_not_constants():
    cache = BuildCache()
    kinds = (("value", "float32"),)
    one = cache.build(_func(("x_1", "y_1"), 2.0), "k00_a", ["x_1"], kinds)
    two = cache.build(_func(("x_7", "y_7"), 2.0), "k01_b", ["x_7"], kinds)
    assert two is one and one.name == "k00_a" and (cache.builds, cache.hits) == (1, 1)
    other = cache.build(_func(("x_9", "y_9"), 3.0), "k02_c", ["x_9"], kinds)
    assert other.name == "k02_c" and "3.0" in other.source and cache.builds == 2
    const = cache.build(_func(("x_1", "y_1"), 2.0), "k03_d", ["x_1"], (("const", "float32"),))
    assert const.name == "k03_d" and cache.builds == 3       # a flash operand: a kernel of its own
    assert one.roles == [0, 1]


# ---- families.py on hand-written kernels ---------------------------------------------------------
def _kern(i, body_value, line=None):
    name = f"k{i:02d}_add_{i}"
    src = (f"static void {name}(const int8_t* a_{i}, int8_t* out_{i}) {{\n"
           f"  for (int32_t i1 = 0; i1 < 8; ++i1) {{\n"
           f"    out_{i}[i1] = (int8_t)(kiln_add(a_{i}[i1], {body_value}) >> 7);\n"
           + (line or "") + "  }\n}\n")
    k = Kernel(name, [f"add_{i}"], ["add"], f"add_{i}", [Arg("value", f"a_{i}", "int8", 8),
                                                           Arg("value", f"add_{i}", "int8", 8, writes=True)], {}, source=src)
    k.c_function, k.extra_consts = name, {}
    k.cparams = [CParam(f"a_{i}", "int8", True), CParam(f"out_{i}", "int8")]
    return k


def test_a_family_shares_one_function_reading_its_literals():
    ks = [_kern(i, f"a {'-' if i % 2 else '+'} {i + 10}, {-i if i % 3 else i}") for i in range(16)]
    wide = _kern(16, "a + 3000000000, 1")          # a literal beyond int: another C type, its own kernel
    kernels, commands = families.share(ks + [wide], [(k, k) for k in ks + [wide]])
    assert [k.name for k in kernels] == ["k00_add_0", "k16_add_16"] and kernels[1] is wide
    assert {s.name for _, s in commands[:16]} == {"k00_add_0"}
    src = kernels[0].source
    assert "const int8_t* a_0, int8_t* out_0, const int32_t* kiln_lits) {" in src
    assert "kiln_add(a_0[i1], a + kiln_lit_0, kiln_lit_1) >> 7" in src     # the shift (7 in all) stays
    assert "  const int kiln_lit_0 = (int)kiln_lits[0];" in src
    # each command passes its own values, with their signs
    vals = {k.name: [int(v) for v in k.extra_consts[f"{k.name}.kiln_lits"]] for k, _ in commands[:16]}
    assert vals["k00_add_0"] == [10, 0] and vals["k01_add_1"] == [-11, -1] and vals["k03_add_3"] == [-13, 3]
    assert [a.kind for a in commands[3][0].args] == ["value", "value", "const"]


def test_small_families_and_sized_arrays_stay_apart():
    ks = [_kern(i, f"a + {i}") for i in range(families.MIN_FAMILY - 1)]
    assert families.share(ks, [(k, k) for k in ks])[0] == ks
    ks = [_kern(i, "a", f"    int32_t buf[{i + 1}];\n") for i in range(families.MIN_FAMILY)]
    assert families.share(ks, [(k, k) for k in ks])[0] == ks
