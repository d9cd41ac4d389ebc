"""The op registry: every op has a shape rule, a reference and a VJP (or is marked non-differentiable);
missing rules raise named errors; docs/ops.md is the registry's table.

Regenerate docs/ops.md with:  KILN_UPDATE_DOCS=1 .venv/bin/pytest tests/frontend/test_registry.py
"""
import os

import numpy as np
import pytest

import kiln.frontend as kf
from kiln.autodiff import grad
from kiln.commands.op_support import OP_COLUMNS, op_support
from kiln.frontend.errors import GraphError
from kiln.frontend.registry import NONDIFF, OPS, Attr, get_op, register

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "ops.md")

# ops that knowingly lack a rule, with the reason; strict xfail: fixing the gap makes the test fail
# until the entry is removed here
KNOWN_GAPS = {}


def _missing(op):
    out = []
    if op.infer is None:
        out.append("shape rule")
    if op.ref is None and op.int8_ref is None:
        out.append("reference")
    if op.vjp is None and NONDIFF not in op.props:
        out.append("VJP (or the 'nondiff' property)")
    return out


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[n])) if n in KNOWN_GAPS else n
    for n in sorted(OPS)])
def test_op_has_every_rule(name):
    missing = _missing(OPS[name])
    assert not missing, f"op '{name}' has no {', '.join(missing)}"


def test_coverage_check_names_an_incomplete_op():
    op = register("_test_incomplete", infer=lambda ts, a: ts[0], arity=1)
    try:
        assert _missing(op) == ["reference", "VJP (or the 'nondiff' property)"]
        assert [n for n in sorted(OPS) if _missing(OPS[n]) and n not in KNOWN_GAPS] == ["_test_incomplete"]
    finally:
        del OPS["_test_incomplete"]


def test_missing_rules_raise_named_errors():
    op = register("_test_norules", arity=1)
    try:
        g = kf.Graph("g")
        g.add_input("x", kf.TensorType((2,), "float32"))
        with pytest.raises(NotImplementedError, match="shape rule for '_test_norules' not implemented"):
            g.add_node("_test_norules", ["x"])
        op.infer = lambda ts, a: ts[0]
        g.add_node("_test_norules", ["x"], name="y")
        g.add_node("sum", ["y"], name="s")
        g.outputs = ["s"]
        with pytest.raises(NotImplementedError, match="NumPy reference for '_test_norules' not implemented"):
            kf.run(g, np.ones(2, np.float32))
        with pytest.raises(NotImplementedError, match="VJP for '_test_norules' not implemented"):
            grad(g, wrt=["x"])
        with pytest.raises(NotImplementedError, match="int8 reference for '_test_norules' not implemented"):
            op.rule("int8_ref")
    finally:
        del OPS["_test_norules"]


def test_unknown_op_and_double_registration_are_named():
    with pytest.raises(GraphError, match="unknown op 'conv3d'; registered ops: .*conv2d"):
        get_op("conv3d")
    with pytest.raises(GraphError, match="op 'add' registered twice"):
        register("add")


def test_every_nondiff_op_yields_no_gradient():
    for name, op in OPS.items():
        if NONDIFF in op.props and op.vjp is not None:
            assert all(g is None for g in op.vjp(None, [None] * (op.arity or 2), None, None)), name


# ---- docs/ops.md ---------------------------------------------------------------------------------
def _fmt_attr(k, a):
    from kiln.frontend.registry import REQUIRED
    d = "required" if a.default is REQUIRED else repr(list(a.default) if isinstance(a.default, tuple) else a.default)
    s = f"`{k}`: {a.type} = {d}"
    if a.choices:
        s += f" ({'/'.join(map(str, a.choices))})"
    return s


def ops_markdown():
    lines = [
        "# Kiln ops",
        "",
        "Generated from the op registry (`kiln.frontend.registry.OPS`, complete once `kiln.frontend` is imported) by",
        "`KILN_UPDATE_DOCS=1 .venv/bin/pytest tests/frontend/test_registry.py`; the test fails when this",
        "file is out of date. Layouts: activations NHWC, conv weights OHWI, dense weights [out, in].",
        "`vjp`: yes = a VJP rule (it emits graph nodes); nondiff = no gradient flows (comparisons, logic);",
        "no = differentiating through it raises `NotImplementedError(\"VJP for '<op>' not implemented\")`.",
        "Dtypes and targets (`kiln.commands.op_support.op_support`; `kiln inspect MODEL` answers per node",
        "of a model): `float`, `int8`, `int16` = Kiln's NumPy reference runs the op in that dtype (int8:",
        "TFLite's int8 kernel, int16: its 16x8 kernel, int16 activations with int8 weights; data",
        "movement copies any dtype); `C float` / `C int8` / `C int16` = the C backend, on the host",
        "and on every board; `host-llvm`, `cuda` = the server targets on float graphs; `cuda int8` /",
        "`cuda int16` = the CUDA backend's integer lowering has a rule for the op with int8 / int16",
        "activations; a rule may still refuse a node (one that calls a C helper, a graph that keeps",
        "state): `kiln inspect MODEL` answers per node by lowering it.",
        "",
        "| op | inputs | attrs | props | vjp | " + " | ".join(OP_COLUMNS) + " | defined in | notes |",
        "|---|---|---|---|---|" + "---|" * len(OP_COLUMNS) + "---|---|",
    ]
    for name in sorted(OPS):
        op = OPS[name]
        attrs = "<br>".join(_fmt_attr(k, a) for k, a in op.attrs.items()) or "—"
        vjp = "nondiff" if NONDIFF in op.props else ("yes" if op.vjp else "no")
        where = (op.infer.__module__ if op.infer else "?").replace("kiln.", "")
        doc = (op.doc or "").replace("|", "\\|")
        sup = op_support(name)
        cols = " | ".join("yes" if sup[c] else "—" for c in OP_COLUMNS)
        lines.append(f"| `{name}` | {op.arity if op.arity is not None else 'n'} | {attrs} | "
                     f"{', '.join(sorted(op.props)) or '—'} | {vjp} | {cols} | {where} | {doc} |")
    return "\n".join(lines) + "\n"


def test_docs_ops_md_is_up_to_date():
    text = ops_markdown()
    if os.environ.get("KILN_UPDATE_DOCS"):
        with open(DOC, "w") as f:
            f.write(text)
    assert os.path.exists(DOC), "docs/ops.md missing: run KILN_UPDATE_DOCS=1 pytest tests/frontend/test_registry.py"
    with open(DOC) as f:
        have = f.read()
    if have != text:
        missing = [n for n in OPS if f"| `{n}` |" not in have]
        pytest.fail(f"docs/ops.md is out of date (ops not listed: {missing}); regenerate with "
                    f"KILN_UPDATE_DOCS=1 .venv/bin/pytest tests/frontend/test_registry.py")


def test_attr_schema_checks():
    op = get_op("conv2d")
    assert op.normalize_attrs({"stride": (2, 2)})["stride"] == [2, 2]
    with pytest.raises(GraphError, match="must be int"):
        op.normalize_attrs({"groups": True})
    assert Attr("float").type == "float"
