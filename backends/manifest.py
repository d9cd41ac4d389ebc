"""The typed manifest of a compiled package: one dataclass, :class:`Manifest`, for C packages
(docs/c_package.md) and CUDA packages (docs/server_targets.md), one loader (:func:`load_manifest`)
and one saver (:func:`save_manifest`). Everything downstream of a backend (firmware builds, the
host harness, ``kiln run``/``verify``/``bench``) reads a package through this module.

On disk ``manifest.json`` keeps its format: a flat JSON object whose keys are listed in
``C_KEYS`` / ``CUDA_KEYS``. Keys this version of Kiln does not know are kept in
:attr:`Manifest.extra` and written back unchanged.

    m = load_manifest("out/kws")          # a Manifest; named KilnError when missing or malformed
    m.arena_bytes, m.inputs[0].shape, m.commands[3].macs
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

from kiln.common.errors import KilnError

FILE = "manifest.json"
C_FORMAT = "kiln-c-package"
CUDA_FORMAT = 1


class ManifestError(KilnError):
    """A package folder without a readable, well-formed manifest.json."""


@dataclass
class Tensor:
    """A package input or output (for CUDA packages also a weight or a buffer update): its type and
    where its bytes are."""
    name: str
    shape: list[int]
    dtype: str
    bytes: int
    offset: int = 0                  # C: in the arena; CUDA: in ``space`` (inputs: the arena)
    packed: int | None = None        # C: offset inside the packed input / output buffer
    scale: float | None = None       # C: quantisation parameters (None: float, or per-channel)
    zero_point: int | None = None
    space: str | None = None         # CUDA outputs, updates: "arena" | "weights"
    value: str | None = None         # CUDA outputs, updates: the graph value stored there
    kind: str | None = None          # CUDA inputs: "input"

    def to_c(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "bytes": self.bytes,
                "offset": self.offset, "packed": self.packed, "scale": self.scale, "zero_point": self.zero_point}


@dataclass
class Command:
    """One command of a C package's command buffer (a fused kernel call)."""
    name: str
    ops: str | None = None           # the ops it covers, "+"-joined
    nodes: list[str] = field(default_factory=list)
    c_function: str | None = None
    macs: int = 0
    offs: list[int] = field(default_factory=list)   # arena offsets of its buffers


@dataclass
class Arg:
    """An argument of a CUDA step or kernel launch: a location in the arena or the weights blob,
    or a scalar."""
    value: str | None = None
    space: str | None = None         # "arena" | "weights"
    offset: int = 0
    bytes: int = 0
    scalar: int | float | None = None
    dtype: str | None = None         # of a scalar

    def to_dict(self) -> dict:
        if self.scalar is not None:
            return {"scalar": self.scalar, "dtype": self.dtype}
        return {"value": self.value, "space": self.space, "offset": self.offset, "bytes": self.bytes}


@dataclass
class Launch:
    kernel: str
    grid: list[int]
    block: list[int]
    shared_bytes: int = 0
    args: list[Arg] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block),
                "shared_bytes": self.shared_bytes, "args": [a.to_dict() for a in self.args]}


@dataclass
class Step:
    """One fused function of a CUDA package: its arguments (inputs first) and its kernel launches."""
    step: int
    func: str
    schedule: str | None
    args: list[Arg]
    n_inputs: int
    launches: list[Launch]

    def to_dict(self) -> dict:
        return {"step": self.step, "func": self.func, "schedule": self.schedule,
                "args": [a.to_dict() for a in self.args], "n_inputs": self.n_inputs,
                "launches": [L.to_dict() for L in self.launches]}


@dataclass
class ArenaBuffer:
    """A buffer of a CUDA package's arena plan: alive from step ``first`` to ``last``."""
    name: str
    bytes: int
    first: int
    last: int
    offset: int
    kind: str


