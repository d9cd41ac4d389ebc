"""Training on the host: the digits demo's accuracy and time, and the time per training step of
every zoo model at one batch size next to PyTorch CPU eager on the same architecture.

Kiln step = the step graph (forward + loss + backward, NumPy reference executor) + the NumPy Adam
update. PyTorch step = a hand-written ``torch.nn`` model (NCHW, idiomatic eager PyTorch) with the
same layers, initialised with Kiln's weights (the eval-mode outputs are checked to agree first),
forward + loss + ``backward()`` + ``torch.optim.Adam.step()``. Same batch, same thread count
(BLAS via threadpoolctl, ``torch.set_num_threads``), median of ``--iters`` steps after warm-up.

    python benchmarks/train_bench.py --threads 1 --batch 64 --iters 10 --write
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np

from kiln.docs_util import add_write_argument, script_main, write_path, write_section

SECTION = "## Training (host)"


# ---- PyTorch twins of the zoo models ------------------------------------------------------------
def torch_models():
    """{zoo name: the PyTorch twin's class} (benchmarks/torch_twins.py; torch imported here)."""
    import torch_twins
    return torch_twins.MODELS


def copy_weights(kmodule, tmodel):
    """Kiln (OHWI conv weights) -> torch (OIHW); parameters and buffers pair up in order."""
    import torch
    kp = [p.data for _, p in kmodule.named_parameters()]
    tp = list(tmodel.parameters())
    kb = [b.data for _, b in kmodule.named_buffers()]
    tb = [b for n, b in tmodel.named_buffers() if not n.endswith("num_batches_tracked")]
    if [tuple(t.shape) for t in tp] != [(a.shape[0], a.shape[3], a.shape[1], a.shape[2]) if a.ndim == 4 else a.shape for a in kp]:
        raise RuntimeError("torch twin does not match the Kiln model's parameters")
    with torch.no_grad():
        for a, t in zip(kp, tp):
            t.copy_(torch.from_numpy(a.transpose(0, 3, 1, 2).copy() if a.ndim == 4 else a))
        for a, t in zip(kb, tb):
            t.copy_(torch.from_numpy(a))


def to_nchw(x):
    return x.transpose(0, 3, 1, 2).copy() if x.ndim == 4 else x


# ---- timing -------------------------------------------------------------------------------------
def time_kiln(zm, batch, iters, x, y):
    from kiln.training import Adam, StepGraph
    sg = StepGraph(zm.module, zm.loss, zm.input_shape[1:], batch)
    params = {k: p.data.copy() for k, p in zm.module.named_parameters()}
    bufs = {k: b.data.copy() for k, b in zm.module.named_buffers()}
    opt = Adam(params, 1e-3)
    ts = []
    for i in range(iters + 2):
        t0 = time.perf_counter()
        _, _, grads, upd = sg(params, bufs, x, y, dropout_key=i)
        bufs.update(upd)
        opt.step(grads)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[2:]), len(sg.graph.nodes)


def time_torch(tmodel, loss_name, iters, x, y):
    import torch
    import torch.nn.functional as TF
    xt = torch.from_numpy(to_nchw(x))
    yt = None if y is None else torch.from_numpy(y)
    opt = torch.optim.Adam(tmodel.parameters(), 1e-3)
    tmodel.train()
    ts = []
    for _ in range(iters + 2):
        t0 = time.perf_counter()
        opt.zero_grad()
        out = tmodel(xt)
        loss = TF.cross_entropy(out, yt) if loss_name == "cross_entropy" else TF.mse_loss(out, xt)
        loss.backward()
        opt.step()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[2:])


def check_twin(zm, tmodel, x):
    import torch

    from kiln.frontend import run, trace
    zm.module.eval()
    tmodel.eval()
    want = run(trace(zm.module, zm.input_shape), x[:1])[0]
    with torch.no_grad():
        got = tmodel(torch.from_numpy(to_nchw(x[:1]))).numpy()
    zm.module.train()
    return float(np.max(np.abs(got - want)) / max(1e-6, float(np.max(np.abs(want)))))


def bench_steps(batch, iters, names):
    import torch

    from kiln import frontend as kf
    from kiln.training import zoo
    rows = []
    twins = torch_models()
    for name in names:
        kf.manual_seed(0)
        zm = zoo.get(name)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch,) + tuple(zm.input_shape[1:])).astype(np.float32)
        if name == "digits-cnn":
            x = rng.random(x.shape).astype(np.float32)
        y = rng.integers(0, zm.num_classes, batch) if zm.num_classes else None
        tmodel = twins[name]()
        copy_weights(zm.module, tmodel)
        err = check_twin(zm, tmodel, x)
        torch.manual_seed(0)
        k_s, nodes = time_kiln(zm, batch, iters, x, y)
        t_s = time_torch(tmodel, zm.loss, iters, x, y)
        rows.append({"model": name, "params": sum(p.data.size for p in zm.module.parameters()), "nodes": nodes,
                     "kiln_ms": k_s * 1e3, "torch_ms": t_s * 1e3, "ratio": k_s / t_s, "twin_err": err})
        print(f"{name:18s} kiln {k_s * 1e3:9.1f} ms  torch {t_s * 1e3:8.1f} ms  ratio {k_s / t_s:6.1f}  "
              f"(twin rel err {err:.1e})", flush=True)
    return rows


