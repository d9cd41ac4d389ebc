"""Wiring for hardware-in-the-loop: model -> C package -> firmware image -> device -> results.

This is the only place that joins the compiler (backends/) and the boards/firmware harness; the
CLI commands build, run, verify --target BOARD, bench and demo all call it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time

import numpy as np

from kiln.frontend import load_model
from kiln.frontend.errors import KilnError
from kiln.frontend.files import staged_dir


def is_package(path):
    return os.path.isdir(path) and os.path.exists(os.path.join(path, "manifest.json"))


def compile_model(model, target, out_dir, ram_budget=None, plot=True, optimize="size", ram_reserved=None):
    """Compile a Graph or model file to a C package; the source graph is saved beside it
    (graph.json) so later stages can compute reference outputs from the package alone, and a
    .tflite source is kept as source.tflite (for checks against LiteRT's reference kernels). The
    package and these files appear together or not at all (a staged folder moved into place)."""
    from kiln import backends
    from kiln.frontend import save
    graph = load_model(model)
    with staged_dir(out_dir, "package folder", last="manifest.json") as tmp:
        pkg = backends.compile(graph, target=target, out_dir=tmp, ram_budget=ram_budget, plot=plot,
                               optimize=optimize, ram_reserved=ram_reserved)
        save(graph, os.path.join(tmp, "graph.json"))
        if isinstance(model, (str, os.PathLike)) and os.fspath(model).endswith(".tflite"):
            shutil.copyfile(model, os.path.join(tmp, "source.tflite"))
    return dataclasses.replace(pkg, path=os.fspath(out_dir))


def read_manifest(pkg_dir):
    """A package's manifest.json as a dict (a named error when it is missing or unreadable)."""
    p = os.path.join(pkg_dir, "manifest.json")
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise KilnError(f"{pkg_dir}: not a readable Kiln package ({p}: {e}); compile it with `kiln compile`") from None


def package_graph(pkg_dir):
    from kiln.frontend import load
    p = os.path.join(pkg_dir, "graph.json")
    if not os.path.exists(p):
        raise KilnError(f"{pkg_dir} has no graph.json: compile it with `kiln compile` to get reference outputs")
    return load(p)


def emulate_by_default(board, port=None, lab_map=None):
    """Whether a run on ``board`` uses the QEMU stand-in: a real board with no port given and no
    lab-map entry for it runs its stand-in image (same core and memory sizes) under QEMU; with a
    port or a lab-map entry the real image is built and flashed."""
    if board.emulated or port:
        return False
    return not (lab_map is not None and board.name in lab_map.boards())


def build_for_board(model, board, out_dir, *, emulate=None, ram_budget=None, stack_size=8192, optimize="size",
                    port=None, lab_map=None):
    """Compile (unless ``model`` is already a package folder) and build firmware for ``board``.
    Returns (image, package_dir). A real board is built with its real memory sizes; ``emulate``
    builds its QEMU stand-in instead (the machine with the same core; default:
    :func:`emulate_by_default` for ``port`` / ``lab_map``, i.e. the real image only when there is
    real hardware to run it on)."""
    from kiln import boards, firmware
    b = boards.load(board) if isinstance(board, str) else board
    if isinstance(model, (str, os.PathLike)) and is_package(os.fspath(model)):
        pkg_dir = os.fspath(model)
        with open(os.path.join(pkg_dir, "manifest.json")) as f:
            t = json.load(f)["target"]
        if t != b.core:
            raise KilnError(f"package {pkg_dir} was compiled for {t}, board {b.name} has a {b.core}: "
                            f"recompile with --target {b.core}")
    else:
        pkg_dir = os.path.join(out_dir, "package")
        graph = load_model(model)
        io = {"input buffer": sum(graph.types[v].nbytes for v in graph.inputs),
              "output buffer": sum(graph.types[v].nbytes for v in graph.outputs), "stack": stack_size}
        compile_model(graph, b.core, pkg_dir, ram_budget=ram_budget or b.ram_region.size, optimize=optimize,
                      ram_reserved=io)
    if emulate is None:
        emulate = emulate_by_default(b, port, lab_map)
    image = firmware.build(pkg_dir, b, os.path.join(out_dir, "firmware"), emulate=emulate, stack_size=stack_size)
    return image, pkg_dir


def flash_split(image):
    """The image's flash split into the model's share (TFLM's "library + model") and the
    harness's, from its linker map (:func:`kiln.firmware.sizes.flash_split`); None when the
    image has no map or package folder to read."""
    from kiln.firmware.sizes import image_flash_split
    m = getattr(image, "map", None)
    if m is None or getattr(image, "package_dir", None) is None or not os.path.exists(m):
        return None
    return image_flash_split(image)


@dataclasses.dataclass
class BoardRun:
    outputs: list
    instructions: list          # per inference (exact under QEMU's plugin)
    instruction_source: str
    ticks: list
    timer_hz: int
    profile: list               # per command: {name, macs, instructions, ticks}
    stack_used: int
    stack_size: int
    sizes: dict
    seconds: float
    board: str
    stats: dict

    def to_dict(self):
        d = dataclasses.asdict(self)
        d.pop("outputs")
        return d


def _qemu_kw(image):
    """QEMU's logs (qemu.log, stderr, the instruction-count log) go to a qemu/ folder beside the
    image, so they live and go with its build folder (a command's temporary build folder is
    removed unless --keep) instead of a new folder under /tmp per run."""
    d = os.path.dirname(os.path.abspath(os.fspath(image.elf)))
    return {"workdir": os.path.join(d, "qemu")} if os.access(d, os.W_OK) else None


def run_on_board(image, pkg_dir, inputs, *, port=None, lab_map=None, progress=None):
    """Send every input through the device; returns a BoardRun. ``progress`` is called after
    each inference with (k, n)."""
    from kiln.boards.target import open_device
    with open(os.path.join(pkg_dir, "manifest.json")) as f:
        man = json.load(f)
    out_t = man["outputs"][0]
    in_t = man["inputs"][0]
    outs, insns, ticks = [], [], []
    t0 = time.time()
    src, hz = "none", 0
    with open_device(image, port=port, lab_map=lab_map, qemu_kw=_qemu_kw(image)) as dev:
        for k, x in enumerate(inputs):
            x = np.ascontiguousarray(np.asarray(x).astype(in_t["dtype"]).reshape(in_t["shape"]))
            y, res = dev.run(x.tobytes())
            outs.append(np.frombuffer(y[:out_t["bytes"]], dtype=out_t["dtype"]).reshape(out_t["shape"]).copy())
            insns.append(res.instructions)
            ticks.append(res.ticks)
            src, hz = res.instruction_source, res.timer_hz
            if progress:
                progress(k + 1, len(inputs))
        prof = dev.get_profile()
        stack = dev.get_stack()
        stats = dataclasses.asdict(dev.stats)
    cmds = man["commands"]
    profile = []
    for i, c in enumerate(cmds):
        profile.append({"name": c["name"], "ops": c.get("ops"), "macs": c.get("macs", 0),
                        "ticks": prof.ticks[i] if i < len(prof.ticks) else None,
                        "instructions": (prof.instructions[i] if prof.instructions and i < len(prof.instructions) else None)})
    sizes = image.sizes.to_dict() if hasattr(image.sizes, "to_dict") else dict(vars(image.sizes))
    split = flash_split(image)
    if split is not None:
        sizes.update(model_flash_bytes=split.model_flash_bytes, harness_flash_bytes=split.harness_bytes,
                     flash_breakdown=split.breakdown)
    return BoardRun(outs, insns, src, ticks, hz, profile, stack.used, stack.size, sizes,
                    time.time() - t0, image.board.name, stats)


def reference_outputs(graph, inputs):
    """int8 (or float) reference executor outputs, one per input."""
    from kiln.frontend import run
    return [run(graph, np.asarray(x).reshape(graph.types[graph.inputs[0]].shape))[0] for x in inputs]
