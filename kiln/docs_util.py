"""Generated Markdown in docs/: benchmark tables (each tool owns one '## Title' section of a
Markdown file, written only when asked with ``--write``) and the layer reference docs/layers.md
(every layer of ``kiln.nn`` and function of ``kiln.F``, from their signatures and docstrings).

    .venv/bin/python -m kiln.docs_util          # rewrite docs/layers.md from the code
"""
from __future__ import annotations

import inspect
import os
import re
import sys

import kiln
from kiln import F, nn
from kiln.errors import KilnError, UsageError
from kiln.frontend.registry import OPS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS_MD = os.path.join(ROOT, "docs", "benchmarks.md")
LAYERS_MD = os.path.join(ROOT, "docs", "layers.md")


def write_section(path, text):
    """Replace the section whose first line is ``text``'s first line (a '## Title' header) in the
    Markdown file at ``path``, or append it; other sections are left untouched."""
    header = text.splitlines()[0].rstrip()
    if not header.startswith("## "):
        raise ValueError(f"a section must start with a '## ' header, got {header!r}")
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    pat = re.compile(rf"^{re.escape(header)}[ \t]*\n.*?(?=^## |\Z)", re.S | re.M)
    body = text.rstrip("\n") + "\n"
    if pat.search(old):
        new = pat.sub(lambda m: body + "\n", old, count=1).rstrip("\n") + "\n"
    else:
        new = old.rstrip("\n") + "\n\n" + body
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(new)
    os.replace(path + ".tmp", path)


# ---- command-line helpers of the benchmark tools -----------------------------------------------
def checkout_benchmarks_md():
    """docs/benchmarks.md of the source checkout Kiln runs from, or None for an installed copy
    (there is no docs/ folder to write into then)."""
    ok = os.path.exists(os.path.join(ROOT, "pyproject.toml")) and os.path.isdir(os.path.dirname(BENCHMARKS_MD))
    return BENCHMARKS_MD if ok else None


def add_write_argument(p, section):
    """``--write [PATH]``: replace ``section`` of a Markdown file (default: the checkout's
    docs/benchmarks.md); without it a tool only prints."""
    p.add_argument("--write", nargs="?", const="", default=None, metavar="PATH",
                   help=f"also replace the '{section}' section of the Markdown file PATH (default PATH: "
                        f"docs/benchmarks.md of the source checkout); without --write nothing is written")


def write_path(value):
    """The file ``--write`` names, or None without --write; a UsageError when --write came without
    a PATH and Kiln runs from an installed copy (no docs/benchmarks.md to default to)."""
    if value is None:
        return None
    if value:
        return value
    default = checkout_benchmarks_md()
    if default is None:
        raise UsageError(f"--write needs a PATH here: Kiln runs from an installed copy ({ROOT}), which has "
                         f"no docs/benchmarks.md (e.g. --write benchmarks.md)")
    return default


def add_shared_argument(p):
    p.add_argument("--shared", default=None, metavar="DIR",
                   help="folder holding models/ with the shared MLPerf Tiny .tflite files and golden pairs "
                        "(default: $KILN_SHARED)")


def shared_models(shared, names, flag=None):
    """Paths of ``names`` (file names) in ``shared``/models, ``shared`` from --shared or
    $KILN_SHARED; a UsageError naming both (and ``flag``, the tool's other way to name models)
    when neither is given or a file is missing."""
    shared = shared or os.environ.get("KILN_SHARED")
    if not shared:
        raise UsageError(f"no models to run: pass {flag + ', or ' if flag else ''}--shared DIR (or set "
                         f"KILN_SHARED=DIR) naming the folder whose models/ holds {', '.join(names)}")
    d = os.path.join(shared, "models")
    paths = [os.path.join(d, n) for n in names]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        src = "--shared" if shared != os.environ.get("KILN_SHARED") else "KILN_SHARED"
        raise UsageError(f"{src} {shared}: {', '.join(missing)} not found; point --shared (or KILN_SHARED) at "
                         f"the folder whose models/ holds {', '.join(names)}{', or pass ' + flag if flag else ''}")
    return paths


def script_main(main):
    """Run a benchmark script's ``main()``; a Kiln error (e.g. no --shared) prints one line and
    exits 2 instead of a traceback."""
    try:
        return main() or 0
    except KilnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


# ---- docs/layers.md ----------------------------------------------------------------------------
def _signature(obj, drop_self=False):
    """The call signature without annotations (they are strings under `from __future__ import
    annotations` and add noise here), private parameters (``_memo``) and, for methods, ``self``."""
    sig = inspect.signature(obj)
    params = [p.replace(annotation=inspect.Parameter.empty) for n, p in sig.parameters.items()
              if not n.startswith("_") and not (drop_self and n == "self")]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def first_paragraph(obj):
    """The first paragraph of ``obj``'s own docstring on one line ('' when it has none; a class
    does not inherit its parent's)."""
    doc = obj.__doc__
    if not doc:
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def _description(name, fn):
    own = first_paragraph(fn)
    if own:
        return own
    if name in OPS and OPS[name].doc:
        return f"emits op [`{name}`](ops.md): {OPS[name].doc}"
    return ""


def nn_entries():
    """(name, object) of kiln.nn's public classes and functions, in name order."""
    return [(n, o) for n, o in sorted(vars(nn).items())
            if not n.startswith("_") and (inspect.isclass(o) or inspect.isfunction(o))]


def functional_entries():
    """(name, function) of kiln.F: the functions defined in it, and the ones it imports that the
    ``kiln`` package re-exports (kiln.constant), in name order."""
    return [(n, o) for n, o in sorted(vars(F).items())
            if not n.startswith("_") and inspect.isfunction(o)
            and (o.__module__ == F.__name__ or getattr(kiln, n, None) is o)]


def _nn_section(name, obj):
    L = [f"### `nn.{name}{_signature(obj)}`", "", first_paragraph(obj) or "(no description)", ""]
    fwd = vars(obj).get("forward") if inspect.isclass(obj) else None
    if fwd is not None and name != "Module":
        L += [f"Called as `layer{_signature(fwd, drop_self=True)}`.", ""]
    if obj is nn.Module:
        for m, fn in vars(obj).items():
            if not m.startswith("_") and inspect.isfunction(fn) and m != "forward":
                L.append(f"- `{m}{_signature(fn, drop_self=True)}`: {first_paragraph(fn) or '(no description)'}")
        L.append("")
    return L


def layers_markdown():
    """The text of docs/layers.md."""
    L = ["# Layers and functions", "",
         "Every layer of `kiln.nn` and every function of `kiln.F` (`from kiln import nn, F`), with its "
         "signature. Generated from the code by `.venv/bin/python -m kiln.docs_util`; a test fails when "
         "this file is out of date. Layouts: activations NHWC, conv weights OHWI `[out, kh, kw, in / "
         "groups]`, dense weights `[out, in]`. Each function adds nodes to the graph being traced "
         "(`kiln.trace`); the ops they emit, with their attributes, gradients and int8 support, are in "
         "[ops.md](ops.md).", "", "## kiln.nn", ""]
    for name, obj in nn_entries():
        L += _nn_section(name, obj)
    L += ["## kiln.F", "", "| function | description |", "|---|---|"]
    for name, fn in functional_entries():
        desc = (_description(name, fn) or "(no description)").replace("|", "\\|")
        L.append(f"| `F.{name}{_signature(fn)}` | {desc} |")
    return "\n".join(L) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else LAYERS_MD
    with open(path + ".tmp", "w") as f:
        f.write(layers_markdown())
    os.replace(path + ".tmp", path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
