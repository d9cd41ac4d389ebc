"""kiln quantize MODEL --data DATA: post-training quantisation (or QAT with --qat) of a float model
(a Kiln graph .json, e.g. from `kiln train`, or a float .tflite) to int8, with a float-vs-int8
report that fits the model: top-1 accuracy for classifiers (integer labels), the error against
the expected outputs for regression, and the int8 model's distance from the float model's
outputs (mean / max, in units of the output's quantisation step) for every model, autoencoders
included.

DATA is 'digits' (scikit-learn's 8x8 digits) or an .npz: ``x_train``/``y_train``
[/``x_test``/``y_test``] or ``x``/``y``, or for models with several inputs one array per input
named after it (or ``x_0``, ``x_1``, ...; optionally with a ``_train``/``_test`` suffix). The
first --calibration-size training samples calibrate; the test split (or, without one, every
sample) is evaluated. Writes the int8 graph (``--out``) and optionally a .tflite (``--tflite``)."""
from __future__ import annotations

import os
import time

import numpy as np

from kiln import quantize as Q
from kiln.frontend import load_model, save, semantics_of, with_semantics
from kiln.frontend import run as run_graph
from kiln.frontend.errors import KilnError
from kiln.frontend.graph_passes import with_batch
from kiln.frontend.ops.quant import quantize_array
from kiln.samples import read_npz
from kiln.tflm import add_semantics_argument
from kiln.training import digits, load_npz


def add_arguments(p):
    p.add_argument("model", help="float model: a Kiln graph .json (e.g. the model.json of `kiln train`) or a "
                   "float .tflite")
    p.add_argument("--data", required=True, help="'digits' (scikit-learn's 8x8 digits) or an .npz with the "
                   "calibration/evaluation samples (x_train, y_train[, x_test, y_test], or x[, y], or one array "
                   "per input)")
    p.add_argument("--method", default="minmax", choices=["minmax", "percentile", "mse"],
                   help="calibration range method (default: minmax)")
    p.add_argument("--activations", default="int8", choices=["int8", "int16"],
                   help="activation type: int8 (default) or int16, TFLite's 16x8 quantisation (int16 symmetric "
                        "activations, int8 weights, int64 biases)")
    p.add_argument("--int16-layers", default=None, metavar="NODE,...",
                   help="mixed precision: these nodes (names as `kiln inspect` shows them) get int16 "
                        "activations, the rest --activations; QUANTIZE nodes convert between them")
    p.add_argument("--per-tensor", action="store_true", help="one weight scale per tensor (default: per channel)")
    p.add_argument("--int8-io", action="store_true", help="int8 inputs and outputs (default: float, with "
                   "quantize/dequantize at the edges)")
    p.add_argument("--calibration-size", type=int, default=500,
                   help="training samples used for calibration (default: 500)")
    p.add_argument("--qat", action="store_true", help="quantisation-aware fine-tuning before conversion "
                   "(needs x_train/y_train with integer labels, or 'digits')")
    p.add_argument("--epochs", type=int, default=3, help="QAT epochs (default: 3)")
    p.add_argument("--lr", type=float, default=1e-4, help="QAT learning rate (default: 1e-4)")
    p.add_argument("--out", default=None, help="write the int8 graph here (.json; default: MODEL_int8.json)")
    p.add_argument("--tflite", default=None, help="also export the int8 graph as a .tflite file")
    add_semantics_argument(p)       # recorded in the .json; a .tflite cannot hold it (give it again when loading)


# ---- data ---------------------------------------------------------------------------------------
def _split_arrays(arrs, graph, split, path):
    """[array per input] of one split ('train' / 'test' / '') or None."""
    names = graph.inputs
    suffix = f"_{split}" if split else ""
    out = []
    for j, name in enumerate(names):
        keys = [f"{name}{suffix}", f"x_{j}{suffix}"] + ([f"x{suffix}"] if len(names) == 1 else [])
        key = next((k for k in keys if k in arrs), None)
        if key is None:
            return None
        out.append(np.asarray(arrs[key]))
    if len({len(a) for a in out}) != 1:
        raise KilnError(f"{path}: the {split or 'sample'} arrays of the inputs hold different numbers of samples")
    return out


def _targets(arrs, graph, split):
    suffix = f"_{split}" if split else ""
    if f"y{suffix}" in arrs:
        return [np.asarray(arrs[f"y{suffix}"])]
    ys = [arrs.get(f"y_{j}{suffix}", arrs.get(f"{o}{suffix}")) for j, o in enumerate(graph.outputs)]
    return [np.asarray(y) for y in ys] if all(y is not None for y in ys) else None


