"""docs/import.md lists the ATen and ONNX ops the importers convert and the Kiln ops the ONNX
exporter writes, generated from the converter tables; this test fails when the list is out of date.

Regenerate with:  KILN_UPDATE_DOCS=1 .venv/bin/pytest tests/frontend/test_import_doc.py
"""
import os
import re
import textwrap

import pytest

from kiln.frontend import onnx_ops, torch_aten
from kiln.frontend.onnx_export import ONNX_EXPORT

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "import.md")
START, END = "<!-- generated:ops -->", "<!-- end generated:ops -->"


def _names(names, prefix=""):
    return "\n".join(textwrap.wrap(", ".join(f"`{prefix}{n}`" for n in sorted(names)), 100,
                                   break_on_hyphens=False))


def generated():
    exportable = sorted(ONNX_EXPORT)
    return "\n".join([
        START,
        f"**PyTorch (ATen), {len(torch_aten.ATEN)}:**", "", _names(torch_aten.ATEN, "aten."), "",
        f"**ONNX, {len(onnx_ops.ONNX)}** (opsets 13+; `QuantizeLinear`/`DequantizeLinear` as QDQ pairs; nodes of "
        "constants of any op type are evaluated at import):", "", _names(onnx_ops.ONNX), "",
        f"**Export to ONNX: Kiln ops written, {len(exportable)}** (`kiln.frontend.registry.OPS` minus these "
        "are not exported):", "", _names(exportable),
        END,
    ])


def test_docs_import_md_is_up_to_date():
    with open(DOC) as f:
        have = f.read()
    assert START in have and END in have, f"{DOC} lost its generated-section markers"
    want = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda m: generated(), have, flags=re.S)
    if os.environ.get("KILN_UPDATE_DOCS"):
        with open(DOC, "w") as f:
            f.write(want)
        have = want
    if have != want:
        pytest.fail("docs/import.md's op lists are out of date; regenerate with "
                    "KILN_UPDATE_DOCS=1 .venv/bin/pytest tests/frontend/test_import_doc.py")


def test_every_listed_op_is_converted():
    """The lists name real table entries (not a hand copy): each ATen / ONNX name is in its table."""
    with open(DOC) as f:
        text = f.read()
    section = text[text.index(START):text.index(END)]
    for name in torch_aten.ATEN:
        assert f"`aten.{name}`" in section
    for name in onnx_ops.ONNX:
        assert f"`{name}`" in section
