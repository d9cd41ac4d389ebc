"""``fit``: the training loop.

Each optimiser step: the learning rate comes from the schedule; ``accum_steps`` micro-batches
run through the step graph (forward + loss + backward in one graph) and their gradients are
accumulated with weights n_i / n; BatchNorm buffers take the graph's updates; the global gradient
norm is measured (and clipped with ``grad_clip``); a non-finite loss or norm stops the run after a
check-mode re-run names the node, and a loss exploding against its running minimum stops it
naming the first layer whose gradient norm blew up (``divergence_factor``); the optimiser updates
the parameters in NumPy. At each epoch's end the test set is evaluated, a record goes to the
history (and the JSON-lines log) and, with an output folder, a checkpoint is taken (also every
``checkpoint_every`` steps). A checkpoint reaches the disk once the next step has passed the
divergence checks, so a diverged run leaves its last good checkpoint.

Determinism: everything random comes from two generators spawned from ``seed`` (the data loader's
shuffling and augmentation; the dropout keys), and the model's initial weights come from
``kiln.frontend.manual_seed``. The same seed, data, NumPy/BLAS build and thread count give a
bit-identical run; resuming from a checkpoint restores the generators' full states, so a resumed
run ends with exactly the parameters of an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from kiln.frontend.errors import KilnError, UsageError
from kiln.frontend.files import ensure_output_dir
from kiln.frontend.module import Module
from kiln.frontend.serialize import save as save_graph
from kiln.frontend.trace import trace
from kiln.frontend.types import TensorType

from . import checkpoint as ckpt
from .config import RESUMABLE_CHANGES, TrainConfig
from .data import ArrayDataset, DataError, DataLoader, parse_augment
from .losses import get_loss
from .monitor import (
    DivergenceMonitor,
    MetricsLog,
    Progress,
    TrainingDiverged,
    clip_by_global_norm,
    diagnose,
    global_norm,
    layer_norms,
    progress_enabled,
    squared_norms,
)
from .optim import make_optimizer
from .schedule import Schedule
from .step import REFERENCE, EvalGraph, GraphCache, StepGraph, resolve_backend


@dataclasses.dataclass
class FitResult:
    module: Module          # the trained model, in eval mode
    graph: object           # eval-mode Graph of the trained model (batch = input_shape[0])
    metrics: dict           # the last epoch's record (+ steps, seconds)
    history: list
    steps: int
    seconds: float
    files: dict
    config: TrainConfig | None = None


def _classes_correct(pred, y):
    return int(np.sum(np.argmax(pred, axis=-1) == y))


def evaluate(model, dataset: ArrayDataset, loss="cross_entropy", batch_size=512, params=None, buffers=None,
             cache=None):
    """Mean loss (and accuracy for class labels) of ``model`` in eval mode over ``dataset``."""
    _, kind = get_loss(loss)
    params = params if params is not None else {k: p.data for k, p in model.named_parameters()}
    buffers = buffers if buffers is not None else {k: b.data for k, b in model.named_buffers()}
    sample = dataset.x.shape[1:]
    tshape = None if dataset.y is None else dataset.y.shape[1:]
    cache = cache or GraphCache(lambda b: EvalGraph(model, sample, b, loss=loss, target_shape=tshape))
    tot, correct, n = 0.0, 0, len(dataset)
    for i in range(0, n, batch_size):
        x = dataset.x[i:i + batch_size]
        y = None if dataset.y is None else dataset.y[i:i + batch_size]
        g = cache[len(x)]
        lo, pred = g(params, buffers, x.astype(g.dtype, copy=False), y)
        tot += lo * len(x)
        if kind == "labels":
            correct += _classes_correct(pred, y)
    out = {"loss": tot / max(n, 1)}
    if kind == "labels":
        out["accuracy"] = correct / max(n, 1)
    return out


class _Run:
    """Mutable state of one run (what a checkpoint holds)."""

    def __init__(self, model, cfg, params, buffers, opt, sched, loader, step_rng):
        self.model, self.cfg = model, cfg
        self.params, self.buffers, self.opt, self.sched = params, buffers, opt, sched
        self.loader, self.step_rng = loader, step_rng
        self.epoch = self.step = 0
        self.history = []
        self.acc = {"loss_sum": 0.0, "correct": 0, "count": 0, "gnorm_sum": 0.0, "gnorm_max": 0.0, "steps": 0}
        self.elapsed = 0.0
        self.monitor = DivergenceMonitor(cfg.divergence_factor, {k: type(m).__name__ for k, m in model.named_modules()})
        self.ckpt = ckpt.Checkpointer(None)

    def pack(self, model_name):
        ld = self.loader.state_dict()
        osd = self.opt.state_dict()
        meta = {"model": model_name, "config": dataclasses.asdict(self.cfg), "epoch": self.epoch,
                "step": self.step, "params": {k: list(v.shape) for k, v in self.params.items()},
                "buffers": {k: list(v.shape) for k, v in self.buffers.items()},
                "optimizer": {"config": osd["config"], "t": osd["t"]}, "schedule": self.sched.config(),
                "rng": {"loader": ld["rng"], "step": self.step_rng.bit_generator.state},
                "loader": {"epoch": ld["epoch"], "pos": ld["pos"], "has_perm": ld["perm"] is not None},
                "acc": self.acc, "history": self.history, "elapsed": self.elapsed,
                "monitor": self.monitor.state_dict()}
        arrays = {f"param/{k}": v for k, v in self.params.items()}
        arrays.update({f"buffer/{k}": v for k, v in self.buffers.items()})
        for slot, d in osd["slots"].items():
            arrays.update({f"opt/{slot}/{k}": v for k, v in d.items()})
        if ld["perm"] is not None:
            arrays["loader/perm"] = ld["perm"]
        return meta, arrays

    def unpack(self, meta, arrays, model_name, path):
        problems = []
        if meta.get("model") != model_name:
            problems.append(f"model {meta.get('model')!r} (this run: {model_name!r})")
        old = meta.get("config", {})
        for k, v in dataclasses.asdict(self.cfg).items():
            if k not in RESUMABLE_CHANGES and old.get(k) != v:
                problems.append(f"{k}={old.get(k)!r} (this run: {v!r})")
        for kind, own in (("params", self.params), ("buffers", self.buffers)):
            want = {k: list(v.shape) for k, v in own.items()}
            if meta.get(kind) != want:
                problems.append(f"{kind} differ (checkpoint: {meta.get(kind)}, model: {want})")
        if problems:
            raise ckpt.CheckpointError(f"{path} does not fit this run: " + "; ".join(problems)
                                       + ". Resume with the same options, or start a new run in another --out")
        try:
            for k in self.params:
                self.params[k][...] = arrays[f"param/{k}"]
            for k in self.buffers:
                self.buffers[k] = arrays[f"buffer/{k}"].astype(self.buffers[k].dtype)
            slots = {}
            for name, v in arrays.items():
                if name.startswith("opt/"):
                    _, slot, k = name.split("/", 2)
                    slots.setdefault(slot, {})[k] = v
            self.opt.load_state_dict({"config": meta["optimizer"]["config"], "t": meta["optimizer"]["t"],
                                      "slots": slots})
            ld = meta["loader"]
            self.loader.load_state_dict({"rng": meta["rng"]["loader"], "epoch": ld["epoch"], "pos": ld["pos"],
                                         "perm": arrays["loader/perm"] if ld["has_perm"] else None})
            self.step_rng.bit_generator.state = meta["rng"]["step"]
            self.sched = Schedule.from_config(meta["schedule"])
            self.epoch, self.step = int(meta["epoch"]), int(meta["step"])
            self.acc, self.history, self.elapsed = dict(meta["acc"]), list(meta["history"]), float(meta["elapsed"])
            self.monitor.load_state_dict(meta.get("monitor", {}))     # absent in checkpoints of older Kilns
        except (KeyError, ValueError, TypeError, KilnError) as e:
            raise ckpt.CheckpointError(f"{path}: incomplete or incompatible checkpoint ({type(e).__name__}: {e})") from None


# files a run writes in its output folder (report.json is written by `kiln train`)
RUN_FILES = ("checkpoint.npz", "metrics.jsonl", "model.json", "model.npz", "report.json")


def fit(model: Module, train: ArrayDataset, test: ArrayDataset | None = None, *, input_shape=None,
        config: TrainConfig | None = None, out=None, resume=False, force=False, quiet=True, model_name=None,
        **overrides) -> FitResult:
    """Train ``model`` on ``train`` (evaluating on ``test`` after every epoch) and return a
    :class:`FitResult`. Options are the fields of :class:`TrainConfig`, given as ``config`` and/or
    keyword overrides. With ``out`` (a folder) it writes ``checkpoint.npz``, ``metrics.jsonl`` and,
    at the end, the trained eval-mode graph ``model.json``/``model.npz`` (``kiln.frontend.load``
    reads it); ``resume=True`` continues from ``out/checkpoint.npz``. A folder that already holds
    a run is refused (UsageError) unless ``resume`` or ``force`` (which deletes the old run's files).
    ``backend``: "numpy" (the reference executor) or a step compiler (``kiln.step_compiler(name)``);
    the run's configuration records its name."""
    cfg = dataclasses.replace(config or TrainConfig(), **overrides)
    compiler = resolve_backend(cfg.backend)
    cfg = dataclasses.replace(cfg, backend=compiler.name if compiler is not None else REFERENCE)
    args = (model, train, test, input_shape, cfg, out, resume, force, quiet, model_name, compiler)
    if cfg.threads:
        from threadpoolctl import threadpool_limits
        with threadpool_limits(limits=int(cfg.threads), user_api="blas"):
            return _fit(*args)
    return _fit(*args)


def existing_run(out):
    """The run files already in folder ``out`` (empty when none, or no folder)."""
    return [f for f in RUN_FILES if out and os.path.exists(os.path.join(out, f))]


def _prepare_out(out, resume, force):
    """Check that ``out`` can be written and may be used; with ``force`` delete an old run there."""
    if not out:
        if resume:
            raise UsageError("resume needs an output folder holding checkpoint.npz (--out)")
        return
    if resume and not os.path.isdir(out):
        return                  # nothing to resume: loading the checkpoint says so
    ensure_output_dir(out, "training output folder")
    old = existing_run(out)
    if resume or not old:
        return
    if not force:
        raise UsageError(f"{out} already holds a training run ({', '.join(old)}): continue it with --resume "
                         f"(resume=True), replace it with --force (force=True), or choose another --out")
    for f in old + ["checkpoint.npz.tmp"]:
        try:
            os.remove(os.path.join(out, f))
        except FileNotFoundError:
            pass


def _check_data(train, test, sample, kind, cfg):
    for ds in (train, test):
        if ds is None:
            continue
        if tuple(ds.x.shape[1:]) != sample:
            raise DataError(f"dataset {ds.name!r} has samples of shape {ds.x.shape[1:]}, the model takes {sample}")
        if kind == "labels" and (ds.y is None or ds.y.dtype.kind not in "iu"):
            raise DataError(f"loss {cfg.loss!r} needs integer class labels; dataset {ds.name!r} has "
                            f"{'none' if ds.y is None else ds.y.dtype}")
        ds.check_finite()


def _fit(model, train, test, input_shape, cfg, out, resume, force, quiet, model_name, compiler):
    model_name = model_name or type(model).__name__
    _, kind = get_loss(cfg.loss)
    sample = tuple(input_shape[1:]) if input_shape else tuple(train.x.shape[1:])
    _check_data(train, test, sample, kind, cfg)
    tshape = None if train.y is None else tuple(train.y.shape[1:])

    params = {k: p.data.copy() for k, p in model.named_parameters()}
    buffers = {k: b.data.copy() for k, b in model.named_buffers()}
    dtype = next(iter(params.values())).dtype if params else np.dtype("float32")
    loader_ss, step_ss = np.random.SeedSequence(cfg.seed).spawn(2)
    loader = DataLoader(train, cfg.batch_size, shuffle=True, drop_last=cfg.drop_last,
                        seed=np.random.default_rng(loader_ss), augment=parse_augment(cfg.augment), dtype=dtype)
    steps_per_epoch = -(-len(loader) // cfg.accum_steps)
    total = steps_per_epoch * cfg.epochs      # max_steps only stops early: the schedule is that of the full run
    sched = Schedule(cfg.schedule, cfg.lr, step_size=cfg.step_size or max(1, total // 3), gamma=cfg.gamma,
                     total=max(1, total - cfg.warmup_steps), min_lr=cfg.min_lr, warmup=cfg.warmup_steps)
    opt = make_optimizer(cfg.optimizer, params, cfg.lr, cfg.momentum, cfg.nesterov, cfg.weight_decay)
    run = _Run(model, cfg, params, buffers, opt, sched, loader, np.random.default_rng(step_ss))
    _prepare_out(out, resume, force)        # after every option is checked: a bad one leaves no folder behind

    files = {}
    ck_path = os.path.join(out, "checkpoint.npz") if out else None
    log = MetricsLog(os.path.join(out, "metrics.jsonl") if out else None)
    if resume:
        meta, arrays = ckpt.load(ck_path)
        run.unpack(meta, arrays, model_name, ck_path)
        log.rewrite(run.history)
    elif out:
        log.rewrite([])
    run.ckpt = ckpt.Checkpointer(ck_path)
    run.ckpt.written_step = run.step if resume else None

    backend = compiler or REFERENCE
    steps = GraphCache(lambda b: StepGraph(model, cfg.loss, sample, b, tshape, cfg.label_smoothing, dtype,
                                           backend=backend))
    evals = GraphCache(lambda b: EvalGraph(model, sample, b, loss=cfg.loss, target_shape=tshape, dtype=dtype,
                                           backend=backend))
    _train(run, steps, evals, test, kind, log, quiet, model_name)
    if ck_path:
        run.ckpt.take(*run.pack(model_name))
        run.ckpt.flush()
        files["checkpoint"] = ck_path
        files["metrics"] = log.path

    model.load_state_dict({**run.params, **run.buffers})
    model.eval()
    shape = tuple(input_shape) if input_shape else (1,) + sample
    graph = trace(model, TensorType(shape, dtype.name), name=model_name.replace("-", "_"))
    if out:
        files["graph"] = save_graph(graph, os.path.join(out, "model.json"))
    metrics = dict(run.history[-1]) if run.history else {}
    metrics.update(steps=run.step, seconds=round(run.elapsed, 3))
    return FitResult(model, graph, metrics, run.history, run.step, run.elapsed, files, cfg)


def _train(run, steps, evals, test, kind, log, quiet, model_name):
    """The epochs of a run; checkpoints are taken after every ``checkpoint_every`` steps and at each
    epoch's end, and written once the following step passed the divergence checks."""
    cfg, loader = run.cfg, run.loader
    t0 = time.perf_counter() - run.elapsed
    bar = Progress(progress_enabled(quiet), cfg.epochs, run.epoch)
    try:
        while run.epoch < cfg.epochs and not (cfg.max_steps and run.step >= cfg.max_steps):
            bar.start_epoch(run.epoch, len(loader), loader.pos)
            ended = False
            while not ended:
                if cfg.max_steps and run.step >= cfg.max_steps:
                    break
                group = []
                while len(group) < cfg.accum_steps:
                    b = loader.next_batch()
                    if b is None:
                        ended = True
                        break
                    group.append(b)
                if group:
                    _one_step(run, steps, group, bar)
                    run.elapsed = time.perf_counter() - t0
                    if cfg.checkpoint_every and run.step % cfg.checkpoint_every == 0:
                        run.ckpt.take(*run.pack(model_name))
            if not ended:
                break
            rec = _end_epoch(run, test, evals, kind, cfg)
            run.elapsed = time.perf_counter() - t0
            rec["seconds"] = round(run.elapsed, 3)
            run.history.append(rec)
            run.ckpt.take(*run.pack(model_name))
            log.append(rec)
            bar.end_epoch(rec)
    except TrainingDiverged as e:
        e = _with_checkpoint_note(e, run)
        log.append({"event": "diverged", "epoch": run.epoch + 1, "step": run.step + 1, "node": e.node, "op": e.op,
                    "layer": e.layer, "error": str(e)})
        raise e from None
    except KeyboardInterrupt:
        run.ckpt.flush()            # the state taken last is as good as any: keep it for --resume
        raise
    finally:
        bar.close()
    run.elapsed = time.perf_counter() - t0


def _with_checkpoint_note(e, run):
    c = run.ckpt
    if not c.path:
        return e
    note = (f" The last good checkpoint (step {c.written_step}) is kept in {c.path}" if c.written_step is not None
            else " No checkpoint was written before the divergence")
    return TrainingDiverged(str(e).rstrip(".") + "." + note + ".", node=e.node, op=e.op, layer=e.layer)


def _one_step(run, steps, group, bar):
    cfg = run.cfg
    lr = run.sched(run.step)
    run.opt.lr = lr
    n = sum(len(x) for x, _ in group)
    total = None
    step_loss = 0.0
    where = f"epoch {run.epoch + 1}, step {run.step + 1}"
    for x, y in group:
        sg = steps[len(x)]
        key = int(run.step_rng.integers(0, 2**62)) if sg.has_dropout else None
        loss, pred, grads, upd = sg(run.params, run.buffers, x, y, key)
        if not np.isfinite(loss):
            diagnose(sg, run.params, run.buffers, x, y, key, where, run.monitor.blame()[0])
        run.buffers.update(upd)
        w = len(x) / n
        step_loss += float(loss) * w
        if total is None:
            total = grads if len(group) == 1 else {k: g * np.asarray(w, g.dtype) for k, g in grads.items()}
        else:
            for k, g in grads.items():
                total[k] += g * np.asarray(w, g.dtype)
        a = run.acc
        a["loss_sum"] += loss * len(x)
        a["count"] += len(x)
        if sg.target_kind == "labels":
            a["correct"] += _classes_correct(pred, y)
        bar.batch(loss)
    squares = squared_norms(total)
    norm = global_norm(total, squares)
    if not np.isfinite(norm):
        x, y = group[-1]
        diagnose(steps[len(x)], run.params, run.buffers, x, y, key, where, run.monitor.blame()[0])
    verdict = run.monitor.observe(run.step + 1, step_loss, layer_norms(squares))
    if verdict is not None:
        text, layer = verdict
        raise TrainingDiverged(f"training diverged at {where}: {text}. Lower the learning rate (--lr), enable "
                               f"gradient clipping (--grad-clip) or check the data", layer=layer)
    run.ckpt.confirm()              # the state before this step gave a healthy loss: write its checkpoint
    if cfg.grad_clip:
        total = clip_by_global_norm(total, cfg.grad_clip, norm)
    run.opt.step(total)
    run.step += 1
    run.acc["gnorm_sum"] += norm
    run.acc["gnorm_max"] = max(run.acc["gnorm_max"], norm)
    run.acc["steps"] += 1


def _end_epoch(run, test, evals, kind, cfg):
    a = run.acc
    rec = {"epoch": run.epoch + 1, "step": run.step, "lr": run.opt.lr,
           "train_loss": a["loss_sum"] / max(a["count"], 1),
           "grad_norm": a["gnorm_sum"] / max(a["steps"], 1), "grad_norm_max": a["gnorm_max"]}
    if kind == "labels":
        rec["train_acc"] = a["correct"] / max(a["count"], 1)
    if test is not None:
        ev = evaluate(run.model, test, cfg.loss, cfg.eval_batch_size, run.params, run.buffers, evals)
        rec["test_loss"] = ev["loss"]
        if "accuracy" in ev:
            rec["test_acc"] = ev["accuracy"]
    run.epoch += 1
    run.acc = {"loss_sum": 0.0, "correct": 0, "count": 0, "gnorm_sum": 0.0, "gnorm_max": 0.0, "steps": 0}
    return rec
