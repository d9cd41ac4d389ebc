"""kiln golden MODEL -o G.npz: golden input/output pairs for `kiln verify`, from LiteRT's reference
kernels (a .tflite model; TensorFlow Lite Micro's interpreter where the two differ, kiln/tflm.py)
or Kiln's reference executor (a Kiln graph), on the samples of a data file or on seeded random
inputs."""
from __future__ import annotations

import os

import numpy as np

from kiln.frontend import load_model, semantics_of
from kiln.frontend.errors import KilnError
from kiln.litert import run_litert
from kiln.samples import golden_arrays, load_samples, random_inputs
from kiln.targets import run_reference
from kiln.tflm import add_semantics_argument, oracle_for, run_tflm

ORACLES = ("auto", "litert", "tflm", "reference")
WHO = {"litert": "LiteRT's reference kernels (BUILTIN_REF)", "tflm": "TensorFlow Lite Micro's interpreter",
       "reference": "Kiln's reference executor"}


def add_arguments(p):
    p.add_argument("model", help=".tflite or Kiln graph .json")
    p.add_argument("-o", "--out", required=True, help="golden .npz to write (in_K/out_K, or in_K_J/out_K_J for "
                   "models with several inputs or outputs)")
    p.add_argument("--data", default=None, help="samples .npz (data arrays or golden pairs: see README, 'Sample "
                   "files'); default: seeded random inputs")
    p.add_argument("--inputs", type=int, default=8, help="number of random inputs when no --data is given")
    p.add_argument("--limit", type=int, default=None, help="use at most this many samples of --data")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--oracle", default="auto", choices=ORACLES,
                   help="who computes the outputs: LiteRT's reference kernels (BUILTIN_REF; .tflite only), "
                        "TensorFlow Lite Micro's interpreter (.tflite only; pip package tflite-micro), Kiln's "
                        "reference executor, or auto (LiteRT for a .tflite, TensorFlow Lite Micro where the two "
                        "differ: integer LSTM, int8 SVDF state, --semantics tflm; Kiln's reference for a Kiln graph)")
    add_semantics_argument(p)


def resolve(model, oracle="auto", graph=None):
    """(oracle, why): ``auto`` resolved for ``model`` (``graph``: it already loaded; why: the
    reason LiteRT is not asked, or None)."""
    if oracle != "auto":
        return oracle, None
    return oracle_for(model, graph) if os.fspath(model).endswith(".tflite") else ("reference", None)


def golden(model, out, samples, oracle="auto", graph=None):
    """Write golden pairs for ``samples`` (tuples of input arrays) to ``out``; returns the oracle
    used. ``graph``: the model already loaded."""
    is_tflite = os.fspath(model).endswith(".tflite")
    g = graph if graph is not None else load_model(model)
    oracle = resolve(model, oracle, g)[0]
    if oracle in ("litert", "tflm") and not is_tflite:
        raise KilnError(f"{model}: --oracle {oracle} needs a .tflite model")
    if oracle == "litert":
        outs = run_litert(model, samples, stream=bool(g.states), graph=g)
    elif oracle == "tflm":
        outs = run_tflm(model, samples, stream=bool(g.states))
    else:
        outs = run_reference(g, samples)
    d = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(d):
        raise KilnError(f"-o {out}: folder {d} does not exist")
    tmp = out + ".tmp.npz"
    np.savez(tmp, **golden_arrays(list(zip(samples, outs))))
    os.replace(tmp, out)
    return oracle


def run(args):
    if args.inputs < 1:
        raise KilnError(f"--inputs must be at least 1, got {args.inputs}")
    g = load_model(args.model, semantics=args.semantics)
    if args.data:
        samples = load_samples(args.data, g, limit=args.limit).inputs
        if not samples:
            raise KilnError(f"{args.data}: no samples")
        source = args.data
    else:
        samples = random_inputs(g, args.inputs, args.seed)
        source = f"{args.inputs} random inputs (seed {args.seed})"
    oracle, why = resolve(args.model, args.oracle, g)
    golden(args.model, args.out, samples, oracle, graph=g)
    return {"model": args.model, "golden": args.out, "pairs": len(samples), "oracle": oracle, "oracle_reason": why,
            "inputs": len(g.inputs), "outputs": len(g.outputs), "source": source, "semantics": semantics_of(g),
            "text": f"wrote {len(samples)} golden pairs to {args.out} ({WHO[oracle]}, {source})"
                    + (f"\noracle: {WHO[oracle]}, not LiteRT: {why}" if why else "")}