def bench_digits(seeds):
    from kiln.training import train_digits
    rows = []
    for s in seeds:
        t0 = time.perf_counter()
        r = train_digits(seed=s)
        wall = time.perf_counter() - t0
        rows.append({"seed": s, "test_acc": r.metrics["test_acc"], "epochs": len(r.history), "steps": r.steps,
                     "fit_s": r.seconds, "wall_s": wall})
        print(f"digits seed {s}: test acc {r.metrics['test_acc']:.4f} in {wall:.1f} s ({r.steps} steps)", flush=True)
    return rows


def render(digits, steps, args, cmd):
    import torch

    from kiln.training.demo import DIGITS_RECIPE as R
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [SECTION, "",
             f"`{cmd}` on {platform.machine()} with {os.cpu_count()} cores (shared; load average {load:.1f} at the "
             f"end of the run), Python {platform.python_version()}, NumPy {np.__version__}, PyTorch "
             f"{torch.__version__.split('+')[0]}, {datetime.date.today().isoformat()}. Numbers are from one run.", ""]
    if digits:
        lines += [f"Digits demo (`kiln.training.train_digits`, zoo `digits-cnn`, 3,818 parameters): {R.epochs} epochs "
                  f"of batch {R.batch_size}, Adam lr {R.lr} with a cosine schedule, label smoothing {R.label_smoothing}, "
                  f"augmentation `{R.augment}`, {R.threads} BLAS thread; fixed split of 1,437 training / 360 test "
                  f"images. Target: >= 97% test accuracy in under 60 s.", "",
                  "| seed | test accuracy | steps | wall time (s) | target |", "|---|---|---|---|---|"]
        for d in digits:
            ok = "met" if d["test_acc"] >= 0.97 and d["wall_s"] < 60 else "MISSED"
            lines.append(f"| {d['seed']} | {d['test_acc'] * 100:.2f}% | {d['steps']} | {d['wall_s']:.1f} | {ok} |")
        lines.append("")
    if steps:
        lines += [f"Time per training step at batch {args.batch} with {args.threads} thread(s), median of {args.iters} "
                  f"steps after 2 warm-up steps. Kiln: step graph (forward in train mode + loss + backward) on the "
                  f"NumPy reference executor + NumPy Adam. PyTorch: the same architecture as an idiomatic NCHW "
                  f"`torch.nn` model, eager, with Kiln's initial weights (eval outputs agree to the 'twin error' "
                  f"shown), + `torch.optim.Adam`. Synthetic inputs of each model's shape.", "",
                  "| model | parameters | step-graph nodes | Kiln ms / step | PyTorch eager ms / step | Kiln / PyTorch | twin error |",
                  "|---|---|---|---|---|---|---|"]
        for r in steps:
            lines.append(f"| {r['model']} | {r['params']:,} | {r['nodes']} | {r['kiln_ms']:.1f} | {r['torch_ms']:.1f} | "
                         f"{r['ratio']:.1f}x | {r['twin_err']:.0e} |")
        lines.append("")
    lines += ["The NumPy executor interprets the graph node by node with the float reference kernels "
              "(convolutions as im2col + one matmul, depthwise as a multiply-accumulate per tap); PyTorch "
              "runs fused oneDNN kernels. For faster steps use the compiled `host-llvm` target (see Server "
              "targets).", ""]
    return "\n".join(lines)




def main(argv=None):
    from kiln.training import zoo
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64, help="batch size of the timed steps (default: 64)")
    p.add_argument("--threads", type=int, default=1, help="BLAS / torch threads (default: 1)")
    p.add_argument("--iters", type=int, default=10, help="timed steps per model, after 2 warm-up steps (default: 10)")
    p.add_argument("--models", default=",".join(zoo.names()), help="comma-separated zoo models (default: all)")
    p.add_argument("--seeds", default="0,1,2", help="digits seeds ('' to skip)")
    add_write_argument(p, SECTION)
    args = p.parse_args(argv)
    md_path = write_path(args.write)
    import torch
    from threadpoolctl import threadpool_limits
    torch.set_num_threads(args.threads)
    with threadpool_limits(limits=args.threads, user_api="blas"):
        digits = bench_digits([int(s) for s in args.seeds.split(",") if s])
        steps = bench_steps(args.batch, args.iters, [m for m in args.models.split(",") if m])
    cmd = "python benchmarks/train_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = render(digits, steps, args, cmd.strip())
    print(text)
    if md_path:
        write_section(md_path, text)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
