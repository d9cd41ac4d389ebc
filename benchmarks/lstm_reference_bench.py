"""Kiln's NumPy reference executor on stateful LSTMs: milliseconds per inference (the best of
``--repeat`` runs, CPU time of this process, so it holds on a loaded machine), one JSON object per
line.

- TensorFlow Lite Micro's int8 mnist_lstm (tests/data/tflm_mnist_lstm/trained_lstm_int8.tflite:
  28 steps, 20 units, its states carried between inferences);
- a long sequence: ``nn.LSTM(16, 32, stateful=True)`` over ``--steps`` time steps, float and
  quantised by ``ptq`` to int8 and 16x8 (2 random calibration sequences).

    .venv/bin/python benchmarks/lstm_reference_bench.py --steps 1000
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import kiln.frontend as kf
from kiln.frontend.executor import run_stateful
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize import ptq

MNIST = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "tflm_mnist_lstm", "trained_lstm_int8.tflite")


def best_ms(g, x, repeat):
    ts = []
    for _ in range(repeat):
        t = time.process_time()
        run_stateful(g, {}, x)
        ts.append(time.process_time() - t)
    return round(1e3 * min(ts), 2)


def _random_input(g, rng):
    t = g.types[g.inputs[0]]
    if t.dtype == "float32":
        return rng.standard_normal(t.shape).astype(np.float32)
    return rng.integers(-100, 100, t.shape).astype(t.dtype)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000, help="time steps of the long-sequence LSTM")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    g = load_tflite(MNIST)
    print(json.dumps({"model": "mnist_lstm int8", "steps": g.types[g.inputs[0]].shape[1],
                      "ms": best_ms(g, _random_input(g, rng), 4 * a.repeat)}))
    kf.manual_seed(0)
    gf = kf.trace(kf.LSTM(16, 32, stateful=True), (1, a.steps, 16))
    cal = rng.standard_normal((2, a.steps, 16)).astype(np.float32)
    for kind, graph in (("float", gf), ("int8", ptq(gf, cal)), ("16x8", ptq(gf, cal, activations="int16"))):
        print(json.dumps({"model": f"LSTM(16, 32) {kind}", "steps": a.steps,
                          "ms": best_ms(graph, _random_input(graph, rng), a.repeat)}))


if __name__ == "__main__":
    main()
