"""Mixed precision of half-precision CUDA training steps (backends/tvm_te.py ``precision_plan``,
``apply_loss_scale``; backends/cuda.py): the per-value storage policy, the loss scaling, the
manifest's ``precision`` entry, and steps run by the CPU plan interpreter (cuda-plan: the
package's own kernels on its half-precision arena) against float64."""
import json
import os

import numpy as np
import pytest

import kiln
from kiln import F, nn
from kiln.backends import cuda, cuda_plan, cuda_sim, tvm_te
from kiln.frontend import executor
from kiln.frontend.errors import KilnError
from tests.backends.server_models import make


def _cnn_step():
    return make("cnn", batch=4)


def test_policy_stores_matmul_operands_in_half_and_the_rest_in_float32():
    _, step, _, _ = _cnn_step()
    plan = tvm_te.precision_plan(step, "float16", "mixed")
    uses = step.consumers()
    for n in step.nodes:
        assert plan.compute[n.name] == ("float16" if n.op in tvm_te.HALF_OPS else "float32"), n
    for v, t in step.types.items():
        if t.dtype != "float32":
            assert plan.storage[v] == t.dtype, v                  # int labels, bool masks: unchanged
        elif v in step.outputs or v in step.updates or v in step.updates.values():
            assert plan.storage[v] == "float32", v                # master gradients, loss, BN buffers
        elif getattr(step.producer(v), "op", None) in tvm_te.HALF_OPS or \
                (uses[v] and all(n.op in tvm_te.HALF_OPS for n in uses[v])):
            assert plan.storage[v] == "float16", v
        else:
            assert plan.storage[v] == "float32", v
    # what that means on the CNN: the input and the conv/dense weights in half, BatchNorm's affine
    # parameters and the statistics' reductions in float32, convolution outputs in half
    conv = [n for n in step.nodes if n.op == "conv2d"]
    assert plan.storage["x"] == "float16" and all(plan.storage[n.inputs[1]] == "float16" for n in conv)
    assert {plan.storage[p] for p in step.params} == {"float16", "float32"}
    assert conv and all(plan.storage[n.name] == "float16" for n in conv)
    reductions = [n.name for n in step.nodes if n.op in ("mean", "sum") and n.name not in step.outputs]
    assert reductions and all(plan.storage[r] == "float32" and plan.compute[r] == "float32" for r in reductions)
    # "uniform": every float32 value in the half dtype (the inference default)
    uni = tvm_te.precision_plan(step, "bfloat16", "uniform")
    assert {uni.storage[v] for v, t in step.types.items() if t.dtype == "float32"} == {"bfloat16"}
    with pytest.raises(KilnError, match="precision must be one of"):
        tvm_te.precision_plan(step, "float16", "amp")


def test_loss_scale_changes_no_gradient():
    """Scaling the seed by 2^k and each gradient by 2^-k is exact in binary floating point: the
    float32 NumPy step gives the same bits."""
    _, step, x, t = _cnn_step()
    scaled = tvm_te.apply_loss_scale(step, 4096.0)
    assert scaled.outputs == step.outputs and scaled.meta["loss_scale"] == 4096.0
    seed = [c for c in step.consts if c.startswith("seed_")][0]
    assert float(scaled.consts[seed]) == 4096.0 and float(step.consts[seed]) == 1.0
    for o in cuda_sim.gradient_outputs(step):
        assert scaled.producer(o).op == "mul" and scaled.producer(o).inputs[0] == f"{o}.scaled"
    for a, b in zip(executor.run(step, x, t), executor.run(scaled, x, t)):
        assert np.array_equal(a, b)
    assert tvm_te.apply_loss_scale(step, 1.0) is step
    with pytest.raises(KilnError, match="power of two"):
        tvm_te.apply_loss_scale(step, 1000.0)


