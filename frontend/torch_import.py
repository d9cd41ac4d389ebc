"""PyTorch import: ``from_torch(module, example_inputs)`` runs ``torch.export`` and converts the
ExportedProgram; ``load_pt2(path)`` reads one saved with ``torch.export.save``.

- Parameters become Kiln parameters under their PyTorch names (``features.0.weight``), re-laid out
  to Kiln's layouts (docs/import.md); buffers (BatchNorm running statistics) become constants
  under their names; the graph's inputs are the ``forward`` arguments, by name, with the shapes
  and dtypes of the example inputs; outputs keep PyTorch's shapes and layout (NCHW stays NCHW).
- Each ATen op maps onto one or more Kiln ops through the converter table in ``torch_aten``
  (many-to-many: ``aten.linear`` is one ``dense``, ``aten.hardswish`` several Kiln ops, a
  ``permute`` often none). Ops the table lacks are decomposed by PyTorch's own decompositions
  first; what is still unsupported fails naming the op, the node and the Python line
  ``torch.export`` recorded.
- Nodes whose inputs are all constants (``torch.zeros`` for an LSTM state, ``arange``) are
  evaluated with torch at import.

torch is imported lazily: ``pip install 'kiln-ml[torch]'``.
"""
from __future__ import annotations

import os
import re
import traceback
import warnings

import numpy as np

from .errors import KilnError
from .import_blocks import UnsupportedError
from .import_layout import Builder, ImportError_, V


class TorchImportError(ImportError_):
    """torch.export could not capture a module, or its program uses what Kiln cannot import."""


def torch_module():
    try:
        import torch
    except ImportError:
        raise KilnError("importing PyTorch models needs torch: pip install 'kiln-ml[torch]'") from None
    return torch


# ---- entry points --------------------------------------------------------------------------------
def from_torch(module, example_inputs, name=None, strict=False):
    """Export ``module`` (in eval mode, restored afterwards) with torch.export and convert it."""
    torch = torch_module()
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    args = tuple(torch.as_tensor(np.asarray(a)) if isinstance(a, np.ndarray) else a for a in example_inputs)
    was_training = module.training
    module.eval()
    try:
        with warnings.catch_warnings():     # torch's own note about nn.LSTM's flat weights
            warnings.filterwarnings("ignore", message=".*were assigned during export.*")
            ep = torch.export.export(module, args, strict=strict)
    except Exception as e:     # torch raises many types for a graph break
        raise TorchImportError(f"torch.export could not capture {type(module).__name__}: {_export_message(e)}") \
            from None
    finally:
        module.train(was_training)
    return from_exported_program(ep, name or type(module).__name__)


def load_pt2(path):
    """A Kiln graph from an ExportedProgram file (``torch.export.save``)."""
    torch = torch_module()
    path = os.fspath(path)
    try:
        ep = torch.export.load(path)
    except Exception as e:
        raise TorchImportError(f"{path}: not a readable torch.export program ({type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}); save one with "
                               f"torch.export.save(torch.export.export(model, inputs), path)") from None
    return from_exported_program(ep, os.path.splitext(os.path.basename(path))[0])


def _export_message(e):
    """The first line of torch's error and the user's source line it came from: from the
    traceback (non-strict export runs the user's forward), else from the text (strict export's
    'from user code:' block, 'The following call raised this error: File ...')."""
    text = str(e).strip()
    head = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
    where = _user_frame(e) or _user_frame_in_text(text)
    hint = ("; data-dependent Python control flow on a tensor value cannot be exported: use torch.where or "
            "torch.cond" if "DataDependent" in type(e).__name__ or "data-dependent" in text else "")
    return head + (f" (at {where})" if where else "") + hint


def _is_user_file(path):
    here = os.path.dirname(os.path.abspath(__file__))           # Kiln's importer itself
    return not (path.startswith("<") or f"{os.sep}torch{os.sep}" in path
                or os.path.abspath(path).startswith(here + os.sep))


def _user_frame(e):
    frames = [f for f in traceback.extract_tb(e.__traceback__) if _is_user_file(f.filename)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename}:{f.lineno}: {(f.line or '').strip()}"


def _user_frame_in_text(text):
    frames = re.findall(r'File "([^"]+)", line (\d+)[^\n]*\n\s*([^\n]*)', text)
    user = [f for f in frames if _is_user_file(f[0])]
    if user:
        f, line, code = user[-1]
        return f"{f}:{line}: {code.strip()}"
    m = re.search(r"from user code:(.*)", text, re.S)
    lines = [ln.strip() for ln in (m.group(1).strip().splitlines() if m else []) if ln.strip()]
    return " | ".join(lines[-2:])


# ---- conversion ----------------------------------------------------------------------------------
def from_exported_program(ep, name="model"):
    from . import torch_aten
    bad = _unsupported(ep, torch_aten)
    if bad:
        ep = _decompose(ep, bad)
        bad = _unsupported(ep, torch_aten)
    if bad:
        node = bad[0]
        others = sorted({op_name(n) for n in bad[1:]} - {op_name(node)})
        raise UnsupportedError(f"unsupported ATen op {op_name(node)} (node {node.name!r}{source_line(node)})"
                               + (f"; also unsupported: {', '.join(others)}" if others else "")
                               + "; docs/import.md lists the supported ops")
    return _Converter(ep, name, torch_aten).run()


