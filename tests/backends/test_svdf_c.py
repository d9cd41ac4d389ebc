"""SVDF and stateful packages through the C backend: the state in model.c's own buffers carried
from one kiln_model_run to the next and reset by kiln_reset_state(), bit-exact with the reference
(int16 and int8 states) over successive invocations, float within 1e-5, TFLite Micro's
keyword_scrambled models (every operator output and state, int16 model also against LiteRT) on
the host, and successive inferences on the emulated mps2-an386; the SVDF kernels of
include/kiln_svdf.h for int16 and int8 states (the DSP and the Helium weight layouts, run as
portable C on the host, with SMLAD on mps2-an386 and VMLADAVA on mps3-an547) over awkward shapes,
bit-exact with the reference and LiteRT (int16 states) or TensorFlow Lite Micro (int8 states)."""
import dataclasses
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.backends import compile as compile_pkg
from kiln.backends.cpus import get as get_target
from kiln.frontend import TensorType
from kiln.frontend.executor import run_stateful
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize.tflite_export import export_tflite
from tests.frontend.svdf_util import KWS, inputs, litert_stream, svdf_graph, two_svdf_graph
from tests.quantize.litert_util import q

STEPS = 5


def _host(g, tmp_path):
    return compile_pkg(g, target="host", out_dir=str(tmp_path), plot=False, measure_size=False)


def _check_stream(g, pkg, xs, exact=True):
    state = {}
    for k, x in enumerate(xs):
        want = run_stateful(g, state, x)
        got = pkg.run(x)
        for j, (a, b) in enumerate(zip(got, want)):
            if exact:
                np.testing.assert_array_equal(a, b, err_msg=f"invocation {k}, output {j} ({g.outputs[j]})")
            else:
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"invocation {k}")


@settings(max_examples=6, deadline=None)
@given(st.tuples(st.integers(1, 2), st.integers(1, 6), st.integers(1, 3), st.integers(1, 3), st.integers(1, 5)),
       st.sampled_from([("int16", 0), ("int8", 0), ("int8", -37)]), st.integers(-128, 127), st.integers(0, 10**6))
def test_int8_host_c_matches_reference_over_invocations(tmp_path_factory, d, state, z_out, seed):
    B, I, U, rank, M = d
    sdt, zs = state
    g = svdf_graph(B, I, U * rank, M, rank, state=sdt, z_state=zs, z_out=z_out, s_state=0.004 if sdt == "int16" else 0.1,
                   seed=seed)
    _check_stream(g, _host(g, tmp_path_factory.mktemp("svdf")), inputs(g, STEPS, seed))


def edge_graph(seed=0, z_state=0, state="int16"):
    """int8 x [2, 19] -> SVDF (19 inputs: a K % 4 and K % 16 tail; 6 filters, rank 2, memory 5: the
    units' dot products of 10, an F % 4 rest) -> SVDF (3 inputs, 5 filters, rank 1, memory 3: an odd
    dot product); ``state``: both states' type (int16, or int8: TFLite Micro's 8-bit SVDF, whose
    coarser state scale makes the columns clamp; memory 9 in the first SVDF, so that its dot products
    of 18 int8 values have a full 16-byte Helium chunk and a tail), ``z_state``: their zero point
    (with an int8 state a nonzero one wraps the clamped columns around, as TFLite Micro stores them)."""
    rng = np.random.default_rng(seed)
    s8 = state == "int8"
    g = svdf_graph(2, 19, 6, 9 if s8 else 5, 2, z_x=-11, z_out=7, z_state=z_state, state=state, s_state=0.05 if s8 else 0.004,
                   s_wt=0.02 if s8 else 0.002, s_out=0.25 if s8 else 0.02, seed=seed)
    F, M, U = 5, 3, 5
    lim, s_st, s_wt, b, s_out = (127, 0.04, 0.03, 3000, 0.15) if s8 else (32767, 0.003, 0.0005, 30000, 0.04)
    g.add_const("wf1", rng.integers(-127, 128, (F, 3)).astype(np.int8), q(0.02))
    g.add_const("wt1", rng.integers(-lim, lim + 1, (F, M)).astype(state), q(s_wt))
    g.add_const("b1", rng.integers(-b, b, (U,)).astype(np.int32), q(s_st * s_wt))
    g.add_const("st1", np.full((2, F * M), z_state, state), q(s_st, z_state))
    g.add_node("svdf_state", ["y", "wf1", "st1"], name="st1_next")
    g.add_node("svdf", ["st1_next", "wt1", "b1"], {"rank": 1, "activation": "relu"}, name="y1",
               out_type=TensorType((2, U), "int8", q(s_out, -128)))
    g.states["st1"] = "st1_next"
    g.outputs = ["y1"]
    return g.validate()


def _kernel_calls(src, target, state):
    """How often kernels.c calls the state and the output kernel of ``state``'s type."""
    sfx = "s8" if state == "int8" else "s16"
    mve = "mve_" if target == "cortex-m55" else ""
    return src.count(f"kiln_{mve}svdf_state_{sfx}("), src.count(f"kiln_svdf_{sfx}(")


