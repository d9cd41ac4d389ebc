"""Wiring for hardware-in-the-loop: model -> C package -> firmware image -> device -> results.

This is the only place that joins the compiler (backends/) and the boards/firmware harness; the
CLI commands build, run, verify --target BOARD, bench and demo all call it.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time

import numpy as np

from kiln import boards, firmware
from kiln.backends import HostModel, get_backend, is_package, load_manifest
from kiln.backends.manifest import FILE, Manifest
from kiln.boards.device import IOSpec
from kiln.boards.errors import DeviceError
from kiln.boards.fake import FakeBoard
from kiln.boards.target import open_device
from kiln.boards.timing import CLASSES, estimate
from kiln.firmware.sizes import image_flash_split
from kiln.frontend import load, load_model, save
from kiln.frontend.errors import KilnError
from kiln.frontend.executor import run_stateful
from kiln.frontend.files import staged_dir


def compile_model(model, target, out_dir, ram_budget=None, plot=True, optimize="size", ram_reserved=None,
                  semantics=None):
    """Compile a Graph or model file to a C package; the source graph is saved beside it
    (graph.json) so later stages can compute reference outputs from the package alone, and a
    .tflite source is kept as source.tflite (for checks against LiteRT's reference kernels). The
    package and these files appear together or not at all (a staged folder moved into place).
    ``semantics``: frontend.load_model's (litert | tflm; None: what the model records)."""
    graph = load_model(model, semantics=semantics)
    with staged_dir(out_dir, "package folder", last=FILE) as tmp:
        pkg = get_backend("c").compile(graph, {"target": target, "out_dir": tmp, "ram_budget": ram_budget,
                                               "plot": plot, "optimize": optimize, "ram_reserved": ram_reserved})
        save(graph, os.path.join(tmp, "graph.json"))
        if isinstance(model, (str, os.PathLike)) and os.fspath(model).endswith(".tflite"):
            shutil.copyfile(model, os.path.join(tmp, "source.tflite"))
    return dataclasses.replace(pkg, path=os.fspath(out_dir))


def read_manifest(pkg_dir) -> Manifest:
    """A package's typed manifest (a named error when it is missing or unreadable)."""
    return load_manifest(pkg_dir)


def package_graph(pkg_dir):
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
                    port=None, lab_map=None, semantics=None):
    """Compile (unless ``model`` is already a package folder) and build firmware for ``board``.
    Returns (image, package_dir). A real board is built with its real memory sizes; ``emulate``
    builds its QEMU stand-in instead (the machine with the same core; default:
    :func:`emulate_by_default` for ``port`` / ``lab_map``, i.e. the real image only when there is
    real hardware to run it on)."""
    b = boards.load(board) if isinstance(board, str) else board
    if isinstance(model, (str, os.PathLike)) and is_package(os.fspath(model)):
        pkg_dir = os.fspath(model)
        t = read_manifest(pkg_dir).target
        if t != b.core:
            raise KilnError(f"package {pkg_dir} was compiled for {t}, board {b.name} has a {b.core}: "
                            f"recompile with --target {b.core}")
    else:
        pkg_dir = os.path.join(out_dir, "package")
        graph = load_model(model, semantics=semantics)
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
    m = getattr(image, "map", None)
    if m is None or getattr(image, "package_dir", None) is None or not os.path.exists(m):
        return None
    return image_flash_split(image)


@dataclasses.dataclass
class BoardRun:
    outputs: list               # per inference: one array, or a list (one per model output)
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
    mix: dict | None = None       # executed instruction classes of the profiled inference (QEMU)
    estimate: dict | None = None  # estimated cycles / ms from ``mix`` (kiln.boards.timing)

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


def sample_arrays(man, sample, k=0):
    """One sample as a list of arrays, one per model input, cast to the manifest's dtypes and
    shapes. A single-input model takes an array (or a one-element list); a model with several
    inputs takes a list or tuple with one array per input."""
    ins = man.inputs
    if len(ins) == 1 and not (isinstance(sample, (list, tuple)) and len(sample) == 1
                              and isinstance(sample[0], np.ndarray)):
        sample = [sample]
    if not isinstance(sample, (list, tuple)) or len(sample) != len(ins):
        raise KilnError(f"sample {k}: the model takes {len(ins)} inputs "
                        f"({', '.join(t.name for t in ins)}): give a list with one array each")
    out = []
    for x, t in zip(sample, ins):
        x = np.asarray(x)
        if x.size != int(np.prod(t.shape or [1])):
            raise KilnError(f"sample {k}, input {t.name}: {x.size} values, expected shape {t.shape}")
        out.append(np.ascontiguousarray(x.astype(t.dtype).reshape(t.shape)))
    return out


