"""Families found before TVM builds them (backends/families_tir.py): the time steps of an
unrolled int8 RNN schedule the same PrimFunc with other integer constants, TVM builds one
template per family reading the constants from flash, and the package computes what the int8
reference does (host, and mps2-an386 under QEMU). The number of TVM builds, not the time, is
asserted: it stops growing with the time steps."""
import shutil

import numpy as np
import pytest
from tvm import te

from kiln.backends import cpus, families_tir, pipeline
from kiln.backends.lower import BuildCache, schedule_group
from kiln.frontend import run, save
from tests.backends.test_kernel_dedup import gru


def _lowered(q, tmp_path):
    st = pipeline.CompileState(source=q, target=cpus.get("host", "size"), out_dir=str(tmp_path), plot=False,
                               measure=False)
    for p in pipeline.PIPELINE[:5]:
        p(st)
    return st


def test_tvm_builds_do_not_grow_with_the_time_steps(tmp_path):
    short, long_ = _lowered(gru(17, int8=True), tmp_path / "a"), _lowered(gru(40, int8=True), tmp_path / "b")
    assert len(long_.commands) > 2 * len(short.commands)
    # before: one build per step for every kernel with its own constants (> 150 at 17 steps)
    assert long_.tvm_builds <= short.tvm_builds < len(short.commands) // 4
    assert len(short.kernels) < 20 and len(long_.kernels) < 20     # 18 and 19, as without templates


def test_an_int8_gru_of_20_steps_takes_48_tvm_builds(tmp_path):
    st = _lowered(gru(20, int8=True), tmp_path)
    # before: one TVM build per distinct scheduled kernel, 234 of them; now one per family template,
    # one member of each family built on its own (the check), and the kernels outside families
    assert len(st.commands) == 415 and st.tvm_builds == 48
    assert len(st.kernels) == 18


def test_members_c_is_what_their_own_builds_give(tmp_path):
    st = _lowered(gru(17, int8=True), tmp_path)
    sched = [schedule_group(st.graph, grp, st.target, st.consts, f"k{i:02d}") for i, grp in enumerate(st.groups)]
    cache = BuildCache()
    built = families_tir.build_all(sched, cache)
    assert cache.templates >= 5 and cache.builds == st.tvm_builds
    for b in built:
        assert "kiln_lits_t" not in b.source and "kiln_lits64_t" not in b.source   # its own literals
    for i in range(0, len(sched), 7):         # a sample: every build costs
        own = BuildCache().build(sched[i].func, sched[i].kname, sched[i].ro, sched[i].kinds)
        assert families_tir.normalized(built[i]) == families_tir.normalized(own), sched[i].kname


def test_fold_does_what_tvm_does_to_an_index():
    assert families_tir.fold("    s[i2] = x[((1 * 3) + i2)];") == "    s[i2] = x[(i2 + 3)];"
    assert families_tir.fold("y = (a * 3) + (2 + 5);") == "y = (a * 3) + 7;"
    assert families_tir.fold("y = (70000 * 70000);") == "y = (70000 * 70000);"     # beyond int: kept
    assert families_tir.fold("y = f(1 * 3) + g(2 + i);") == "y = f(1 * 3) + g(2 + i);"    # a call's arguments


def test_small_families_and_equal_kernels_are_built_as_before():
    def func(scale, shift):
        a = te.placeholder((16,), "int32", name="a")
        b = te.compute((16,), lambda i: (a[i] * scale) >> shift, name="b")
        return te.create_prim_func([a, b])

    class S:           # what build_all reads of lower.Scheduled
        def __init__(self, i, f):
            self.func, self.kname, self.ro, self.kinds = f, f"k{i:02d}", ["a"], (("value", "int32"),)
    few = [S(i, func(i + 3, 2)) for i in range(4)]
    cache = BuildCache()
    families_tir.build_all(few, cache, min_family=5)
    assert cache.templates == 0 and cache.builds == 4
    many = [S(i, func(i + 3, 2)) for i in range(6)] + [S(9, func(3, 2))]
    cache = BuildCache()
    out = families_tir.build_all(many, cache, min_family=5)
    assert cache.templates == 1 and cache.builds == 2     # the template, and the last member on its own (the check)
    # each member's C: the template's, with its own multiplier; the shift (2 in all) stays in the code
    assert ("b[i] = ((a[i] * 7) >> 2);" in out[4].source) and ("* 3) >> 2);" in out[6].source), out[4].source
    assert out[4].name == "k04" and "static void k04(int32_t* a, int32_t* b)" in out[4].source.replace("const ", "")


def test_int8_gru_on_mps2_an386(tmp_path):
    if not shutil.which("arm-none-eabi-gcc") or not shutil.which("qemu-system-arm"):
        pytest.skip("arm-none-eabi-gcc / qemu-system-arm not installed (bash scripts/setup.sh)")
    from kiln import hil
    q = gru(17, int8=True)
    model = save(q, str(tmp_path / "gru.json"))
    img, pkg = hil.build_for_board(model, "mps2-an386", str(tmp_path / "b"))
    assert "kiln_lits" in open(f"{pkg}/kernels.c").read()
    rng = np.random.default_rng(8)
    samples = [rng.integers(-128, 128, (1, 17, 3)).astype(np.int8) for _ in range(3)]
    res = hil.run_on_board(img, pkg, samples)
    want = [run(q, x) for x in samples]
    assert all(hil.same_outputs(a, b) for a, b in zip(res.outputs, want))
