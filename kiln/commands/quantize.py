"""kiln quantize MODEL --data digits|DATA.npz: post-training quantisation (or QAT with --qat) of a
trained float Kiln graph to int8, with a float-vs-int8 accuracy report.

Writes the int8 graph (``--out``, a Kiln graph .json) and optionally a .tflite (``--tflite``)."""
from __future__ import annotations

import os
import time

import numpy as np

from kiln.frontend.errors import KilnError


def add_arguments(p):
    p.add_argument("model", help="trained float Kiln graph (.json), e.g. the model.json of `kiln train`")
    p.add_argument("--data", default="digits", help="'digits' (scikit-learn's 8x8 digits) or an .npz with "
                   "x_train, y_train[, x_test, y_test]")
    p.add_argument("--method", default="minmax", choices=["minmax", "percentile", "mse"],
                   help="calibration range method")
    p.add_argument("--per-tensor", action="store_true", help="one weight scale per tensor (default: per channel)")
    p.add_argument("--int8-io", action="store_true", help="int8 input and output (default: float, with "
                   "quantize/dequantize at the edges)")
    p.add_argument("--calibration-size", type=int, default=500, help="training samples used for calibration")
    p.add_argument("--qat", action="store_true", help="quantisation-aware fine-tuning before conversion")
    p.add_argument("--epochs", type=int, default=3, help="QAT epochs")
    p.add_argument("--lr", type=float, default=1e-4, help="QAT learning rate")
    p.add_argument("--out", default=None, help="write the int8 graph here (.json; default MODEL_int8.json)")
    p.add_argument("--tflite", default=None, help="also export the int8 graph as a .tflite file")


def _data(spec):
    from kiln.training import digits, load_npz
    if spec == "digits":
        return digits()
    if spec.endswith(".npz"):
        return load_npz(spec)
    raise KilnError(f"--data must be 'digits' or an .npz file, got {spec!r}")


def accuracy(graph, x, y, batch=256):
    """Top-1 accuracy of a classifier graph (float or int8 input: int8 inputs are quantised with
    the input's parameters)."""
    from kiln.frontend import run
    from kiln.quantize.graph_passes import with_batch
    t = graph.types[graph.inputs[0]]
    correct = 0
    for i in range(0, len(x), batch):
        xb = x[i:i + batch]
        if t.dtype == "int8":
            q = t.quant
            xb = np.clip(np.round(xb / q.scale[0]) + q.zero_point[0], -128, 127).astype(np.int8)
        else:
            xb = xb.astype(t.dtype)
        out = run(with_batch(graph, len(xb)), xb)[0]
        correct += int(np.sum(np.argmax(out.reshape(len(xb), -1), -1) == y[i:i + batch]))
    return correct / max(len(x), 1)


def run(args):
    from kiln.frontend import load, save
    from kiln import quantize as Q
    g = load(args.model)
    train, test = _data(args.data)
    if test is None:
        raise KilnError(f"{args.data}: the accuracy report needs test data (x_test, y_test)")
    if train.y is None or train.y.dtype.kind not in "iu":
        raise KilnError("kiln quantize reports classification accuracy: the data needs integer labels")
    calib = train.x[:args.calibration_size]
    t0 = time.time()
    if args.qat:
        r = Q.qat(g, train, test, epochs=args.epochs, lr=args.lr, per_channel=not args.per_tensor,
                  method=args.method, calibration=calib, int8_io=args.int8_io)
        q = r.graph
    else:
        q = Q.ptq(g, calib, per_channel=not args.per_tensor, method=args.method, int8_io=args.int8_io)
    seconds = time.time() - t0
    fa, qa = accuracy(g, test.x, test.y), accuracy(q, test.x, test.y)
    out = args.out or os.path.splitext(args.model)[0] + "_int8.json"
    files = {"graph": save(q, out)}
    if args.tflite:
        Q.export_tflite(q, args.tflite)
        files["tflite"] = args.tflite
    rep = {"model": args.model, "mode": "qat" if args.qat else "ptq", "method": args.method,
           "per_channel": not args.per_tensor, "int8_io": bool(args.int8_io), "test_samples": len(test.x),
           "float_accuracy": fa, "int8_accuracy": qa, "delta_pp": round(100 * (qa - fa), 3),
           "seconds": round(seconds, 2), "files": files}
    rep["text"] = (f"{rep['mode'].upper()} ({args.method}, {'per-channel' if rep['per_channel'] else 'per-tensor'} "
                   f"weights) of {args.model} on {len(test.x)} test samples:\n"
                   f"  float {100 * fa:.2f}%   int8 {100 * qa:.2f}%   delta {rep['delta_pp']:+.2f} pp\n"
                   + "\n".join(f"  wrote {k}: {v}" for k, v in files.items()))
    return rep
