"""Forward mode and second-order products, built from reverse mode by graph extension.

``jvp`` uses the transpose trick: the VJP graph ``u -> J^T u`` is linear in the cotangent ``u``,
so differentiating ``<J^T u, v>`` with respect to ``u`` gives ``J v``. The cotangent is replaced by
a zero constant (the result does not depend on it) and dead nodes are pruned, so the result is a
graph whose inputs are the original inputs plus one tangent per ``wrt`` value, and whose
tangent values are ordinary graph nodes.
"""
from __future__ import annotations

import numpy as np

from kiln.frontend import functional as F
from kiln.frontend.errors import GraphError
from kiln.frontend.tensor import Tensor
from kiln.frontend.types import TensorType

from .reverse import backprop, prune, vjp


def _contract(g, pairs):
    """sum_i sum(a_i * b_i) as one scalar Tensor."""
    total = None
    for a, b in pairs:
        s = F.sum(a * b)
        total = s if total is None else total + s
    return total


def jvp(graph, of=None, wrt=None, *, keep_outputs=False, name=None):
    """Jacobian-vector product graph of ``of`` (default: the first output) with respect to ``wrt``
    (default: every parameter). Inputs: the graph's inputs, then one tangent per ``wrt`` value
    (``tangent_<name>``, shaped like it). Output: J v (shaped like ``of``), preceded by the original
    outputs when ``keep_outputs``."""
    of = of or graph.outputs[0]
    wrt = list(graph.params) if wrt is None else list(wrt)
    g = vjp(graph, of, wrt, keep_outputs=True, name=name or f"jvp_{graph.name}")
    cot = g.inputs[-1]
    ct = g.types[cot]
    # the cotangent becomes a constant zero: J v does not depend on its value
    g.inputs.remove(cot)
    g.consts[cot] = np.zeros(ct.shape, ct.dtype)
    nfwd = len(graph.outputs)
    grads = [Tensor(g, o) for o in g.outputs[nfwd:]]
    tangents = [Tensor(g, g.add_input(f"tangent_{w.replace('.', '_')}", TensorType(g.types[w].shape, g.types[w].dtype)))
                for w in wrt]
    s = _contract(g, zip(grads, tangents))
    jv = backprop(g, s.name, F.constant(np.ones((), s.dtype), g), [cot])[cot]
    if jv is None:
        jv = F.constant(np.zeros(ct.shape, ct.dtype), g)
    g.outputs = (list(graph.outputs) if keep_outputs else []) + [jv.name]
    g.meta["jvp"] = {"of": of, "wrt": wrt, "tangents": [t.name for t in tangents]}
    g = prune(g)
    if not any(cot in n.inputs for n in g.nodes) and cot not in g.outputs:
        del g.consts[cot], g.types[cot]     # J v never reads the (zero) cotangent
    return g.validate()


def hvp(graph, of=None, wrt=None, *, name=None):
    """Hessian-vector product graph of scalar ``of``: inputs gain one vector per ``wrt`` value;
    outputs are H v, one per ``wrt`` value."""
    of = of or graph.outputs[0]
    wrt = list(graph.params) if wrt is None else list(wrt)
    if graph.types[of].size != 1:
        raise GraphError(f"hvp: output {of!r} has shape {graph.types[of].shape}; the Hessian needs a scalar")
    g = vjp(graph, of, wrt, name=name or f"hvp_{graph.name}", _scalar=True)
    grads = [Tensor(g, o) for o in g.outputs]
    vs = [Tensor(g, g.add_input(f"v_{w.replace('.', '_')}", TensorType(g.types[w].shape, g.types[w].dtype)))
          for w in wrt]
    s = _contract(g, zip(grads, vs))
    hv = backprop(g, s.name, F.constant(np.ones((), s.dtype), g), wrt)
    outs = []
    for w in wrt:
        h = hv[w]
        if h is None:
            h = F.constant(np.zeros(g.types[w].shape, g.types[w].dtype), g)
        outs.append(h.name)
    g.outputs = outs
    g.meta["hvp"] = {"of": of, "wrt": wrt, "vectors": [v.name for v in vs]}
    return prune(g).validate()
