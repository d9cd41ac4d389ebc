"""Which targets can run each op of a model, before anything is compiled, derived from the op
registry and the backends' kernels (no table of its own):

- ``reference``: Kiln's NumPy executor: the op's NumPy reference (``OpDef.ref``), or for a node
  with quantised operands its int8 reference (``OpDef.int8_ref``; data movement runs as it is).
- ``c``: the C backend, for the host and for every board: a C kernel (``OpDef.lower["c"]``) or the
  op's TE compute (``OpDef.te``) on the C backend's data types; a quantised node needs an int8
  C kernel (a C kernel and an int8 reference), or is data movement.
- ``int8``: after ``kiln quantize``, on the host C package and the boards: a float node PTQ
  folds away (constant arithmetic, BatchNorm) or fuses (ReLU into the conv) is ``folded``; the
  others need an int8 rule (``OpDef.quant``) and an int8 C kernel. An int8 node: as ``c``.
- ``host-llvm``: the op's TE compute, on float operands (it compiles float graphs).
- ``cuda``: a float node: the op's TE compute; a quantised node: the CUDA int8 lowering
  (``backends/cuda_int8.py``, int8 and 16x8) lowers it, asked by lowering the node
  (``node_refusal``).
"""
from __future__ import annotations

from kiln.frontend.errors import KilnError
from kiln.frontend.graph_passes import prepare
from kiln.frontend.registry import INT16, SHAPE, get_op

TARGETS = ("reference", "c", "int8", "host-llvm", "cuda")
TARGET_TITLES = {"reference": "reference", "c": "C (host, boards)", "int8": "int8 (host, boards)",
                 "host-llvm": "host-llvm", "cuda": "cuda"}


def _c_backend():
    """The C backend's kernels, registered in the op registry when it is imported (TVM)."""
    from kiln.backends import ops as _c_kernels  # noqa: F401  (fills OpDef.lower["c"])
    from kiln.backends.lower import BACKEND, C_DTYPES
    return BACKEND, C_DTYPES


def _cuda_int8():
    """The CUDA int8 lowering (TVM): which quantised nodes and ops it takes."""
    from kiln.backends import cuda_int8
    return cuda_int8


def _quantised(graph, node):
    return any(graph.types[v].quant is not None for v in [*node.inputs, node.name])


def _int16(graph, node):
    return any(graph.types[v].quant is not None and graph.types[v].dtype == "int16" for v in [*node.inputs, node.name])


def _survivors(graph):
    """Names of the nodes PTQ keeps (None when the graph is not a float graph PTQ starts from)."""
    if any(graph.types[i].quant is not None or not graph.types[i].is_float for i in graph.inputs):
        return None
    try:
        return {n.name for n in prepare(graph).nodes}
    except KilnError:
        return None


def node_support(graph, node, backend, c_dtypes, survivors) -> dict:
    op = get_op(node.op)
    q = _quantised(graph, node)
    shape = SHAPE in op.props
    c_kernel = backend in op.lower
    bias64 = {v for v in node.inputs if v in graph.consts or v in graph.params} if _int16(graph, node) else set()
    dtypes_ok = all(graph.types[v].dtype in c_dtypes or (v in bias64 and graph.types[v].dtype == "int64")
                    for v in [*node.inputs, node.name])   # 16x8 kernels take their int64 bias as a constant
    int_rule = op.int8_ref is not None and (INT16 in op.props or not _int16(graph, node))   # 16x8: the int16 prop
    c_int8 = dtypes_ok and ((c_kernel and int_rule) or (shape and op.te is not None))
    c_float = dtypes_ok and (c_kernel or op.te is not None)
    s = {"reference": (int_rule or (shape and op.ref is not None)) if q else op.ref is not None,
         "c": c_int8 if q else c_float,
         "host-llvm": not q and op.te is not None,
         "cuda": _cuda_int8().node_refusal(graph, node) is None if q else op.te is not None}
    if q:
        s["int8"] = c_int8
    elif survivors is not None and node.name not in survivors:
        s["int8"] = "folded"
    else:
        s["int8"] = op.quant is not None and c_int8
    return s


