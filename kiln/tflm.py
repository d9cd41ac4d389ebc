"""TensorFlow Lite Micro's interpreter as the oracle where LiteRT and TFLite Micro differ.

The project's rule: where LiteRT's reference kernels and TFLite Micro compute different integer
results, TFLite Micro is right (it is what runs on the boards Kiln targets). Known cases, each a
function of the imported graph (:func:`tflm_only`):

- the integer UNIDIRECTIONAL_SEQUENCE_LSTM: TFLite Micro's templated ``EvalLstm`` (int8 and 16x8;
  Kiln computes it, frontend/ops/recurrent_16x8.py), where LiteRT runs its own 8x8_16 kernel
  (results differ by 1 in some hidden-state elements) and has no 16x8 LSTM at all;
- the int8 and int16 LEAKY_RELU with a negative alpha: TFLite Micro applies the negative alpha
  multiplier by its magnitude and negates the result; LiteRT multiplies by the negative multiplier
  (ties round the other way);
- SVDF with an int8 state, which LiteRT's kernel reads as int16 (it corrupts memory);
- a graph loaded with ``semantics="tflm"`` (``--semantics tflm``): its FULLY_CONNECTED layers
  requantise with TFLite Micro's fixed-point multiplier, LiteRT's reference kernel in double;
- the int8 and int16 SUM: TFLite Micro requantises the integer sum with a fixed-point multiplier and
  clamps (reference_ops::QuantizedMeanOrSum); LiteRT's BUILTIN_REF kernel gives other values for
  negative sums (and unrelated ones for int16), and its optimised kernel rounds in float.

`kiln golden` and `kiln run` ask TFLite Micro (the ``tflite-micro`` pip package, installed with
Kiln on Linux x86-64 / Python 3.11) for such models, and LiteRT for every other .tflite. Without
the package they fall back to Kiln's reference executor, which follows TFLite Micro and is tested
bit-exact against it.
"""
from __future__ import annotations

import os

import numpy as np
import tflite

from kiln.backends.manifest import is_package, load_manifest
from kiln.frontend.errors import KilnError
from kiln.frontend.loader import SEMANTICS, SEMANTICS_HELP, load_model, semantics_of
from kiln.frontend.ops.nn import fixed_requant
from kiln.litert import int8_state_svdfs


class TflmError(KilnError):
    """TensorFlow Lite Micro's interpreter could not load or run the model."""


def tflm_only(graph) -> str | None:
    """Why LiteRT is not the oracle for ``graph`` (the first op where LiteRT and TFLite Micro
    differ, named), or None when LiteRT is."""
    for n in graph.nodes:
        dtype = graph.types[n.inputs[0]].dtype if n.inputs else None
        negative_alpha = n.op == "leaky_relu" and n.attrs["alpha"] < 0
        if (n.op in ("lstm", "sum") or negative_alpha) and dtype in ("int8", "int16"):
            what = {"lstm": "LSTM", "sum": "SUM", "leaky_relu": "LEAKY_RELU with a negative alpha"}[n.op]
            return (f"{n.name!r} is an {dtype} {what}: LiteRT's integer {what} differs from TensorFlow Lite Micro's, "
                    f"which Kiln follows")
    if semantics_of(graph) == "tflm":
        fc = next((n for n in graph.nodes if n.op == "dense" and fixed_requant(n.attrs)
                   and graph.types[n.inputs[0]].dtype in ("int8", "int16")), None)
        if fc is not None:
            return (f"the model follows TensorFlow Lite Micro's semantics (--semantics tflm): FULLY_CONNECTED "
                    f"{fc.name!r} requantises with its fixed-point multiplier, LiteRT's reference kernel in double")
    svdfs = int8_state_svdfs(graph)
    if svdfs:
        return f"SVDF {svdfs[0]!r} keeps an int8 state, which only TensorFlow Lite Micro runs (LiteRT reads it as int16)"
    return None


def add_semantics_argument(p):
    """The ``--semantics litert|tflm`` option of the commands that import a model and compute or
    compare its results (frontend/loader.py: SEMANTICS)."""
    p.add_argument("--semantics", default=None, choices=sorted(SEMANTICS),
                   help=SEMANTICS_HELP + ". With tflm, TensorFlow Lite Micro's interpreter is the oracle. Default: "
                        "litert for a .tflite; what a Kiln graph or compiled package records")