def unpack_outputs(man, parts):
    """Output bytes (one buffer per model output) -> one array, or a list of arrays."""
    outs = [np.frombuffer(b, dtype=t.dtype).reshape(t.shape).copy() for b, t in zip(parts, man.outputs)]
    return outs[0] if len(outs) == 1 else outs


def same_outputs(a, b):
    """Bit-exact comparison of two per-sample results (an array or a list of arrays)."""
    a = a if isinstance(a, (list, tuple)) else [a]
    b = b if isinstance(b, (list, tuple)) else [b]
    return len(a) == len(b) and all(np.array_equal(np.asarray(x).reshape(-1), np.asarray(y).reshape(-1))
                                    for x, y in zip(a, b))


def io_spec(man: Manifest) -> IOSpec:
    """What the board must report it runs (INFO): the package's input and output sizes and its
    number of commands."""
    return IOSpec(tuple(t.bytes for t in man.inputs), tuple(t.bytes for t in man.outputs), len(man.commands))


def invoke_budget(man, board):
    """Seconds an inference may take on ``board`` before the harness gives up: 20 cycles per MAC
    at the clock the firmware runs the core at (Kiln's kernels need 1-10 instructions per MAC)
    plus 10 s."""
    return 10.0 + 20.0 * man.macs / max(1, board.run_clock_hz)


def run_on_board(image, pkg_dir, inputs, *, port=None, lab_map=None, progress=None, device_kw=None):
    """Send every sample through the device (each one set-input/invoke/get-output transaction,
    redone if the board resets); returns a BoardRun. A sample is one array for a single-input
    model, else a list of arrays (one per input); each result likewise per output. Shapes and
    dtypes come from the package's manifest.json. ``progress`` is called after each inference
    with (k, n)."""
    man = read_manifest(pkg_dir)
    samples = [[x.tobytes() for x in sample_arrays(man, s, k)] for k, s in enumerate(inputs)]
    kw = {"expect": io_spec(man), "invoke_timeout": invoke_budget(man, image.board),
          **(device_kw or {})}
    outs, insns, ticks = [], [], []
    t0 = time.time()
    src, hz = "none", 0
    with open_device(image, port=port, lab_map=lab_map, qemu_kw=_qemu_kw(image), **kw) as dev:
        lost = (dev.stats.reboots_seen, dev.stats.restarts)
        for k, parts in enumerate(samples):
            got, res = dev.infer(parts)
            if man.states and (dev.stats.reboots_seen, dev.stats.restarts) != lost:
                # a redone inference would run from the reset state: never a wrong answer
                raise DeviceError(f"{dev.url}: the board reset during sample {k} of a stateful model's stream "
                                  f"(states {', '.join(s.name for s in man.states)}): the state the earlier "
                                  f"samples left is lost; run the stream again")
            outs.append(unpack_outputs(man, got))
            insns.append(res.instructions)
            ticks.append(res.ticks)
            src, hz = res.instruction_source or "none", res.timer_hz
            if progress:
                progress(k + 1, len(samples))
        prof = dev.get_profile() if samples else None
        stack = dev.get_stack()
        stats = dataclasses.asdict(dev.stats)
    profile = []
    for i, c in enumerate(man.commands):
        profile.append({"name": c.name, "ops": c.ops, "macs": c.macs,
                        "ticks": prof.ticks[i] if prof and i < len(prof.ticks) else None,
                        "instructions": (prof.instructions[i] if prof and prof.instructions
                                         and i < len(prof.instructions) else None)})
    sizes = image.sizes.to_dict() if hasattr(image.sizes, "to_dict") else dict(vars(image.sizes))
    split = flash_split(image)
    if split is not None:
        sizes.update(model_flash_bytes=split.model_flash_bytes, harness_flash_bytes=split.harness_bytes,
                     flash_breakdown=split.breakdown)
    run = BoardRun(outs, insns, src, ticks, hz, profile, stack.used, stack.size, sizes,
                   time.time() - t0, image.board.name, stats)
    if src == "qemu-plugin" and samples:
        attach_estimates(run, image)
    return run