def target_support(graph) -> dict:
    """{"targets", "ops": [{op, nodes, quantised, <target>: True/False/"folded"}], "unsupported":
    {target: [node names]}}: one row per (op, quantised or not) of the model, in graph order."""
    backend, c_dtypes = _c_backend()
    survivors = _survivors(graph)
    rows, seen, unsupported = {}, {}, {t: [] for t in TARGETS}
    for n in graph.nodes:
        s = node_support(graph, n, backend, c_dtypes, survivors)
        key = (n.op, _quantised(graph, n))
        rows.setdefault(key, {"op": n.op, "quantised": key[1], "nodes": 0})["nodes"] += 1
        for t in TARGETS:
            seen.setdefault((key, t), set()).add(s[t])
            if s[t] is False:
                unsupported[t].append(n.name)
    for key, row in rows.items():
        for t in TARGETS:
            marks = seen[(key, t)]       # NO when one node cannot run; folded when all are folded
            row[t] = False if False in marks else "folded" if marks == {"folded"} else True
    return {"targets": list(TARGETS), "ops": list(rows.values()),
            "unsupported": {t: v for t, v in unsupported.items() if v},
            "runs_on": [t for t in TARGETS if not unsupported[t]]}


OP_COLUMNS = ("float", "int8", "int16", "C float", "C int8", "C int16", "host-llvm", "cuda", "cuda int8",
              "cuda int16")


def op_support(name) -> dict:
    """What one op runs as, from its registry entry and the C backend's kernels (docs/ops.md's
    table; ``node_support`` answers the same for a node of a given model). Reference dtypes:
    ``float`` (a NumPy reference), ``int8`` (an int8 reference; data movement copies any
    dtype), ``int16`` (TFLite's 16x8 kernel: the ``int16`` prop). ``C ...``: the C backend
    (host and every board) for that dtype: a C kernel plus the reference's integer rule, or the
    TE compute for float and data movement. ``host-llvm`` and ``cuda`` compile float graphs;
    ``cuda int8`` / ``cuda int16``: the CUDA backend's integer lowering has a rule for the op
    with int8 / int16 activations (``cuda_int8.op_takes``)."""
    backend, _ = _c_backend()
    op = get_op(name)
    shape = SHAPE in op.props
    c_kernel = backend in op.lower
    int8 = op.int8_ref is not None or (shape and op.ref is not None)
    int16 = (op.int8_ref is not None and INT16 in op.props) or (shape and op.ref is not None)
    c_int = c_kernel or (shape and op.te is not None)
    return {"float": op.ref is not None, "int8": int8, "int16": int16,
            "C float": c_kernel or op.te is not None, "C int8": int8 and c_int, "C int16": int16 and c_int,
            "host-llvm": op.te is not None, "cuda": op.te is not None,
            "cuda int8": int8 and _cuda_int8().op_takes(op), "cuda int16": int16 and _cuda_int8().op_takes(op, True)}


def support_text(sup) -> list[str]:
    mark = {True: "yes", False: "NO", "folded": "folded"}
    w = max([len(r["op"]) + (7 if r["quantised"] else 0) for r in sup["ops"]] + [4])
    cols = [TARGET_TITLES[t] for t in sup["targets"]]
    lines = ["  targets (from the op registry and the backends' kernels, before compiling; int8: after "
             "`kiln quantize`, folded = folded or fused by it):",
             f"    {'op':<{w}} {'nodes':>5}  " + "  ".join(f"{c:<{max(len(c), 6)}}" for c in cols)]
    for r in sup["ops"]:
        name = r["op"] + (" (int8)" if r["quantised"] else "")
        lines.append(f"    {name:<{w}} {r['nodes']:>5}  "
                     + "  ".join(f"{mark[r[t]]:<{max(len(c), 6)}}" for t, c in zip(sup["targets"], cols)))
    for t, names in sup["unsupported"].items():
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        lines.append(f"    not on {TARGET_TITLES[t]}: {', '.join(names[:5])}{more}")
    return lines