def check_package_semantics(model, semantics):
    """A usage error when ``model`` is a compiled package that follows other semantics than the
    ``--semantics`` given (a package's arithmetic is fixed when it is compiled)."""
    p = os.fspath(model)
    if semantics is None or not is_package(p):
        return
    has = load_manifest(p).semantics
    if has is not None and has != semantics:      # (None: a float package, nothing to choose)
        raise KilnError(f"{p} was compiled with --semantics {has}; --semantics {semantics} needs the model "
                        f"compiled again (kiln compile MODEL --semantics {semantics}), or leave the option out")


def available() -> bool:
    try:
        from tflite_micro.python.tflite_micro import runtime  # noqa: F401
    except ImportError:
        return False
    return True


_ITEMSIZE = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 6: 1, 7: 2, 8: 8, 9: 1, 10: 8, 11: 16, 12: 8, 15: 4, 16: 2, 17: 1}   # by TensorType


def arena_bytes(data: bytes) -> int:
    """A tensor arena big enough for any allocation plan of the model: every tensor of every
    subgraph at once (plus the interpreter's own records), at least the pip package's default of
    ten times the file. Its default alone is too small for models whose activations outweigh their
    weights (TFLite Micro's seanet PAD, QUANTIZE and STRIDED_SLICE test models)."""
    m = tflite.Model.GetRootAsModel(data, 0)
    total = 0
    for si in range(m.SubgraphsLength()):
        sub = m.Subgraphs(si)
        for ti in range(sub.TensorsLength()):
            t = sub.Tensors(ti)
            total += int(np.prod(t.ShapeAsNumpy(), dtype=np.int64)) * _ITEMSIZE.get(t.Type(), 8) if t.ShapeLength() \
                else _ITEMSIZE.get(t.Type(), 8)
    return max(len(data) * 10, total + (1 << 20))


def run_tflm(path, samples, stream=False) -> list[tuple]:
    """One tuple of outputs per sample (each a tuple of input arrays, in the model's input order),
    from TFLite Micro's interpreter. ``stream``: the samples are successive inputs of a stateful
    model, run from the reset state with the variable tensors carried from one to the next;
    otherwise the interpreter is reset (variables to zero) before every sample."""
    try:
        from tflite_micro.python.tflite_micro import runtime
    except ImportError:
        raise TflmError("TensorFlow Lite Micro's interpreter (pip package tflite-micro, Linux x86-64, Python 3.11) "
                        "is not installed: `pip install tflite-micro`, or use Kiln's reference executor "
                        "(--oracle reference)") from None
    with open(os.fspath(path), "rb") as f:
        data = f.read()
    try:
        sub = tflite.Model.GetRootAsModel(data, 0).Subgraphs(0)
        n_in, n_out = sub.InputsLength(), sub.OutputsLength()
        it = runtime.Interpreter.from_bytes(data, arena_size=arena_bytes(data))
    except Exception as e:      # the runtime raises RuntimeError with TFLite Micro's log
        raise TflmError(f"{path}: TensorFlow Lite Micro cannot load this model: {str(e).strip()[:500]}") from None
    results = []
    for xs in samples:
        if len(xs) != n_in:
            raise TflmError(f"{path}: a sample has {len(xs)} inputs, the model takes {n_in}")
        try:
            if not stream or not results:
                it.reset()
            for k, x in enumerate(xs):
                d = it.get_input_details(k)
                it.set_input(np.asarray(x).astype(d["dtype"], copy=False).reshape(d["shape"]), k)
            it.invoke()
        except Exception as e:
            raise TflmError(f"{path}: TensorFlow Lite Micro's interpreter failed: {str(e).strip()[:500]}") from None
        results.append(tuple(np.array(it.get_output(k), copy=True) for k in range(n_out)))
    return results


def oracle_for(path, graph=None) -> tuple[str, str | None]:
    """("litert" | "tflm" | "reference", why) for a .tflite model (``graph``: the model already
    loaded): LiteRT unless the model has an op where it differs from TFLite Micro; then TFLite
    Micro when installed, else Kiln's reference."""
    try:
        why = tflm_only(graph if graph is not None else load_model(path))
    except KilnError:
        return "litert", None           # LiteRT may still run what Kiln does not import
    if why is None:
        return "litert", None
    if available():
        return "tflm", why
    return "reference", why + "; TensorFlow Lite Micro's interpreter (pip package tflite-micro) is not installed"