@dataclass
class Manifest:
    """A package's manifest.json. Fields that belong to the other kind of package keep their
    defaults (``is_cuda`` tells which kind this is)."""
    target: str                      # a C target (host, cortex-m4, ...) or "cuda"
    model: str                       # the graph's name ("graph" on disk for CUDA packages)
    arena_bytes: int
    inputs: list[Tensor]
    outputs: list[Tensor]
    kernels: list[str] = field(default_factory=list)
    format: str | int = C_FORMAT
    semantics: str | None = None     # quantised models: "litert" | "tflm", whose integer arithmetic (frontend/loader.py)
    # ---- C packages
    version: int = 1
    dsp: bool = False
    optimize: str | None = None
    arena_peak: int | None = None
    planner: str | None = None
    planner_tried: dict = field(default_factory=dict)
    weight_bytes: int = 0
    input_bytes: int = 0
    output_bytes: int = 0
    commands: list[Command] = field(default_factory=list)
    macs: int = 0
    files: list[str] = field(default_factory=list)
    sizes: dict = field(default_factory=dict)         # arm-none-eabi-gcc code/data sizes
    compile_seconds: float | None = None
    state_bytes: int = 0             # stateful graphs: RAM of the states kept between runs (outside the arena)
    states: list[Tensor] = field(default_factory=list)   # name: the state; offset: its next value in the arena
    # ---- CUDA packages
    arch: str | None = None
    dtype: str | None = None
    signature: str | None = None
    tvm: str | None = None
    sources: list[str] = field(default_factory=list)
    alignment: int | None = None
    weights_file: str | None = None
    weights_bytes: int = 0
    user_inputs: list[str] = field(default_factory=list)
    dropout_masks: list[dict] = field(default_factory=list)
    updates: list[Tensor] = field(default_factory=list)   # name: the buffer a train-mode graph updates
    weights: list[Tensor] = field(default_factory=list)
    buffers: list[ArenaBuffer] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    launches: int = 0                # number of kernel launches
    build_seconds: float | None = None
    extra: dict = field(default_factory=dict)         # keys this version of Kiln does not know

    @property
    def is_cuda(self) -> bool:
        return self.target == "cuda"

    def to_dict(self) -> dict:
        """The manifest.json object (key order as written by the backends)."""
        d = _cuda_dict(self) if self.is_cuda else _c_dict(self)
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = FILE) -> Manifest:
        """Parse a manifest.json object; raises ManifestError naming ``where`` and the key."""
        try:
            return _parse(cls, d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            what = f"missing key {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
            raise ManifestError(f"{where}: not a valid Kiln package manifest ({what}); recompile the package "
                                f"with `kiln compile`") from None


C_KEYS = ("format", "version", "model", "target", "dsp", "optimize", "arena_bytes", "arena_peak", "planner",
          "planner_tried", "weight_bytes", "inputs", "outputs", "input_bytes", "output_bytes", "commands",
          "kernels", "macs", "files", "sizes", "compile_seconds", "state_bytes", "states", "semantics")
CUDA_KEYS = ("format", "target", "arch", "dtype", "graph", "signature", "tvm", "sources", "arena_bytes",
             "alignment", "weights_file", "weights_bytes", "user_inputs", "dropout_masks", "inputs", "outputs",
             "updates", "weights", "buffers", "kernels", "steps", "launches", "build_seconds", "semantics")


def _c_dict(m: Manifest) -> dict:
    d = {}
    for k in C_KEYS:
        v = getattr(m, k)
        if (k in ("state_bytes", "states") and not m.states) or (k == "semantics" and m.semantics is None):
            continue                 # written by stateful packages only; by quantised ones
        if k in ("inputs", "outputs", "states"):
            v = [t.to_c() for t in v]
        elif k == "commands":
            v = [dataclasses.asdict(c) for c in v]
        d[k] = v
    return d


def _cuda_tensor(t: Tensor, first: str = "name") -> dict:
    """The keys a CUDA manifest has for a tensor: those that are set (``first`` names the key that
    holds ``name``: "buffer" for updates)."""
    d = {first: t.name}
    order = ("value", "space", "offset", "bytes", "shape", "dtype") if t.value is not None else \
        ("shape", "dtype", "kind", "space", "offset", "bytes")
    for f in order:
        v = getattr(t, f)
        if v is not None:
            d[f] = list(v) if f == "shape" else v
    return d


def _cuda_dict(m: Manifest) -> dict:
    d = {}
    for k in CUDA_KEYS:
        if k == "graph":
            v = m.model
        elif k in ("inputs", "outputs", "weights"):
            v = [_cuda_tensor(t) for t in getattr(m, k)]
        elif k == "updates":
            v = [_cuda_tensor(t, "buffer") for t in m.updates]
        elif k == "buffers":
            v = [dataclasses.asdict(b) for b in m.buffers]
        elif k == "steps":
            v = [s.to_dict() for s in m.steps]
        elif k == "semantics" and m.semantics is None:
            continue                 # written by quantised packages only
        else:
            v = getattr(m, k)
        d[k] = v
    return d


_TENSOR_KEYS = {f.name for f in dataclasses.fields(Tensor)}
_COMMAND_KEYS = {f.name for f in dataclasses.fields(Command)}


def _tensor(d: dict, name_key: str = "name") -> Tensor:
    kw = {k: v for k, v in d.items() if k in _TENSOR_KEYS and k != "name"}
    return Tensor(name=d[name_key], **{**kw, "shape": list(d["shape"]), "bytes": int(d["bytes"])})


def _arg(d: dict) -> Arg:
    if "scalar" in d:
        return Arg(scalar=d["scalar"], dtype=d.get("dtype"))
    return Arg(value=d["value"], space=d["space"], offset=int(d["offset"]), bytes=int(d["bytes"]))


def _step(d: dict) -> Step:
    launches = [Launch(L["kernel"], list(L["grid"]), list(L["block"]), int(L.get("shared_bytes", 0)),
                       [_arg(a) for a in L["args"]]) for L in d["launches"]]
    return Step(int(d["step"]), d["func"], d.get("schedule"), [_arg(a) for a in d["args"]], int(d["n_inputs"]),
                launches)


def _parse(cls, d: dict) -> Manifest:
    if not isinstance(d, dict):
        raise TypeError(f"expected a JSON object, found {type(d).__name__}")
    cuda = d.get("target") == "cuda"
    plain = {f.name for f in dataclasses.fields(cls)} - {"model", "inputs", "outputs", "commands", "updates", "states",
                                                          "weights", "buffers", "steps", "extra"}
    kw = {k: d[k] for k in plain if k in d}
    ins, outs = [_tensor(t) for t in d["inputs"]], [_tensor(t) for t in d["outputs"]]
    kw.setdefault("input_bytes", sum(t.bytes for t in ins))
    kw.setdefault("output_bytes", sum(t.bytes for t in outs))
    kw.update(
        target=d["target"],
        model=d.get("graph" if cuda else "model") or d.get("name") or "",
        arena_bytes=int(d["arena_bytes"]),
        inputs=ins,
        outputs=outs,
        commands=[Command(**{k: v for k, v in c.items() if k in _COMMAND_KEYS}) for c in d.get("commands", [])],
        updates=[_tensor(t, "buffer") for t in d.get("updates", [])],
        states=[_tensor(t) for t in d.get("states", [])],
        weights=[_tensor(t) for t in d.get("weights", [])],
        buffers=[ArenaBuffer(**b) for b in d.get("buffers", [])],
        steps=[_step(s) for s in d.get("steps", [])],
        extra={k: v for k, v in d.items() if k not in C_KEYS + CUDA_KEYS + ("name",)})
    return cls(**kw)


def manifest_path(pkg_dir) -> str:
    return os.path.join(os.fspath(pkg_dir), FILE)


def is_package(path) -> bool:
    """Whether ``path`` is a package folder (a folder with a manifest.json)."""
    p = os.fspath(path)
    return os.path.isdir(p) and os.path.exists(manifest_path(p))


def load_manifest(pkg_dir) -> Manifest:
    """The manifest of the package folder ``pkg_dir``; a named error when it is missing, not JSON
    or not a Kiln manifest."""
    p = manifest_path(pkg_dir)
    if not os.path.exists(p):
        raise ManifestError(f"{pkg_dir}: no {FILE} (not a Kiln package); compile a model with `kiln compile`")
    try:
        with open(p) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise ManifestError(f"{pkg_dir}: not a readable Kiln package ({p}: {e}); compile it with `kiln compile`") \
            from None
    return Manifest.from_dict(d, p)


def save_manifest(pkg_dir, manifest: Manifest) -> str:
    """Write ``manifest`` as ``pkg_dir``/manifest.json; returns the path."""
    p = manifest_path(pkg_dir)
    with open(p, "w") as f:
        json.dump(manifest.to_dict(), f, indent=1)
    return p
