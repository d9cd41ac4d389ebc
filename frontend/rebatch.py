"""The batch size of a graph's node attributes: a graph traced or imported at batch B runs at batch n
once the shapes its nodes carry as attributes follow (``reshape`` and ``broadcast_to`` targets,
``slice`` bounds on the batch axis). Used by quantize.with_batch, QAT and GraphModule."""
from __future__ import annotations


def rebatch_attrs(op, attrs, B, n):
    """``attrs`` of an ``op`` node for batch ``n`` instead of ``B`` (the same dict when nothing
    changes)."""
    if B == n:
        return attrs
    if op in ("reshape", "broadcast_to") and attrs.get("shape") and attrs["shape"][0] == B:
        return dict(attrs, shape=[n] + list(attrs["shape"][1:]))
    if op == "slice" and attrs.get("begin") and attrs["begin"][0] == 0 and attrs["end"][0] == B:
        return dict(attrs, end=[n] + list(attrs["end"][1:]))
    return attrs
