"""The package layering of docs/ARCHITECTURE.md, read from the code: which top-level package
imports which (imports anywhere in a module, inside functions too), no cycle between packages,
and no function outside the tests longer than 100 lines."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("common", "frontend", "autodiff", "training", "quantize", "backends", "firmware", "boards", "kiln")
# package -> the packages it may import (besides itself); kiln/ wires everything together
ALLOWED = {
    "common": set(),
    "frontend": {"common"},
    "autodiff": {"common", "frontend"},
    "training": {"common", "frontend", "autodiff"},
    "quantize": {"common", "frontend", "autodiff", "training"},     # training: QAT fine-tunes with fit()
    "backends": {"common", "frontend", "quantize"},
    "firmware": {"common", "boards"},                               # a build reads the board's data
    "boards": {"common"},
    "kiln": set(PACKAGES) - {"kiln"},
}


def _modules(pkg):
    for dirpath, dirnames, files in os.walk(os.path.join(ROOT, pkg)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                with open(path) as fh:
                    yield os.path.relpath(path, ROOT), ast.parse(fh.read())


def _package_of(module):
    parts = module.split(".")
    if parts[0] != "kiln":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else "kiln"


def import_graph():
    """{package: {imported package: [where]}}."""
    graph = {p: {} for p in PACKAGES}
    for pkg in PACKAGES:
        for path, tree in _modules(pkg):
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [f"kiln.{a.name}" for a in node.names] if node.module == "kiln" else [node.module]
                else:
                    continue
                for name in names:
                    target = _package_of(name)
                    if target and target != pkg:
                        graph[pkg].setdefault(target, []).append(f"{path}:{node.lineno}")
    return graph


def test_packages_import_only_their_layers():
    bad = [f"{p} -> {q} ({', '.join(where[:3])})" for p, deps in import_graph().items() for q, where in deps.items()
           if q not in ALLOWED[p]]
    assert not bad, "imports against the layering of docs/ARCHITECTURE.md:\n" + "\n".join(bad)


def test_no_cycle_between_packages():
    graph = {p: set(d) for p, d in import_graph().items()}
    state = {}

    def visit(p, path):
        state[p] = "open"
        for q in graph[p]:
            assert state.get(q) != "open", "import cycle: " + " -> ".join(path + [q])
            if q not in state:
                visit(q, path + [q])
        state[p] = "done"
    for p in PACKAGES:
        if p not in state:
            visit(p, [p])


def test_no_function_longer_than_100_lines():
    long = []
    for top in PACKAGES + ("benchmarks", "scripts"):
        if not os.path.isdir(os.path.join(ROOT, top)):
            continue
        for path, tree in _modules(top):
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > 100:
                        long.append(f"{path}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these functions:\n" + "\n".join(long)


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def test_no_private_names_imported_across_packages():
    """A package uses another's public names only (``from kiln.frontend.ops import _te`` would
    tie it to a module its owner may change at will)."""
    bad = []
    for pkg in PACKAGES:
        for path, tree in _modules(pkg):
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ImportFrom) and not node.level and node.module
                        and node.module.startswith("kiln")):
                    continue
                if _package_of(node.module) in (pkg, None) and node.module != "kiln":
                    continue
                names = [a.name for a in node.names] + node.module.split(".")
                bad += [f"{path}:{node.lineno} {node.module}: {n}" for n in names if _private(n)]
    assert not bad, "private names imported across packages:\n  " + "\n  ".join(bad)