def load_data(spec, graph):
    """(calibration arrays, evaluation arrays, evaluation targets or None, description)."""
    if spec == "digits":
        if len(graph.inputs) != 1:
            raise KilnError("--data digits feeds one input; this model has several")
        train, test = digits()
        return [train.x], [test.x], [test.y], "digits (scikit-learn 8x8 digits, test split)"
    if not spec.endswith(".npz"):
        raise KilnError(f"--data must be 'digits' or an .npz file, got {spec!r}")
    arrs = read_npz(spec)
    train = _split_arrays(arrs, graph, "train", spec)
    test = _split_arrays(arrs, graph, "test", spec)
    plain = _split_arrays(arrs, graph, "", spec)
    if train is None and plain is None:
        raise KilnError(f"{spec}: no input arrays for {', '.join(graph.inputs)}: expected x_train[/x_test], x, one "
                        f"array per input named after it, or x_0..; found {sorted(arrs)}")
    calib = train if train is not None else plain
    if test is not None:
        return calib, test, _targets(arrs, graph, "test"), f"{os.path.basename(spec)} (test split)"
    ev = plain if plain is not None else train
    split = "" if plain is not None else "train"
    return calib, ev, _targets(arrs, graph, split), f"{os.path.basename(spec)} (all samples; no test split)"


# ---- evaluation ---------------------------------------------------------------------------------
def outputs(graph, arrays, batch=256):
    """The graph's outputs on [N, ...] arrays (one per input), as float arrays [N, ...] per output
    (int8 outputs dequantised; float inputs quantised for int8 inputs)."""
    n = len(arrays[0])
    res = [[] for _ in graph.outputs]
    for i in range(0, n, batch):
        xs = []
        for a, name in zip(arrays, graph.inputs):
            t, xb = graph.types[name], a[i:i + batch]
            if t.dtype in ("int8", "int16") and xb.dtype.kind == "f":
                xb = quantize_array(xb, t.quant.scale[0], t.quant.zero_point[0], t.dtype)
            xs.append(xb.astype(t.dtype, copy=False).reshape((len(xb),) + tuple(t.shape[1:])))
        outs = run_graph(with_batch(graph, len(xs[0])), *xs)
        for k, (o, name) in enumerate(zip(outs, graph.outputs)):
            t = graph.types[name]
            if t.quant is not None and np.asarray(o).dtype.kind in "iu":
                o = (np.asarray(o, np.float64) - t.quant.zero_point[0]) * t.quant.scale[0]
            res[k].append(np.asarray(o, np.float64))
    return [np.concatenate(r) for r in res]


def accuracy(graph, x, y, batch=256):
    """Top-1 accuracy of a one-input classifier graph on float samples x [N, ...] (quantised for
    an int8 input) with integer labels y."""
    out = outputs(graph, [np.asarray(x)], batch)[0]
    return float(np.mean(np.argmax(out.reshape(len(out), -1), -1) == np.asarray(y)))


def _lsb(graph_q):
    """The quantisation step of each output of the int8 graph (the dequantize input's scale)."""
    steps = []
    for o in graph_q.outputs:
        t = graph_q.types[o]
        if t.quant is None:
            prod = next((n for n in graph_q.nodes if n.name == o), None)
            t = graph_q.types[prod.inputs[0]] if prod is not None and prod.op == "dequantize" else t
        steps.append(float(t.quant.scale[0]) if t.quant is not None else None)
    return steps


def evaluate(g, q, arrays, targets):
    fo, qo = outputs(g, arrays), outputs(q, arrays)
    rep = {}
    diffs = [np.abs(a - b) for a, b in zip(fo, qo)]
    rep["int8_vs_float"] = {"mae": float(np.mean(np.concatenate([d.ravel() for d in diffs]))),
                            "max_abs": float(max(d.max(initial=0) for d in diffs))}
    steps = _lsb(q)
    if all(s is not None for s in steps):
        rep["int8_vs_float"]["mean_lsb"] = float(np.mean(np.concatenate([(d / s).ravel() for d, s in zip(diffs, steps)])))
        rep["int8_vs_float"]["max_lsb"] = float(max((d / s).max(initial=0) for d, s in zip(diffs, steps)))
    if targets is None:
        rep["task"] = "no targets (float vs int8 outputs only)"
        return rep
    if len(targets) == 1 and targets[0].ndim == 1 and targets[0].dtype.kind in "iu" and fo[0][0].size > 1:
        y = targets[0]
        acc = [float(np.mean(np.argmax(o[0].reshape(len(o[0]), -1), -1) == y)) for o in (fo, qo)]
        rep.update(task="classification", float_accuracy=acc[0], int8_accuracy=acc[1],
                   delta_pp=round(100 * (acc[1] - acc[0]), 3))
        return rep
    if len(targets) != len(fo):
        raise KilnError(f"the data has {len(targets)} target arrays, the model {len(fo)} outputs")
    errs = {}
    for name, os_ in (("float", fo), ("int8", qo)):
        e = np.concatenate([(o.reshape(len(o), -1) - np.asarray(t, np.float64).reshape(len(t), -1)).ravel()
                            for o, t in zip(os_, targets)])
        errs[name] = {"mse": float(np.mean(e ** 2)), "mae": float(np.mean(np.abs(e)))}
    rep.update(task="regression", float_error=errs["float"], int8_error=errs["int8"])
    return rep


