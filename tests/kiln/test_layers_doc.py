"""docs/layers.md is generated from kiln.nn and kiln.F and kept up to date; every layer and function
has a description (its docstring, or the doc of the op it emits)."""
import os

import pytest

from kiln import F, nn
from kiln.docs_util import LAYERS_MD, functional_entries, layers_markdown, main, nn_entries


def test_docs_layers_md_is_up_to_date():
    text = layers_markdown()
    if os.environ.get("KILN_UPDATE_DOCS"):
        main([LAYERS_MD])
    assert os.path.exists(LAYERS_MD), "docs/layers.md missing: run .venv/bin/python -m kiln.docs_util"
    with open(LAYERS_MD) as f:
        have = f.read()
    if have != text:
        pytest.fail("docs/layers.md is out of date with kiln.nn / kiln.F: regenerate it with "
                    ".venv/bin/python -m kiln.docs_util")


def test_every_layer_and_function_is_listed_and_described():
    text = layers_markdown()
    for name, _obj in nn_entries():
        assert f"### `nn.{name}(" in text, name
    for name, _fn in functional_entries():
        assert f"| `F.{name}(" in text, name
    assert "(no description)" not in text, [l for l in text.splitlines() if "(no description)" in l]


def test_entries_cover_the_public_api():
    nn_names = {n for n, _ in nn_entries()}
    assert {"Module", "Linear", "Conv2d", "BatchNorm2d", "Dropout", "Sequential", "manual_seed"} <= nn_names
    f_names = {n for n, _ in functional_entries()}
    assert {"conv2d", "dense", "relu", "softmax", "reshape", "where", "constant"} <= f_names
    # helpers F imports from elsewhere and kiln does not re-export are not part of F's reference
    assert "as_tensor" not in f_names and "current_graph" not in f_names
    assert all(callable(getattr(F, n)) for n in f_names) and all(hasattr(nn, n) for n in nn_names)


def test_signatures_are_the_real_ones():
    text = layers_markdown()
    assert ("### `nn.Conv2d(in_channels, out_channels, kernel_size, stride=1, padding='valid', dilation=1, "
            "groups=1, bias=True, activation='none')`") in text
    assert "| `F.dense(x, w, b=None, activation='none')` |" in text
    assert "named_modules(prefix='')" in text       # private parameters (_memo) are left out


def test_main_writes_the_file(tmp_path):
    out = tmp_path / "layers.md"
    assert main([str(out)]) == 0
    assert out.read_text() == layers_markdown()
