"""LiteRT's reference kernels (``BUILTIN_REF``) as an oracle: run a .tflite on samples.

`kiln golden` writes golden pairs from it and `kiln run` checks a board's outputs against it when
the model came from a .tflite. LiteRT's default (XNNPACK / optimized) kernels are not the
specification (LiteRT's optimized ADD differs from its reference kernel by up to 2 LSB on
ResNet-8), so the reference resolver is always used."""
from __future__ import annotations

import os
import struct

import numpy as np
import tflite

from kiln.frontend.errors import KilnError
from kiln.frontend.loader import load_model


class OracleError(KilnError):
    """LiteRT could not load or run the model."""


class OracleUnsupported(OracleError):
    """A model LiteRT is known to run wrongly (it is not asked): TFLite Micro-only features."""


def refuse_unsupported(path, graph=None):
    """LiteRT's integer SVDF reads its state as int16: an int8 state (TFLite Micro's 8-bit SVDF)
    makes it write past the tensor and abort the whole process, so such models are refused.
    ``graph``: the model already loaded (else it is loaded here)."""
    if not os.fspath(path).endswith(".tflite"):
        return
    try:
        g = graph if graph is not None else load_model(path)
    except KilnError:
        return                      # LiteRT may still run what Kiln does not import
    bad = int8_state_svdfs(g)
    if bad:
        raise OracleUnsupported(f"{path}: SVDF {bad[0]!r} keeps an int8 state, which only TensorFlow Lite Micro runs: "
                          f"LiteRT's kernel reads it as int16 and corrupts memory; use Kiln's reference "
                          f"(--oracle reference)")


def int8_state_svdfs(graph) -> list[str]:
    """SVDF nodes keeping an int8 state (TFLite Micro's 8-bit SVDF), which LiteRT cannot run."""
    return [n.name for n in graph.nodes if n.op == "svdf_state" and graph.types[n.inputs[2]].dtype == "int8"]


def interpreter(path, graph=None):
    refuse_unsupported(path, graph)
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError as e:   # a core dependency; only a broken install gets here
        raise OracleError(f"LiteRT (ai-edge-litert) is not importable: {e}; reinstall Kiln's dependencies "
                          f"(bash scripts/setup.sh)") from None
    try:
        with open(os.fspath(path), "rb") as f:
            data = litert_loadable(f.read())
        it = Interpreter(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
        it.allocate_tensors()
    except Exception as e:   # LiteRT raises RuntimeError/ValueError with its own message
        raise OracleError(f"{path}: LiteRT's reference kernels cannot run this model: {str(e).strip()[:500]}") from None
    return it


def litert_loadable(data: bytes) -> bytes:
    """The model with each quantized_dimension beyond a tensor's rank set to 0 where it carries no
    information (one scale, or one per element of a rank-1 tensor: TOCO's conv biases in TFLite
    Micro's person_detect.tflite). TFLite Micro and Kiln accept such files, LiteRT's loader refuses
    them; the edit is an in-place int32 write that changes nothing else. Other files come back as
    they are."""
    try:
        g = tflite.Model.GetRootAsModel(data, 0).Subgraphs(0)
        n = g.TensorsLength()
    except Exception:      # not a readable model: LiteRT reports it
        return data
    buf = None
    for i in range(n):
        t = g.Tensors(i)
        q = t.Quantization()
        if q is None or not q.ScaleLength() or q.QuantizedDimension() < t.ShapeLength():
            continue
        slot = q._tab.Offset(16)      # 0: the field is absent (it reads 0; nothing to rewrite)
        if slot and q.QuantizedDimension() != 0 and \
                (q.ScaleLength() == 1 or (t.ShapeLength() == 1 and t.Shape(0) == q.ScaleLength())):
            buf = buf if buf is not None else bytearray(data)
            struct.pack_into("<i", buf, q._tab.Pos + slot, 0)
    return data if buf is None else bytes(buf)


def run_litert(path, samples, stream=False, graph=None) -> list[tuple]:
    """One tuple of outputs per sample (each a tuple of input arrays, in the model's input order).
    ``stream``: the samples are successive inputs of a stateful model (Kiln's ``graph.states``:
    SVDF), run from the reset state with the variable tensors carried from one to the next, as
    Kiln's runners and boards do; otherwise every sample starts from the zero state. ``graph``:
    the model already loaded by Kiln (it is not loaded again to check what LiteRT can run)."""
    it = interpreter(path, graph)
    ins, outs = it.get_input_details(), it.get_output_details()
    results = []
    for xs in samples:
        if len(xs) != len(ins):
            raise OracleError(f"{path}: a sample has {len(xs)} inputs, LiteRT's model takes {len(ins)}")
        for d, x in zip(ins, xs):
            it.set_tensor(d["index"], np.asarray(x).astype(d["dtype"], copy=False).reshape(d["shape"]))
        try:
            if not stream or not results:
                it.reset_all_variables()     # stateful ops (LSTM): every sample starts from the zero state
            it.invoke()
        except Exception as e:
            raise OracleError(f"{path}: LiteRT's reference kernels failed: {str(e).strip()[:500]}") from None
        results.append(tuple(it.get_tensor(d["index"]).copy() for d in outs))
    return results