@pytest.mark.parametrize("target", ["host", "cortex-m55"])
@pytest.mark.parametrize("state,z_state", [("int16", 0), ("int16", -37), ("int8", 0), ("int8", -37), ("int8", 90)])
def test_svdf_kernels_on_host_match_reference(target, state, z_state, tmp_path):
    """The kernels (host: kiln_svdf_state_*'s pack_w8 layout; cortex-m55: kiln_mve_svdf_state_*'s
    pack_gemm layout, both as portable C) bit-exact with the reference over a stream, int16 and
    int8 states (TFLite Micro's 8-bit SVDF), state zero point 0 and not (wrapping both ways); the
    new states are package outputs too."""
    g = edge_graph(1, z_state, state)
    g.outputs = ["st_next", "st1_next", "y1"]
    pkg = compile_pkg(g, target=target, out_dir=str(tmp_path), plot=False, measure_size=False)
    assert _kernel_calls(open(tmp_path / "kernels.c").read(), target, state) == (2, 2)
    _check_stream(g, pkg, inputs(g, STEPS, 2))


def test_svdf_kernels_take_both_state_types(tmp_path):
    """One model with an int16 and an int8 state: each SVDF calls its own type's kernels; with
    Kiln's kernels off all take the TE stages."""
    _host(two_svdf_graph(), tmp_path / "a")
    src = open(tmp_path / "a" / "kernels.c").read()
    assert _kernel_calls(src, "host", "int16") == (1, 1) and _kernel_calls(src, "host", "int8") == (1, 1)
    g = edge_graph(0, -37, "int8")
    compile_pkg(g, target=dataclasses.replace(get_target("host"), kernels=False), out_dir=str(tmp_path / "b"), plot=False,
                measure_size=False)
    assert "kiln_svdf" not in open(tmp_path / "b" / "kernels.c").read()


def test_float_host_c_over_invocations(tmp_path):
    g = svdf_graph(2, 5, 6, 4, 2, dtype="float32", act="relu")
    _check_stream(g, _host(g, tmp_path), inputs(g, STEPS, 3), exact=False)


def test_package_state_buffer_and_reset(tmp_path):
    """The state lives in model.c (not the arena), the manifest lists it, kiln_reset_state()
    (CPackage.reset_state) starts the stream again, and a package without state has a no-op one."""
    g = two_svdf_graph()
    pkg = _host(g, tmp_path / "a")
    man = json.load(open(tmp_path / "a" / "manifest.json"))
    assert man["state_bytes"] == 8 * 5 * 2 + 6 * 3 and [s["name"] for s in man["states"]] == ["st0", "st1"]
    src = open(tmp_path / "a" / "model.c").read()
    assert "static int16_t s_st0[40]" in src and "static int8_t s_st1[18]" in src and "void kiln_reset_state(void)" in src
    xs = inputs(g, 4, 5)
    first = [pkg.run(x)[0] for x in xs]
    assert len({y.tobytes() for y in first}) > 1
    pkg.reset_state()
    assert all(np.array_equal(pkg.run(x)[0], y) for x, y in zip(xs, first))
    g.states.clear()                 # the same nodes without state: every run from the reset value
    plain = _host(g, tmp_path / "b")
    assert "state_bytes" not in json.load(open(tmp_path / "b" / "manifest.json"))
    assert all(np.array_equal(plain.run(xs[0])[0], first[0]) for _ in range(2))


@pytest.mark.parametrize("name", ["keyword_scrambled", "keyword_scrambled_8bit"])
def test_keyword_scrambled_on_host_c(name, tmp_path):
    """TFLite Micro's keyword_scrambled models compiled whole, with every operator output and every
    next state as a package output: bit-exact with the reference over 6 successive invocations; the
    int16-state model's final outputs also equal LiteRT's."""
    path = os.path.join(KWS, f"{name}.tflite")
    g = load_tflite(path)
    full = g.copy()
    full.outputs = [n.name for n in g.nodes]
    pkg = _host(full, tmp_path)
    rng = np.random.default_rng(7)
    xs = [rng.integers(-32768, 32768, (1, 96)).astype(np.int16) for _ in range(6)]
    _check_stream(full, pkg, xs)
    if name == "keyword_scrambled":
        pkg.reset_state()
        lite = litert_stream(path, xs)
        for k, (x, (y,)) in enumerate(zip(xs, lite)):
            np.testing.assert_array_equal(pkg.run(x)[-1], y, err_msg=f"invocation {k}")


def test_host_llvm_refuses_stateful_graphs():
    from kiln.backends import tvm_te
    with pytest.raises(NotImplementedError, match="stateful"):
        tvm_te.check_lowerable(svdf_graph(1, 2, 2, 2, 1, dtype="float32"), "host-llvm")