# ---- instruction mix (QEMU plugin) -> estimated cycles -------------------------------------------
def read_mix(log_path):
    """The instruction mix of the last complete window of the plugin's log: (total, per command),
    each a {class: count} dict, the commands' from the differences of consecutive marks (as the
    per-command instruction counts are); None when the log has no complete window. Raises a
    FirmwareError when a window's class counts do not sum to its instruction count."""
    try:
        with open(log_path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    names, windows, insns = None, {}, {}
    for line in lines:
        if line.startswith("kiln-mix: names="):
            names = line.split("=", 1)[1].split(",")
        elif line.startswith("kiln-mix: window="):
            head, what, values = line.split(" ", 1)[1].split(" ")
            w = windows.setdefault(int(head.split("=")[1]), {"marks": []})
            vec = [int(v) for v in values.split(",")]
            if what == "end":
                w["end"] = vec
            else:
                w["marks"].append(vec)
        elif line.startswith("kiln-icount: window="):
            fields = dict(kv.split("=", 1) for kv in line.split(":", 1)[1].split())
            insns[int(fields["window"])] = int(fields["insns"])
    done = [k for k, w in windows.items() if "end" in w]
    if names is None or not done:
        return None
    k = max(done)
    w = windows[k]
    total = dict(zip(names, w["end"]))
    n = sum(total.get(c, 0) for c in CLASSES)
    if k in insns and n != insns[k]:
        raise firmware.FirmwareError(f"{log_path}: window {k}: instruction classes sum to {n:,}, the window "
                                     f"counted {insns[k]:,} instructions: a QEMU plugin bug")
    per = [{c: b - a for c, a, b in zip(names, m0, m1)} for m0, m1 in zip(w["marks"], w["marks"][1:])]
    return total, per


def _nonzero(mix):
    return {c: v for c, v in mix.items() if v}


def attach_estimates(run, image):
    """Fill ``run.mix`` / ``run.estimate`` and each profile row's ``mix`` / ``estimated_cycles`` /
    ``estimated_ms`` from the QEMU plugin's log (kiln.boards.timing's model for the image's
    board); left None when the log is not there or its commands do not match the profile."""
    kw = _qemu_kw(image)
    got = read_mix(os.path.join(kw["workdir"], "icount.log")) if kw else None
    if got is None:
        return
    total, per = got
    board = image.board
    run.mix = _nonzero(total)
    run.estimate = estimate(total, board).to_dict()
    rows = run.profile
    if len(per) != len(rows) or any(r["instructions"] is not None and
                                    r["instructions"] != sum(m.get(c, 0) for c in CLASSES)
                                    for r, m in zip(rows, per)):
        return
    for r, m in zip(rows, per):
        e = estimate(m, board)
        r.update(mix=_nonzero(m), estimated_cycles=e.cycles, estimated_ms=e.ms)


def reference_outputs(graph, inputs):
    """int8 (or float) reference executor outputs, one per sample (an array, or a list of
    arrays for a model with several outputs); a sample is as for :func:`run_on_board`. A stateful
    graph's samples are one stream from the reset state, as on a board."""
    types = [graph.types[n] for n in graph.inputs]
    res, state = [], {}
    for k, sample in enumerate(inputs):
        if len(types) == 1 and not (isinstance(sample, (list, tuple)) and len(sample) == 1
                                    and isinstance(sample[0], np.ndarray)):
            sample = [sample]
        if len(sample) != len(types):
            raise KilnError(f"sample {k}: the model takes {len(types)} inputs, got {len(sample)}")
        outs = run_stateful(graph, state, *[np.asarray(x).reshape(t.shape) for x, t in zip(sample, types)])
        res.append(outs[0] if len(outs) == 1 else list(outs))
    return res


def fake_board(pkg_dir, **kw):
    """A kiln.boards.fake.FakeBoard serving the compiled package ``pkg_dir`` (its C run on the
    host): a stand-in real board for ``kiln run --port`` and the harness's tests. DWT-style
    ticks (100 cycles + 2 per MAC per command), no instruction counts. kw go to FakeBoard (mode=, seed=, ...)."""
    man = read_manifest(pkg_dir)
    host = HostModel(pkg_dir)

    def model(parts):
        arrays = [np.frombuffer(b, t.dtype).reshape(t.shape) for b, t in zip(parts, man.inputs)]
        return [np.ascontiguousarray(o).tobytes() for o in host.run(*arrays)]
    kw.setdefault("command_cycles", [100 + 2 * c.macs for c in man.commands])
    kw.setdefault("arena_bytes", man.arena_bytes)
    return FakeBoard([t.bytes for t in man.inputs], [t.bytes for t in man.outputs],
                     model, **kw)
