"""One way in for every model file: ``load_model(path) -> Graph``, chosen by the file's kind.

- ``.tflite``: TFLite flatbuffer (int8, float or mixed), see tflite_import.
- ``.json``: a Kiln graph (``kiln.save``; its tensors in the ``.npz`` beside it).
- ``.onnx``: an ONNX model (float or QDQ int8), see onnx_import (needs ``kiln-ml[onnx]``).
- ``.pt2``: a PyTorch ExportedProgram (``torch.export.save``), see torch_import (needs
  ``kiln-ml[torch]``).

Every command that takes a MODEL argument reads it here, so they all accept the same files.

``semantics`` chooses whose integer arithmetic the graph follows where LiteRT's reference kernels
and TensorFlow Lite Micro differ in a way a graph attribute decides (:data:`SEMANTICS`; today the
int8/int16 FULLY_CONNECTED requantisation, docs/int8_ir.md): ``"litert"`` (the default of a
.tflite) or ``"tflm"``. ``None`` keeps what the model records (a Kiln graph saved with one)."""
from __future__ import annotations

import os

from .errors import SerializationError
from .graph import Graph
from .onnx_import import load_onnx  # onnx and torch themselves are imported when a file needs them
from .ops.nn import fixed_requant
from .serialize import load
from .tflite_import import load_tflite
from .torch_import import load_pt2

# semantics -> the ``requant`` attribute of every dense node (frontend/ops/nn.py: FC_REQUANT)
SEMANTICS = {"litert": "double", "tflm": "fixed"}
SEMANTICS_HELP = ("whose integer arithmetic to follow where LiteRT and TensorFlow Lite Micro differ: litert "
                  "(default; LiteRT's reference kernels, which MLPerf Tiny's goldens come from) or tflm "
                  "(TensorFlow Lite Micro and CMSIS-NN). It decides the int8/int16 FULLY_CONNECTED "
                  "requantisation: one rounding in double (litert) or the fixed-point multiplier, two "
                  "roundings (tflm); outputs can differ by 1 LSB per layer")

KINDS = {".tflite": "TFLite flatbuffer", ".json": "Kiln graph (kiln.save)", ".onnx": "ONNX model",
         ".pt2": "PyTorch ExportedProgram (torch.export.save)"}


def load_model(path, semantics=None) -> Graph:
    """A Graph from a model file (see the module docstring). A Graph is returned unchanged, or as
    a copy following ``semantics`` when one is given."""
    g = _load(path)
    if semantics is None:
        return g
    return with_semantics(g, semantics)


def with_semantics(graph, semantics) -> Graph:
    """``graph`` following ``semantics`` ("litert" | "tflm"): a copy whose dense nodes requantise
    as that runtime does, recorded in ``meta["semantics"]``; the graph itself when it already
    follows it."""
    if semantics not in SEMANTICS:
        raise SerializationError(f"semantics {semantics!r}: choose one of {', '.join(SEMANTICS)}")
    rq = SEMANTICS[semantics]
    dense = [n for n in graph.nodes if n.op == "dense"]
    if semantics_of(graph) == semantics and all(n.attrs.get("requant", "double") == rq for n in dense):
        return graph
    g = graph.copy()
    for n in g.nodes:
        if n.op == "dense":
            n.attrs["requant"] = rq
    g.meta["semantics"] = semantics
    return g


def semantics_of(graph) -> str:
    """The semantics ``graph`` follows: its record, else "tflm" when some dense node requantises
    with the fixed-point multiplier, else "litert"."""
    s = graph.meta.get("semantics")
    if s in SEMANTICS:
        return s
    return "tflm" if any(n.op == "dense" and fixed_requant(n.attrs) for n in graph.nodes) else "litert"


def _load(path) -> Graph:
    if isinstance(path, Graph):
        return path
    p = os.fspath(path)
    if os.path.isdir(p):
        hint = (" (a compiled package: commands that run packages take it directly; this one needs the model "
                "file it was compiled from)" if os.path.exists(os.path.join(p, "manifest.json")) else "")
        raise SerializationError(f"{p} is a folder, not a model file{hint}")
    ext = os.path.splitext(p)[1].lower()
    if not os.path.exists(p) and not (not ext and os.path.exists(p + ".json")):
        raise SerializationError(f"model file {p} not found")
    if ext == ".tflite":
        return load_tflite(p)
    if ext == ".onnx":
        return load_onnx(p)
    if ext == ".pt2":
        return load_pt2(p)
    if ext == ".json" or (not ext and os.path.exists(p + ".json")):
        return load(p)
    raise SerializationError(f"{p}: unknown model format {ext or '(no extension)'!r}; Kiln reads "
                             + ", ".join(f"{k} ({v})" for k, v in KINDS.items()))