@pytest.mark.slow
@pytest.mark.qemu
@pytest.mark.parametrize("which,board", [("two_svdf", "mps2-an386"), ("keyword_scrambled", "mps2-an386"),
                                         ("edge", "mps2-an386"), ("keyword_scrambled", "mps3-an547"),
                                         ("edge", "mps3-an547"), ("edge8", "mps2-an386"), ("edge8", "mps3-an547")])
def test_svdf_stream_on_board(which, board, tmp_path):
    """Successive inferences on the emulated boards carry the state as the reference and LiteRT
    do: `kiln golden` writes a stream (state carried from pair to pair), `kiln verify` runs it on a
    freshly booted board, every output equal (the SVDF kernels: SMLAD on mps2-an386, Helium on
    mps3-an547; ``edge``: their tails, against LiteRT; ``edge8``: the int8-state kernels, their
    tails and a wrapping state zero point, against TensorFlow Lite Micro's interpreter)."""
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    from tests.firmware.helpers import need_qemu, need_toolchain
    need_toolchain()
    need_qemu()
    if which == "two_svdf":
        path = str(tmp_path / "two_svdf.tflite")
        export_tflite(two_svdf_graph(), path)
        g = load_tflite(path)
        samples, oracle = [(x,) for x in inputs(g, 6, 9)], "reference"
    elif which in ("edge", "edge8"):
        path = str(tmp_path / f"{which}.tflite")
        export_tflite(edge_graph(3) if which == "edge" else edge_graph(3, -37, "int8"), path)
        samples, oracle = [(x,) for x in inputs(load_tflite(path), 6, 8)], "litert" if which == "edge" else "tflm"
    else:
        path = os.path.join(KWS, "keyword_scrambled.tflite")
        rng = np.random.default_rng(4)
        samples, oracle = [(rng.integers(-32768, 32768, (1, 96)).astype(np.int16),) for _ in range(6)], "litert"
    gold = str(tmp_path / "g.npz")
    golden(path, gold, samples, oracle=oracle)
    rep = verify(path, gold, board, options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 6, rep["results"]


def test_a_reset_mid_stream_is_an_error_not_a_wrong_answer(tmp_path):
    """A board that reboots during a stateful model's stream lost the state the earlier samples
    left: run_on_board says so instead of redoing the inference from the reset state."""
    from kiln import hil
    from kiln.boards.errors import DeviceError
    from tests.firmware.helpers import need_toolchain
    need_toolchain()
    g = two_svdf_graph()
    pkg = str(tmp_path / "pkg")
    compile_pkg(g, target="cortex-m4", out_dir=pkg, plot=False, measure_size=False)
    from kiln.frontend import save
    save(g, os.path.join(pkg, "graph"))
    image, _ = hil.build_for_board(pkg, "mps2-an386", str(tmp_path / "fw"))
    xs = inputs(g, 3, 1)
    with hil.fake_board(pkg, mode="reset-before-output") as fb:
        with pytest.raises(DeviceError, match="reset during sample 0 of a stateful model's stream"):
            hil.run_on_board(image, pkg, xs, port=fb.url)


@pytest.mark.slow
@pytest.mark.qemu
@pytest.mark.parametrize("board", ["mps2-an386", "mps3-an547"])
def test_kiln_run_8bit_keyword_model_on_board(board, tmp_path, capsys):
    """`kiln run` streams the int8-state model (its SVDFs on the int8-state kernels: SMLAD on
    mps2-an386, Helium on mps3-an547), bit-exact with the reference and with TensorFlow Lite
    Micro's interpreter over the stream, and says why LiteRT is not asked (it cannot run int8 SVDF
    states)."""
    from kiln.cli import main
    from tests.firmware.helpers import need_qemu, need_toolchain
    need_toolchain()
    need_qemu()
    rc = main(["run", os.path.join(KWS, "keyword_scrambled_8bit.tflite"), "--board", board, "--inputs", "4",
               "-o", str(tmp_path), "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and rep["bit_exact"] and rep["samples"] == 4, rep
    assert rep["compared_against"] == ["Kiln's reference executor", "TensorFlow Lite Micro's interpreter"]
    assert "int8 state" in rep["litert_skipped"] and all(c["match"] for c in rep["checks"])


def test_state_saved_early_unless_read_later(tmp_path):
    """A state's next value is saved right after the command computing it (its arena bytes free
    again), unless a later command still reads the current state: then at the end of the run."""
    g = svdf_graph(2, 3, 4, 3, 2, dtype="float32")
    early = _host(g, tmp_path / "early")
    src = open(tmp_path / "early" / "model.c").read()
    assert "kiln_state_save(arena, i);" in src
    late = g.copy()
    late.add_node("relu", ["st"], name="old")          # reads the state after svdf_state ran
    late.outputs = ["y", "old"]
    pkg = _host(late, tmp_path / "late")
    assert "kiln_state_save" not in open(tmp_path / "late" / "model.c").read()
    _check_stream(late, pkg, inputs(late, STEPS, 4), exact=False)
    _check_stream(g, early, inputs(g, STEPS, 4), exact=False)
    assert early.manifest.arena_bytes < pkg.manifest.arena_bytes
