"""The op versions the importer accepts for these builtins are the ones LiteRT's reference
resolver registers (a mutant with a version LiteRT lacks must be refused by Kiln too)."""
import pytest

import kiln.frontend.tflite_checks as chk
from kiln.quantize import tflite_export
from tests.frontend.tflite_builder import Builder

BUILTINS = ["TRANSPOSE", "STRIDED_SLICE", "SLICE", "SQUEEZE", "EXPAND_DIMS", "SPLIT", "SPLIT_V", "PACK", "UNPACK",
            "GATHER", "EMBEDDING_LOOKUP", "RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR", "SUM", "REDUCE_MAX",
            "REDUCE_MIN", "CAST", "REVERSE_V2", "BROADCAST_TO", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH",
            "BATCH_TO_SPACE_ND", "SPACE_TO_BATCH_ND", "MIRROR_PAD", "PADV2", "GATHER_ND", "SHAPE", "FILL",
            "ZEROS_LIKE", "ARG_MAX", "ARG_MIN", "CUMSUM", "LOG_SOFTMAX", "L2_NORMALIZATION"]


def _registered(op, version, monkeypatch):
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    monkeypatch.setattr(tflite_export, "tflite_int8_versions", lambda: {op: version})
    b = Builder("v")
    x, y = b.tensor("x", (1, 2)), b.tensor("y", (1, 2))
    b.op(op, [x], [y], None, True)
    try:
        interp.Interpreter(model_content=b.build([x], [y]),
                           experimental_op_resolver_type=interp.OpResolverType.BUILTIN_REF)
    except ValueError as e:
        return "Didn't find op" not in str(e)
    return True


@pytest.mark.parametrize("op", BUILTINS)
def test_version_bound_is_litert_reference_resolvers(op, monkeypatch):
    hi = chk.VERSIONS[op]
    assert _registered(op, hi, monkeypatch)
    assert not _registered(op, hi + 1, monkeypatch)
