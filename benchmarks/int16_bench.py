"""int8 vs 16x8 (int16 activations) post-training quantisation: accuracy and output error.

    .venv/bin/python benchmarks/int16_bench.py [--seeds 3] [--mlperf DIR]

1. The digits CNN (zoo ``digits-cnn``, trained per seed, 360 test images): top-1 accuracy of
   float, int8 and 16x8 models (PTQ minmax, per-channel weights, 500 calibration images), the
   SQNR of the logits against the float model, and how many test images' 16x8 output under
   LiteRT's reference kernels (the exported .tflite) differs from Kiln's int16 reference.
2. MLPerf Tiny float models (DIR, default /work/ext/mlperf, when present: ad01_fp32, the
   float32 KWS DS-CNN and ResNet-8): there is no dataset offline, so both quantised models are
   calibrated on 200 and compared on 100 other seeded random inputs (standard normal; images
   uniform in [0, 1]): SQNR of the output against the float model, and top-1 agreement for the
   classifiers. Prints Markdown tables."""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from kiln.frontend import run
from kiln.frontend.graph_passes import with_batch
from kiln.frontend.ops.quant import quantize_array
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize import export_tflite, ptq
from kiln.training import digits, train_digits


def outputs(g, x, batch=128):
    t = g.types[g.inputs[0]]
    res = []
    for i in range(0, len(x), batch):
        xb = x[i:i + batch].reshape((-1,) + tuple(t.shape[1:]))
        if t.dtype != "float32":
            xb = quantize_array(xb, t.quant.scale[0], t.quant.zero_point[0], t.dtype)
        o = run(with_batch(g, len(xb)), xb.astype(t.dtype))[0]
        ot = g.types[g.outputs[0]]
        if ot.quant is not None:
            o = (np.asarray(o, np.float64) - ot.quant.zero_point[0]) * ot.quant.scale[0]
        res.append(np.asarray(o, np.float64).reshape(len(xb), -1))
    return np.concatenate(res)


def sqnr_db(ref, got):
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - got) ** 2), 1e-30)))


def litert_mismatches(q, x):
    from ai_edge_litert import interpreter as interp
    it = interp.Interpreter(model_content=export_tflite(q), experimental_op_resolver_type=interp.OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    d, o = it.get_input_details()[0], it.get_output_details()[0]
    t = q.types[q.inputs[0]]
    g1 = with_batch(q, 1)
    bad = 0
    for xi in x:
        xq = quantize_array(xi.reshape(t.shape), t.quant.scale[0], t.quant.zero_point[0], t.dtype)
        it.set_tensor(d["index"], xq)
        it.invoke()
        bad += int(not np.array_equal(it.get_tensor(o["index"]), run(g1, xq)[0]))
    return bad


def digits_rows(seeds):
    train, test = digits()
    rows = []
    for seed in range(seeds):
        g = train_digits(seed=seed).graph
        f = outputs(g, test.x)
        row = {"seed": seed, "float": float(np.mean(f.argmax(1) == test.y))}
        for act in ("int8", "int16"):
            t0 = time.time()
            q = ptq(g, train.x[:500], activations=act, int8_io=True)
            secs = time.time() - t0
            o = outputs(q, test.x)
            row[act] = (float(np.mean(o.argmax(1) == test.y)), sqnr_db(f, o), litert_mismatches(q, test.x), secs)
        rows.append(row)
    return rows


MLPERF = [("ad01_fp32.tflite", "anomaly detection FC autoencoder", "normal"),
          ("kws_ref_model_float32.tflite", "keyword spotting DS-CNN", "normal"),
          ("pretrainedResnet.tflite", "image classification ResNet-8", "uniform")]


def mlperf_rows(root):
    rows = []
    for name, what, dist in MLPERF:
        path = os.path.join(root, name)
        if not os.path.exists(path):
            continue
        g = load_tflite(path)
        shape = tuple(g.types[g.inputs[0]].shape[1:])
        rng = np.random.default_rng(0)
        draw = (lambda n: rng.standard_normal((n,) + shape)) if dist == "normal" else \
            (lambda n: rng.uniform(0, 1, (n,) + shape))
        calib, x = draw(200).astype(np.float32), draw(100).astype(np.float32)
        f = outputs(g, x)
        row = {"model": name, "what": what}
        for act in ("int8", "int16"):
            q = ptq(g, calib, activations=act)
            o = outputs(q, x)
            agree = float(np.mean(o.argmax(1) == f.argmax(1))) if f.shape[1] <= 12 else None
            row[act] = (sqnr_db(f, o), agree)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--mlperf", default="/work/ext/mlperf")
    a = ap.parse_args()
    print("| seed | float acc | int8 acc | 16x8 acc | int8 logits SQNR (dB) | 16x8 logits SQNR (dB) | "
          "16x8 LiteRT mismatches | 16x8 PTQ seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for r in digits_rows(a.seeds):
        i8, i16 = r["int8"], r["int16"]
        print(f"| {r['seed']} | {100 * r['float']:.2f}% | {100 * i8[0]:.2f}% | {100 * i16[0]:.2f}% | {i8[1]:.1f} | "
              f"{i16[1]:.1f} | {i16[2]} | {i16[3]:.2f} |")
    rows = mlperf_rows(a.mlperf)
    if rows:
        print()
        print("| model | int8 output SQNR (dB) | 16x8 output SQNR (dB) | gain (dB) | int8 top-1 agreement | "
              "16x8 top-1 agreement |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            i8, i16 = r["int8"], r["int16"]
            ag = (f"{100 * i8[1]:.0f}% | {100 * i16[1]:.0f}%" if i8[1] is not None else "- | -")
            print(f"| {r['model']} ({r['what']}) | {i8[0]:.1f} | {i16[0]:.1f} | {i16[0] - i8[0]:+.1f} | {ag} |")


if __name__ == "__main__":
    main()