def test_manifest_lists_the_storage_of_every_value(tmp_path):
    _, step, _, _ = _cnn_step()
    pkg = cuda.compile_train_step(step, str(tmp_path / "step"), dtype="float16", check=False)
    m = cuda.check_package(pkg)
    p = m.extra["precision"]
    assert m.dtype == "float16" and p["policy"] == "mixed" and p["loss_scale"] == tvm_te.LOSS_SCALE["float16"]
    want = tvm_te.precision_plan(tvm_te.apply_loss_scale(step, p["loss_scale"]), "float16", "mixed")
    assert p["storage"] == {v: d for v, d in want.storage.items() if d in cuda_plan.DTYPES}
    assert {o.dtype for o in m.outputs} | {u.dtype for u in m.updates} == {"float32"}
    assert {w.dtype for w in m.weights} == {"float16", "float32"}
    assert all(w.dtype == want.storage[w.name] for w in m.weights)
    assert {"float16", "float32"} <= set(p["buffer_bytes_by_dtype"])       # int32: labels, argmax temporaries
    # inference packages keep one storage dtype ("uniform"), float32 packages have no entry
    mlp = make("mlp")[0]
    inf = cuda.load_manifest(cuda.compile(mlp, str(tmp_path / "fwd"), dtype="float16", check=False))
    assert inf.extra["precision"]["policy"] == "uniform" and {w.dtype for w in inf.weights} == {"float16"}
    assert "precision" not in cuda.load_manifest(cuda.compile(mlp, str(tmp_path / "f32"), check=False)).extra


class _SmallGradNet(nn.Module):
    def __init__(self):
        self.l1 = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.l2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.l2(F.relu(self.bn(self.l1(x))))


def _small_gradient_step(batch=32):
    """A training step whose gradients are ~1e-7 (a loss weighted by 1e-6): under float16's
    smallest normal (6.1e-5), where storage without loss scaling loses them."""
    kiln.frontend.manual_seed(0)
    m = _SmallGradNet()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 16)).astype(np.float32)
    y = rng.standard_normal((batch, 4)).astype(np.float32)

    def loss_fn(x, y):
        d = m(x) - y
        return F.mean(d * d) * 1e-6
    step = kiln.grad(kiln.trace(loss_fn, x, y, name="small_grad_loss", input_names=["x", "y"]), name="small_step")
    return step, [x, y]


def _err64(tmp_path, step, inputs, **kw):
    pkg = cuda.compile_train_step(step, str(tmp_path / "-".join(map(str, kw.values()))), check=False, **kw)
    got = cuda_plan.interpret_plan(pkg, inputs)
    want, _ = cuda_sim.reference64(step, inputs)
    return max(cuda_sim.errors64(step, got, want).values()), cuda.load_manifest(pkg)


def test_small_gradients_need_loss_scaling_in_float16(tmp_path):
    """Failed before mixed precision: every value in float16, the step's gradients are subnormal
    or flushed to zero and come out far off float64; the mixed-precision package (float32 master
    gradients, BatchNorm and the loss in float32, the backward scaled by the loss scale) is within
    float16's bound."""
    step, inputs = _small_gradient_step()
    tol = cuda_sim.TOLERANCE64["float16"]
    uniform, m = _err64(tmp_path, step, inputs, dtype="float16", precision="uniform")
    assert {o.dtype for o in m.outputs} == {"float16"}          # the interpreter ran half storage
    assert uniform > tol, uniform
    mixed, m = _err64(tmp_path, step, inputs, dtype="float16", precision="mixed")
    assert {o.dtype for o in m.outputs} == {"float32"} and m.extra["precision"]["loss_scale"] > 1
    assert mixed <= tol, mixed


@pytest.mark.slow
def test_the_loss_scale_is_what_keeps_small_gradients_and_bfloat16_needs_none(tmp_path):
    step, inputs = _small_gradient_step()
    mixed, _ = _err64(tmp_path, step, inputs, dtype="float16", precision="mixed")
    no_scale, _ = _err64(tmp_path, step, inputs, dtype="float16", precision="mixed", loss_scale=1.0)
    assert no_scale > cuda_sim.TOLERANCE64["float16"] > mixed, (no_scale, mixed)
    bf16, m = _err64(tmp_path, step, inputs, dtype="bfloat16", precision="mixed")
    assert m.extra["precision"]["loss_scale"] == 1.0 and bf16 <= cuda_sim.TOLERANCE64["bfloat16"], bf16


ZOO_WITHIN_BOUND = [("digits-cnn", "float16"), ("digits-cnn", "bfloat16"), ("resnet8", "float16"),
                    ("resnet8", "bfloat16"), ("ds-cnn", "bfloat16")]


