"""One way in for every model file: ``load_model(path) -> Graph``, chosen by the file's kind.

- ``.tflite``: TFLite flatbuffer (int8, float or mixed), see tflite_import.
- ``.json``: a Kiln graph (``kiln.save``; its tensors in the ``.npz`` beside it).
- ``.onnx``: an ONNX model (float or QDQ int8), see onnx_import (needs ``kiln-ml[onnx]``).
- ``.pt2``: a PyTorch ExportedProgram (``torch.export.save``), see torch_import (needs
  ``kiln-ml[torch]``).

Every command that takes a MODEL argument reads it here, so they all accept the same files."""
from __future__ import annotations

import os

from .errors import SerializationError
from .graph import Graph
from .onnx_import import load_onnx  # onnx and torch themselves are imported when a file needs them
from .serialize import load
from .tflite_import import load_tflite
from .torch_import import load_pt2

KINDS = {".tflite": "TFLite flatbuffer", ".json": "Kiln graph (kiln.save)", ".onnx": "ONNX model",
         ".pt2": "PyTorch ExportedProgram (torch.export.save)"}


def load_model(path) -> Graph:
    """A Graph from a model file (see the module docstring). A Graph is returned unchanged."""
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