def op_name(node):
    t = node.target
    return f"aten.{t.__name__}" if hasattr(t, "overloadpacket") else getattr(t, "__name__", str(t))


def _key(node):
    t = node.target
    if hasattr(t, "overloadpacket"):
        return t.__name__, t.overloadpacket.__name__
    return getattr(t, "__name__", str(t)), None


def _unsupported(ep, table):
    out = []
    for n in ep.graph.nodes:
        if n.op == "call_function":
            full, packet = _key(n)
            if full not in table.ATEN and packet not in table.ATEN and not _all_const_inputs(n, ep):
                out.append(n)
    return out


def _all_const_inputs(node, ep):
    """Whether the node reads no user input (directly or through other nodes): it is folded."""
    memo = ep.__dict__.setdefault("_kiln_const", {})
    user = {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}
    params = {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "PARAMETER"}

    def dep(n):
        if n.name in memo:
            return memo[n.name]
        if n.op == "placeholder":
            r = n.name not in user and n.name not in params
        else:
            r = all(dep(a) for a in n.all_input_nodes)
        memo[n.name] = r
        return r
    return node.op == "call_function" and dep(node)


def _decompose(ep, bad):
    torch_module()             # a clear error when torch is missing
    from torch._decomp import core_aten_decompositions
    table = core_aten_decompositions()
    want = {n.target for n in bad}
    mine = {op: fn for op, fn in table.items() if op in want}
    if not mine:
        return ep
    try:
        return ep.run_decompositions(mine)
    except Exception:       # a decomposition that fails leaves the op to be reported
        return ep


def source_line(node):
    """', at FILE:LINE: code' of the user's frame torch.export recorded for ``node``."""
    st = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', st)
    torch_dir = os.sep + "torch" + os.sep
    user = [f for f in frames if torch_dir not in f[0]]
    if not (user or frames):
        return ""
    f, line, code = (user or frames)[-1]
    return f", at {f}:{line}: {code.strip()}"


class _Converter:
    def __init__(self, ep, name, table):
        self.ep, self.table = ep, table
        self.b = Builder(name)
        self.env = {}

    def value(self, a):
        import torch.fx
        if isinstance(a, torch.fx.Node):
            return self.env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self.value(x) for x in a)
        return a

    def run(self):
        b, ep = self.b, self.ep
        specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
        outputs, out_names = [], []
        for node in ep.graph.nodes:
            if node.op == "placeholder":
                self.env[node.name] = self.placeholder(node, specs[node.name])
            elif node.op == "call_function":
                try:
                    self.env[node.name] = self.call(node)
                except ImportError_ as e:
                    raise type(e)(f"{op_name(node)} (node {node.name!r}{source_line(node)}): {e}") from None
            elif node.op == "output":
                kinds = [s.kind.name for s in ep.graph_signature.output_specs]
                for a, s, k in zip(node.args[0], ep.graph_signature.output_specs, kinds):
                    if k == "USER_OUTPUT":
                        outputs.append(self.value(a))
                        out_names.append(s.arg.name if hasattr(s.arg, "name") else str(s.arg))
        b.meta.update(source="torch.export", torch_version=torch_module().__version__)
        return b.finish(outputs, out_names)

    def placeholder(self, node, spec):
        kind = spec.kind.name
        if kind == "USER_INPUT":
            val = node.meta["val"]
            dtype = str(val.dtype).replace("torch.", "")
            return self.b.input(node.name, [int(s) for s in val.shape], dtype)
        target = spec.target
        t = self.ep.state_dict.get(target) if kind in ("PARAMETER", "BUFFER") else None
        if t is None:
            t = self.ep.constants.get(target)
        if t is None:
            raise TorchImportError(f"{kind.lower()} {target!r} has no value in the exported program")
        arr = t.detach().cpu().numpy()
        return V(array=arr, pname=target, trainable=(kind == "PARAMETER"))

    def call(self, node):
        full, packet = _key(node)
        fn = self.table.ATEN.get(full) or self.table.ATEN.get(packet)
        if fn is None or (_all_const_inputs(node, self.ep) and not getattr(fn, "keep_params", False)
                          and not self._reads_params(node)):
            return self.fold(node)
        args = bind(node, self.value)
        return fn(self.b, args, node)

    def _reads_params(self, node):
        vals = [self.env.get(n.name) for n in node.all_input_nodes]
        return any(isinstance(v, V) and v.trainable for v in vals)

    def fold(self, node):
        """Evaluate a node of constants with torch."""
        torch = torch_module()

        def t(a):
            if isinstance(a, V):
                return torch.from_numpy(np.ascontiguousarray(a.array))
            if isinstance(a, (list, tuple)):
                return type(a)(t(x) for x in a)
            return a
        out = node.target(*t(self.value(node.args)), **{k: t(self.value(v)) for k, v in node.kwargs.items()})
        if isinstance(out, (tuple, list)):
            return tuple(self.b.const(o.detach().numpy()) if hasattr(o, "detach") else o for o in out)
        return self.b.const(out.detach().numpy()) if hasattr(out, "detach") else out


def bind(node, value):
    """{argument name: value} of an ATen call, defaults filled from the op's schema."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return {"args": value(node.args), **{k: value(v) for k, v in node.kwargs.items()}}
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out[arg.name] = value(node.args[i])
        elif arg.name in node.kwargs:
            out[arg.name] = value(node.kwargs[arg.name])
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out