@pytest.mark.slow
@pytest.mark.parametrize("model,dtype", ZOO_WITHIN_BOUND, ids=[f"{m}-{d}" for m, d in ZOO_WITHIN_BOUND])
def test_zoo_mixed_precision_step_within_its_float64_bound(tmp_path, model, dtype):
    """The zoo's half training steps at batch 64 that meet their bound under mixed precision
    (docs/server_targets.md "Mixed precision" has the table, fc-autoencoder's and the rest)."""
    from benchmarks import cuda_mixed_precision, cuda_sim_zoo
    graph, inputs = cuda_sim_zoo.zoo_case(model, 64, True)
    want, _ = cuda_sim.reference64(graph, inputs)
    _, peer, _ = cuda_sim.bounds64(graph, inputs, want, None, "float32")
    r = cuda_mixed_precision.run_case(graph, inputs, want, peer, dtype, "mixed", str(tmp_path))
    assert r["ok"] and r["precision"] == "mixed", r


# ---- kiln compile --precision -------------------------------------------------------------------
def _cli(argv, capsys):
    from kiln.cli import main
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_precision_choices_are_the_policies():
    from kiln.commands import compile as compile_cmd
    assert compile_cmd.PRECISIONS == tvm_te.PRECISIONS


@pytest.mark.parametrize("flag,policy", [([], "mixed"), (["--precision", "uniform"], "uniform"),
                                         (["--precision", "mixed"], "mixed")])
def test_kiln_compile_precision_chooses_the_storage_policy(tmp_path, capsys, flag, policy):
    """A training step defaults to mixed precision; --precision uniform|mixed chooses; --json keeps
    its keys, the manifest records the policy and the storage follows it."""
    from kiln.frontend import save
    _, step, _, _ = make("mlp", batch=4)
    model, out = str(tmp_path / "step.json"), str(tmp_path / "pkg")
    save(step, model)
    code, text, _ = _cli(["compile", model, "--target", "cuda", "--dtype", "float16", "-o", out, "--json"] + flag,
                         capsys)
    assert code == 0
    rep = json.loads(text)
    assert set(rep) == {"model", "target", "arch", "dtype", "package", "launches", "kernels", "arena_bytes",
                        "weight_bytes", "compile_seconds", "resources", "semantics", "ok", "command"}
    assert rep["semantics"] is None         # a float package follows no integer semantics
    prec = cuda_plan.load_manifest(out).extra["precision"]
    assert prec["policy"] == policy
    want = tvm_te.precision_plan(step, "float16", policy).storage
    assert all(prec["storage"][v] == d for v, d in want.items() if v in prec["storage"]) and "x" in prec["storage"]
    assert len(set(prec["storage"].values())) == (2 if policy == "mixed" else 1)
    code, text, _ = _cli(["compile", model, "--target", "cuda", "--dtype", "float16", "-o", out] + flag, capsys)
    assert code == 0 and f"float16, {policy} precision" in text


@pytest.mark.parametrize("argv,words", [
    (["--target", "cuda", "--precision", "mixed"], ["--dtype float32", "--dtype float16"]),
    (["--target", "cortex-m4", "--precision", "uniform"], ["--target cuda", "cortex-m4"]),
    (["--target", "cuda", "--dtype", "float16", "--precision", "half"], ["invalid choice", "'half'"]),
])
def test_kiln_compile_precision_refuses_what_it_cannot_apply(tmp_path, capsys, argv, words):
    from kiln.frontend import save
    fwd, _, _, _ = make("mlp")
    model, out = str(tmp_path / "fwd.json"), str(tmp_path / "pkg")
    save(fwd, model)
    try:
        code, text, err = _cli(["compile", model, "-o", out] + argv, capsys)
    except SystemExit as e:              # argparse: an invalid choice
        code, err = e.code, capsys.readouterr().err
        text = ""
    assert code == 2 and all(w in err + text for w in words), err
    assert not os.path.exists(out)


def test_kiln_compile_precision_refuses_a_quantised_model(tmp_path, capsys):
    from kiln.frontend import save
    from kiln.quantize import ptq
    fwd, _, x, _ = make("mlp")
    q = ptq(fwd, np.random.default_rng(0).standard_normal((8,) + x.shape[1:]).astype(np.float32))
    model, out = str(tmp_path / "q.json"), str(tmp_path / "pkg")
    save(q, model)
    code, _, err = _cli(["compile", model, "--target", "cuda", "--dtype", "float16", "--precision", "uniform",
                         "-o", out], capsys)
    assert code == 2 and "quantised" in err and "--precision" in err and not os.path.exists(out)
    with pytest.raises(KilnError, match="quantised"):
        cuda.compile(q, str(tmp_path / "p2"), precision="mixed", check=False)
