"""Graph files: ``NAME.json`` (structure, types, attributes; format-versioned) next to
``NAME.npz`` (parameters and constants). Round trips are exact (floats in JSON use repr, which
round-trips; tensors are stored bit-for-bit). A corrupt file, a tensor file that does not match
its checksum, or a newer format version fails with :class:`SerializationError`."""
from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile

import numpy as np

from .errors import GraphError, KilnError, LimitError, SerializationError, ShapeError
from .files import atomic_write  # noqa: F401  (re-exported: kiln.frontend.serialize.atomic_write)
from .graph import Graph, Node
from .types import TensorType

FORMAT = "kiln-graph"
FORMAT_VERSION = 1


def _paths(path):
    path = os.fspath(path)
    base = path[:-5] if path.endswith(".json") else path
    return base + ".json", base + ".npz"


def to_dict(graph: Graph):
    return {
        "format": FORMAT, "version": FORMAT_VERSION, "name": graph.name,
        "inputs": list(graph.inputs), "params": list(graph.params), "consts": list(graph.consts),
        "types": {k: t.to_json() for k, t in graph.types.items()},
        "nodes": [{"name": n.name, "op": n.op, "inputs": list(n.inputs), "attrs": n.attrs} for n in graph.nodes],
        "outputs": list(graph.outputs), "updates": dict(graph.updates),
        **({"states": dict(graph.states)} if graph.states else {}),
        "meta": {k: v for k, v in graph.meta.items() if not k.startswith("_") and _jsonable(v)},
    }


def _jsonable(v):
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def save(graph: Graph, path):
    """Write ``path`` (.json) and its .npz; returns the JSON path. Writes are atomic."""
    jpath, npath = _paths(path)
    buf = io.BytesIO()
    np.savez(buf, **{f"t{k}": v for k, v in enumerate(list(graph.params.values()) + list(graph.consts.values()))})
    blob = buf.getvalue()
    d = to_dict(graph)
    d["tensors"] = {"file": os.path.basename(npath), "sha256": hashlib.sha256(blob).hexdigest()}
    atomic_write(npath, blob)
    atomic_write(jpath, json.dumps(d, indent=1).encode())
    return jpath


def load(path) -> Graph:
    jpath, npath = _paths(path)
    try:
        with open(jpath, "rb") as f:
            d = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise SerializationError(f"{jpath}: no such graph file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SerializationError(f"{jpath}: not a Kiln graph file (corrupt JSON: {e})") from None
    except RecursionError:
        raise SerializationError(f"{jpath}: not a Kiln graph file (JSON nested too deeply)") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise SerializationError(f"{jpath}: not a Kiln graph file (no 'format': '{FORMAT}' header)")
    v = d.get("version")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise SerializationError(f"{jpath}: invalid format version {v!r} (expected an integer 1..{FORMAT_VERSION})")
    if v > FORMAT_VERSION:
        raise SerializationError(f"{jpath}: format version {v} is newer than this Kiln reads "
                                 f"({FORMAT_VERSION}); upgrade Kiln")
    tinfo = d.get("tensors", {})
    if not isinstance(tinfo, dict) or not isinstance(d.get("params"), list) or not isinstance(d.get("consts"), list):
        raise SerializationError(f"{jpath}: malformed graph header ('tensors', 'params' and 'consts' missing "
                                 f"or of the wrong type)")
    # the tensor file always lies next to the JSON file (a path in the header is not followed)
    tfile = os.path.join(os.path.dirname(jpath), os.path.basename(str(tinfo.get("file", npath))))
    try:
        with open(tfile, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        raise SerializationError(f"{jpath}: tensor file {tfile} is missing") from None
    want = tinfo.get("sha256")
    if want and hashlib.sha256(blob).hexdigest() != want:
        raise SerializationError(f"{tfile}: checksum mismatch (corrupt or from another save of {jpath})")
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            arrays = [z[f"t{k}"] for k in range(len(d["params"]) + len(d["consts"]))]
    except (ValueError, KeyError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise SerializationError(f"{tfile}: corrupt tensor file ({type(e).__name__}: {e})") from None
    try:
        return from_dict(d, arrays)
    except (SerializationError, LimitError):
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, KilnError) as e:
        raise SerializationError(f"{jpath}: malformed graph ({type(e).__name__}: {e})") from None


def from_dict(d, arrays) -> Graph:
    g = Graph(d["name"])
    types = {k: TensorType.from_json(t) for k, t in d["types"].items()}
    names = list(d["params"]) + list(d["consts"])
    for k, name in enumerate(names):
        arr = arrays[k]
        (g.params if k < len(d["params"]) else g.consts)[name] = arr
    g.inputs = list(d["inputs"])
    g.types = types
    g.nodes = [Node(n["name"], n["op"], list(n["inputs"]), dict(n["attrs"])) for n in d["nodes"]]
    g.outputs = list(d["outputs"])
    g.updates = dict(d.get("updates", {}))
    g.states = dict(d.get("states", {}))
    g.meta = dict(d.get("meta", {}))
    try:
        g.validate()
    except (GraphError, ShapeError) as e:
        raise SerializationError(f"graph in file is invalid: {e}") from None
    return g