# ---- the command --------------------------------------------------------------------------------
def _load_float(path):
    g = load_model(path)
    if any(g.types[v].quant is not None for v in list(g.inputs) + [n.name for n in g.nodes]):
        raise KilnError(f"{path} is already quantised; kiln quantize takes a float model")
    return g


def run(args):
    if args.calibration_size < 1:
        raise KilnError(f"--calibration-size must be at least 1, got {args.calibration_size}")
    g = _load_float(args.model)
    calib, ev, targets, described = load_data(args.data, g)
    calib = [a[:args.calibration_size] for a in calib]
    t0 = time.time()
    if args.qat and (args.activations != "int8" or args.int16_layers):
        raise KilnError("--qat fine-tunes for int8 activations; for --activations int16 use post-training "
                        "quantisation (drop --qat)")
    if args.qat:
        q = _qat(Q, g, args, calib)
    else:
        q = Q.ptq(g, calib if len(calib) > 1 else calib[0], per_channel=not args.per_tensor, method=args.method,
                  int8_io=args.int8_io, activations=_activations(args))
    seconds = time.time() - t0
    if args.semantics:
        q = with_semantics(q, args.semantics)
    q.meta["float_model"] = os.path.abspath(args.model)
    result = evaluate(g, q, ev, targets)
    out = args.out or os.path.splitext(args.model)[0] + ("_int8.json" if args.activations == "int8" else "_16x8.json")
    files = {"graph": save(q, out)}
    if args.tflite:
        Q.export_tflite(q, args.tflite)
        files["tflite"] = args.tflite
    rep = {"model": args.model, "mode": "qat" if args.qat else "ptq", "method": args.method,
           "activations": args.activations, "int16_layers": q.meta.get("int16_layers"),
           "per_channel": not args.per_tensor, "int8_io": bool(args.int8_io), "data": described,
           "calibration_samples": len(calib[0]), "eval_samples": len(ev[0]), **result,
           "seconds": round(seconds, 2), "files": files, "semantics": semantics_of(q)}
    rep["text"] = _text(rep)
    return rep


def _activations(args):
    if not args.int16_layers:
        return args.activations
    names = [n.strip() for n in args.int16_layers.split(",") if n.strip()]
    return {"*": args.activations, **{n: "int16" for n in names}}


def _qat(Q, g, args, calib):
    train, test = digits() if args.data == "digits" else load_npz(args.data)
    if test is None or train.y is None or train.y.dtype.kind not in "iu":
        raise KilnError("--qat fine-tunes a classifier: the data needs x_train/y_train (integer labels) and "
                        "x_test/y_test, or 'digits'")
    return Q.qat(g, train, test, epochs=args.epochs, lr=args.lr, per_channel=not args.per_tensor,
                 method=args.method, calibration=calib[0], int8_io=args.int8_io).graph


def _text(rep):
    head = (f"{rep['mode'].upper()} ({rep['method']}, {rep.get('activations', 'int8')} activations, "
            f"{'per-channel' if rep['per_channel'] else 'per-tensor'} weights) of {rep['model']}: calibrated on {rep['calibration_samples']} samples, evaluated on "
            f"{rep['eval_samples']} of {rep['data']}")
    lines = [head]
    qn = rep.get("activations", "int8").replace("int16", "16x8")      # the JSON keys keep their int8_ names
    if rep.get("task") == "classification":
        lines.append(f"  accuracy: float {100 * rep['float_accuracy']:.2f}%   {qn} {100 * rep['int8_accuracy']:.2f}%"
                     f"   delta {rep['delta_pp']:+.2f} pp")
    elif rep.get("task") == "regression":
        f, q = rep["float_error"], rep["int8_error"]
        lines.append(f"  error vs expected outputs: float MSE {f['mse']:.4g} MAE {f['mae']:.4g}   "
                     f"{qn} MSE {q['mse']:.4g} MAE {q['mae']:.4g}")
    d = rep["int8_vs_float"]
    lsb = f" ({d['mean_lsb']:.2f} LSB mean, {d['max_lsb']:.1f} LSB max)" if "mean_lsb" in d else ""
    lines.append(f"  {qn} vs float outputs: mean |diff| {d['mae']:.4g}, max {d['max_abs']:.4g}{lsb}")
    lines += [f"  wrote {k}: {v}" for k, v in rep["files"].items()]
    return "\n".join(lines)
