"""kiln inspect MODEL (.tflite, .onnx, .pt2, Kiln graph .json): ops table (shapes, dtypes,
quantisation), MACs, weight bytes and peak activation bytes (inputs and node outputs live from
definition to last use, in graph order; weights are not counted), and which targets can run each
op (kiln/commands/op_support.py: from the op registry and the backends' kernels, before compiling)."""
from __future__ import annotations

from kiln.frontend import load_model, semantics_of
from kiln.frontend.errors import KilnError
from kiln.frontend.registry import get_op
from kiln.tflm import add_semantics_argument

from .op_support import support_text, target_support


def add_arguments(p):
    p.add_argument("model", help="a .tflite, .onnx or .pt2 model or a Kiln graph .json")
    p.add_argument("--tensors", action="store_true", help="also list every constant (weights, biases)")
    add_semantics_argument(p)


def _q(t):
    q = t.quant
    if q is None:
        return ""
    if q.per_channel and len(q.scale) > 1:
        return f"axis {q.axis}: {len(q.scale)} scales [{min(q.scale):.3g}..{max(q.scale):.3g}]"
    return f"s={q.scale[0]:.6g} zp={q.zero_point[0]}"


def macs(graph, node) -> int:
    """Multiply-accumulates of one node (the op's ``macs`` rule: conv2d, dense, matmul and the
    conv gradients; 0 for the others)."""
    fn = get_op(node.op).macs
    if fn is None:
        return 0
    return int(fn([graph.types[i] for i in node.inputs], graph.types[node.name], node.attrs))


def peak_activation_bytes(graph) -> int:
    """Peak of the bytes of live activations (inputs + node outputs) over the graph order."""
    last = graph.last_use()
    live = {i: graph.types[i].nbytes for i in graph.inputs}
    peak = sum(live.values())
    for k, n in enumerate(graph.nodes):
        live[n.name] = graph.types[n.name].nbytes
        peak = max(peak, sum(live.values()))
        for v in [v for v in live if last.get(v, -1) <= k]:
            del live[v]
    return peak


def summarize(graph) -> dict:
    rows = []
    for k, n in enumerate(graph.nodes):
        ot = graph.types[n.name]
        ins = [f"{graph.types[i].dtype}{list(graph.types[i].shape)}" for i in n.inputs
               if graph.kind(i) in ("input", "node")]
        attrs = {a: v for a, v in n.attrs.items() if v not in (None, "none", [1, 1], 1, False)
                 and (a, v) != ("requant", "double")}
        rows.append({"index": k, "name": n.name, "op": n.op, "inputs": ins,
                     "output": f"{ot.dtype}{list(ot.shape)}", "quant": _q(ot), "macs": macs(graph, n),
                     "attrs": attrs})
    weights = {**graph.consts, **graph.params}
    return {"name": graph.name, "nodes": len(graph.nodes), "ops": rows,
            "inputs": [{"name": i, "type": str(graph.types[i])} for i in graph.inputs],
            "outputs": [{"name": o, "type": str(graph.types[o])} for o in graph.outputs],
            "constants": [{"name": k, "type": str(graph.types[k]), "quant": _q(graph.types[k]),
                           "bytes": int(v.nbytes)} for k, v in weights.items()],
            "macs": sum(r["macs"] for r in rows), "semantics": semantics_of(graph),
            "weight_bytes": int(sum(v.nbytes for v in weights.values())),
            "peak_activation_bytes": peak_activation_bytes(graph)}


def _text(s, tensors):
    lines = [f"{s['name']}: {s['nodes']} ops, {s['macs']:,} MACs, {s['weight_bytes']:,} weight bytes, "
             f"peak activations {s['peak_activation_bytes']:,} bytes",
             f"  semantics {s['semantics']} (" + ("TensorFlow Lite Micro's" if s["semantics"] == "tflm" else
                                                 "LiteRT's reference kernels'") + " integer arithmetic)"]
    for i in s["inputs"]:
        lines.append(f"  input  {i['name']}: {i['type']}")
    for o in s["outputs"]:
        lines.append(f"  output {o['name']}: {o['type']}")
    w = max([len(r["name"]) for r in s["ops"]] + [4])
    lines.append(f"  {'#':>3}  {'op':<11} {'name':<{min(w, 40)}}  {'output':<22} {'quantisation':<40} {'MACs':>12}")
    for r in s["ops"]:
        lines.append(f"  {r['index']:>3}  {r['op']:<11} {r['name'][:40]:<{min(w, 40)}}  {r['output']:<22} "
                     f"{r['quant']:<40} {r['macs']:>12,}")
    if tensors:
        lines.append("  constants:")
        for c in s["constants"]:
            lines.append(f"    {c['name']}: {c['type']} {c['quant']} ({c['bytes']:,} B)")
    return "\n".join(lines)


def run(args):
    g = load_model(args.model, semantics=args.semantics)
    if g is None:
        raise KilnError(f"{args.model}: could not load")
    s = summarize(g)
    s["model"] = str(args.model)
    s["targets"] = target_support(g)
    s["text"] = "\n".join([_text(s, args.tensors), *support_text(s["targets"])])
    return s
