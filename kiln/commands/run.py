"""kiln run MODEL --board B: run a model on a board (QEMU, or a real board with --port or a lab
map) and check every output against Kiln's reference executor (bit for bit for integer outputs,
within a tolerance for float ones) and, for a .tflite model, against LiteRT's reference kernels.
Reports latency (exact instructions per layer and in total under QEMU, with cycles and
milliseconds estimated from the executed instruction mix, labelled "estimated"; measured cycles
and milliseconds at the running core clock on real hardware) and memory. With --data, every sample of a data file
runs on the board and the accuracy (labels) or error (expected outputs) is reported for the float
model, the int8 reference, the C package on the host and the board.

kiln run MODEL --target T runs the model on a backend instead (reference, host, host-llvm, cuda,
cuda-plan: the targets of kiln/targets.py, from the one registry of backends) and compares it
with Kiln's reference executor."""
from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from kiln import boards, hil
from kiln.backends import host_model, is_package
from kiln.boards.labmap import load_lab_map
from kiln.commands import BuildFolder, add_optimize_argument
from kiln.commands.labgrid_options import add_farm_arguments, farm_lease
from kiln.commands.verify import comparison_rule
from kiln.frontend import load_model
from kiln.frontend.errors import KilnError
from kiln.frontend.loader import semantics_of
from kiln.litert import OracleUnsupported, run_litert
from kiln.report import plot_roofline
from kiln.samples import Samples, load_samples, random_inputs
from kiln.targets import BACKEND_TARGETS, get_target, run_reference, run_target
from kiln.tflm import add_semantics_argument, check_package_semantics, oracle_for, run_tflm

# float outputs of a board vs the NumPy reference: same float32 operations in a different order
FLOAT_RTOL, FLOAT_ATOL = 1e-4, 1e-5


def add_arguments(p):
    p.add_argument("model", help=".tflite, Kiln graph .json, or a compiled package folder")
    add_optimize_argument(p)
    p.add_argument("--board", default=None, help="board name (see `kiln boards`)")
    p.add_argument("--target", default=None, help="run on a backend instead of a board: "
                   + " | ".join(BACKEND_TARGETS) + " (compared with Kiln's reference executor)")
    p.add_argument("--inputs", type=int, default=4, help="number of seeded random inputs (default: 4)")
    p.add_argument("--golden", default=None, help="use the inputs of a golden .npz (see `kiln golden`)")
    p.add_argument("--data", default=None, help="samples .npz with inputs and labels or expected outputs: "
                   "report accuracy / error on the board (see README, 'Sample files')")
    p.add_argument("--limit", type=int, default=None, help="use at most this many samples of --data")
    p.add_argument("--float-model", default=None, help="the float model an int8 model was quantised from, "
                   "for the float column of --data (default: the one `kiln quantize` recorded, if any)")
    p.add_argument("--port", default=None, help="serial port / pyserial URL of a real board")
    p.add_argument("--lab-map", default=None, help="lab map TOML naming which real board is on which port")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("-o", "--out", default=None, help="build folder (default: a temporary folder, removed "
                   "afterwards unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the temporary build folder")
    add_semantics_argument(p)
    p.add_argument("--plot", default=None, metavar="PNG", help="write the per-layer roofline (instructions, "
                   "MACs per instruction against the core's ceiling) to this PNG (boards only)")
    add_farm_arguments(p)


# ---- samples -----------------------------------------------------------------------------------
def _samples(graph, args):
    if args.data and args.golden:
        raise KilnError("give --data or --golden, not both")
    if args.data or args.golden:
        s = load_samples(args.data or args.golden, graph, limit=args.limit)
        if not len(s):
            raise KilnError(f"{args.data or args.golden}: no samples")
        return s
    if args.inputs < 1:
        raise KilnError(f"--inputs must be at least 1, got {args.inputs}")
    return Samples(random_inputs(graph, args.inputs, args.seed), None, "inputs",
                   f"{args.inputs} random inputs (seed {args.seed})")


def as_tuple(o):
    return tuple(o) if isinstance(o, (tuple, list)) else (o,)


# ---- comparisons -------------------------------------------------------------------------------
def compare_outputs(got, want):
    """(match, worst |difference|, exact) of one sample's outputs: bit-exact for integer outputs,
    within FLOAT_ATOL + FLOAT_RTOL * |want| for float ones."""
    worst, ok, exact = 0.0, True, True
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape and a.size == b.size:
            a = a.reshape(b.shape)
        if a.shape != b.shape:
            return False, float("inf"), exact
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        worst = max(worst, float(d.max(initial=0.0)))
        if b.dtype.kind in "iub":
            ok &= bool((d == 0).all())
        else:
            exact = False
            ok &= bool((d <= FLOAT_ATOL + FLOAT_RTOL * np.abs(b.astype(np.float64))).all())
    return ok, worst, exact


def check(name, got_list, want_list):
    res = [compare_outputs(g, w) for g, w in zip(got_list, want_list)]
    bad = [k for k, r in enumerate(res) if not r[0]]
    exact = all(r[2] for r in res)
    return {"against": name, "match": not bad, "mismatched_samples": bad,
            "worst_abs_diff": max((r[1] for r in res), default=0.0),
            "rule": "bit-exact" if exact else f"|diff| <= {FLOAT_ATOL:g} + {FLOAT_RTOL:g} * |expected|"}


def _tflite_source(model, pkg_dir):
    """The .tflite a run can be checked against with LiteRT: the model itself, or the one the
    package was compiled from (kept in the package as source.tflite)."""
    if os.fspath(model).endswith(".tflite"):
        return os.fspath(model)
    p = os.path.join(pkg_dir, "source.tflite")
    return p if os.path.exists(p) else None


# ---- metrics over a data file -------------------------------------------------------------------
def metrics(outs, samples):
    """Accuracy (labels) or error (expected outputs) of outputs over samples; None without targets."""
    if samples.targets is None:
        return None
    if samples.kind == "labels":
        pred = [int(np.argmax(np.asarray(o[0]).reshape(-1))) for o in outs]
        return {"accuracy": float(np.mean(np.asarray(pred) == np.asarray(samples.targets)))}
    err, lsb = [], []
    for o, t in zip(outs, samples.targets):
        for a, b in zip(o, t):
            a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
            err.append(a - b)
            if np.asarray(t[0]).dtype.kind in "iu":
                lsb.append(np.abs(a - b))
    e = np.concatenate(err) if err else np.zeros(1)
    m = {"mse": float(np.mean(e ** 2)), "mae": float(np.mean(np.abs(e))), "max_abs_error": float(np.abs(e).max())}
    if lsb:
        m["max_error_lsb"] = int(np.concatenate(lsb).max())
    return m


def _float_model(graph, args):
    path = args.float_model or graph.meta.get("float_model")
    if not path:
        return None
    if not os.path.exists(path):
        if args.float_model:
            raise KilnError(f"--float-model {path} not found")
        return None
    return load_model(path)


def _data_report(graph, pkg_dir, samples, board_outs, ref_outs, args):
    """accuracy / error per stage for --data: float model, int8 reference, host C, board."""
    rows = {}
    fg = _float_model(graph, args)
    if fg is not None and fg is not graph:
        fs = load_samples(args.data or args.golden, fg, limit=args.limit)
        rows["float (host)"] = metrics(run_reference(fg, fs.inputs), fs)
    rows["reference (host)"] = metrics(ref_outs, samples)
    host = host_model(pkg_dir)
    rows["C package (host)"] = metrics([tuple(host.run(*xs)) for xs in samples.inputs], samples)
    rows[f"board ({args.board})"] = metrics(board_outs, samples)
    return rows


# ---- the command ------------------------------------------------------------------------------
def run(args):
    with farm_lease(args) as lease:
        if lease is not None:       # a labgrid place: its board, over its serial port
            if args.board not in (None, lease.board) or args.port:
                raise KilnError(f"--labgrid: the place holds a {lease.board}: give no --board (or that "
                                f"one) and no --port")
            args.board, args.port = lease.board, lease.url
        rep = _run(args, lease)
        if lease is not None:
            rep["labgrid"] = {"place": lease.place_name, "board": lease.board, "coordinator": lease.address,
                              "url": args.port}
        return rep


def _run(args, lease=None):
    check_package_semantics(args.model, args.semantics)
    if args.target in BACKEND_TARGETS:
        return _run_target(args)
    if args.target is not None:
        raise KilnError(f"--target {args.target!r}: kiln run takes --board B, or --target "
                        f"{'|'.join(BACKEND_TARGETS)}")
    if not args.board:
        raise KilnError(f"kiln run needs --board B (see `kiln boards`) or --target {'|'.join(BACKEND_TARGETS)}")
    if args.limit is not None and args.limit < 1:
        raise KilnError(f"--limit must be at least 1, got {args.limit}")
    board = boards.load(args.board)
    lab_map = load_lab_map(args.lab_map) if args.lab_map else None
    temp = args.out is None
    out = args.out or tempfile.mkdtemp(prefix=f"kiln_run_{args.board}_")
    try:
        rep = _run_on(board, args, out, lab_map, lease)
    finally:
        if temp and not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    rep["build"] = out if (not temp or args.keep) else None
    if args.plot:
        plot_roofline(rep["per_layer"], args.plot, f"{os.path.basename(args.model)} on {args.board}: "
                      f"{rep['instructions_per_inference'] or 0:,} instructions")
        rep["plot"] = os.path.abspath(args.plot)
    rep["text"] = _table(rep) + (f"\nroofline plot: {rep['plot']}" if args.plot else "")
    return rep


def _run_on(board, args, out, lab_map, lease=None):
    image, pkg_dir = hil.build_for_board(args.model, board, out, optimize=args.optimize, port=args.port,
                                         lab_map=lab_map, semantics=args.semantics)
    graph = hil.package_graph(pkg_dir)
    samples = _samples(graph, args)
    if lease is not None:
        lease.flash(image)
    res = hil.run_on_board(image, pkg_dir, [s if len(s) > 1 else s[0] for s in samples.inputs],
                           port=args.port, lab_map=lab_map, device_kw={"flash": False} if lease else None)
    board_outs = [as_tuple(o) for o in res.outputs]
    ref_outs = run_reference(graph, samples.inputs)
    checks = [check("Kiln's reference executor", board_outs, ref_outs)]
    src = _tflite_source(args.model, pkg_dir)
    litert_skipped = None
    if src is not None:
        oracle, why = oracle_for(src, graph)     # TFLite Micro where it and LiteRT differ (kiln/tflm.py)
        try:
            if oracle == "tflm":
                checks.append(check("TensorFlow Lite Micro's interpreter", board_outs,
                                    run_tflm(src, samples.inputs, stream=bool(graph.states))))
            elif oracle == "litert":
                lite = run_litert(src, samples.inputs, stream=bool(graph.states), graph=graph)
                checks.append(check("LiteRT's reference kernels (BUILTIN_REF)", board_outs, lite))
        except OracleUnsupported as e:     # TFLite Micro-only models: checked against the reference only
            why = str(e)
        litert_skipped = why
    man = hil.read_manifest(pkg_dir)
    ins = next((n for n in res.instructions if n), None)
    real = (not board.emulated) and (args.port is not None or (lab_map is not None and board.name in lab_map.boards()))
    rep = {"ok": all(c["match"] for c in checks), "board": args.board, "emulated": not real,
           "samples": len(samples), "sample_source": samples.source, "semantics": semantics_of(graph),
           "bit_exact": all(c["match"] and c["rule"] == "bit-exact" for c in checks),
           "checks": checks, "compared_against": [c["against"] for c in checks],
           "mismatched_inputs": sorted({k for c in checks for k in c["mismatched_samples"]}),
           "instructions_per_inference": ins, "instruction_source": res.instruction_source,
           "macs": man.macs, "macs_per_instruction": round(man.macs / ins, 4) if ins else None,
           "timing": _timing(res, board, real), "estimate": _estimate(res, board),
           "per_layer": roofline(res.profile, board.core_info),
           "memory": _memory(res), "link_stats": res.stats}
    if litert_skipped:
        rep["litert_skipped"] = litert_skipped
    if samples.targets is not None:
        rep["data_metrics"] = _data_report(graph, pkg_dir, samples, board_outs, ref_outs, args)
    return rep


def roofline(profile, core):
    """Per command: MACs, instructions, MACs per instruction and the core's ceiling
    (``Core.macs_per_instruction_limit``), and the fraction of that ceiling reached, so the gap
    left in each layer shows."""
    limit = core.macs_per_instruction_limit
    rows = []
    for layer in profile:
        ins, macs = layer.get("instructions"), layer.get("macs") or 0
        rate = macs / ins if ins and macs else None
        rows.append(dict(layer, macs_per_instruction=None if rate is None else round(rate, 4),
                         limit_macs_per_instruction=limit if macs else None,
                         of_limit=None if rate is None else round(rate / limit, 4)))
    return rows


def _timing(res, board, real):
    """Cycles and milliseconds of the first inference on real hardware, at the clock the firmware
    runs the core at; None under QEMU (its timers run on virtual time: instructions are the
    measurement there)."""
    if not real:
        return None
    if not (res.ticks and res.ticks[0] and res.timer_hz):
        return {"source": "none", "note": "the board reported no timer"}
    secs = res.ticks[0] / res.timer_hz
    return {"source": "hardware", "ms": round(secs * 1e3, 3), "cycles": int(round(secs * board.run_clock_hz)),
            "core_clock_hz": board.run_clock_hz, "max_clock_hz": board.clock_hz}


def _estimate(res, board):
    """Estimated cycles and milliseconds of the profiled inference under QEMU, from its
    executed instruction mix and the core's timing model (kiln.boards.timing; docs/firmware.md,
    "Measurement"): an estimate, labelled so, never a measurement; None without a mix."""
    if not res.estimate:
        return None
    return {"label": "estimated", "model": f"{board.core} timing model (docs/firmware.md)",
            "flash_wait_states": board.flash_wait_states, "mix": res.mix, **res.estimate}


def _memory(res):
    s = res.sizes
    return {"arena_bytes": s.get("arena"), "stack_used_bytes": res.stack_used, "text": s.get("text"),
            "rodata": s.get("rodata"), "data": s.get("data"), "bss": s.get("bss"),
            "flash_bytes": s.get("flash_used"), "model_flash_bytes": s.get("model_flash_bytes"),
            "harness_flash_bytes": s.get("harness_flash_bytes"), "flash_breakdown": s.get("flash_breakdown"),
            "ram_bytes": s.get("ram_used")}


def _n(v, fmt=","):
    return "n/a" if v is None else format(v, fmt)


def _table(rep):
    m = rep["memory"]
    where = f"{rep['board']}" + (" (QEMU)" if rep["emulated"] else "")
    lines = [f"{rep['samples']} samples ({rep['sample_source']}) on {where}:"]
    if rep.get("litert_skipped"):
        lines.append(f"  (not checked against LiteRT: {rep['litert_skipped']})")
    for c in rep["checks"]:
        verdict = "match" if c["match"] else f"MISMATCH on samples {c['mismatched_samples']}"
        lines.append(f"  vs {c['against']}: {verdict} ({c['rule']}; worst |diff| {c['worst_abs_diff']:.3g})")
    if rep["instructions_per_inference"]:
        lines.append(f"instructions / inference: {rep['instructions_per_inference']:,} ({rep['instruction_source']}), "
                     f"{rep['macs']:,} MACs, {rep['macs_per_instruction']} MACs/instruction")
    t = rep["timing"]
    if t and t.get("ms") is not None:
        note = "" if t["core_clock_hz"] == t["max_clock_hz"] else \
            f"; the board's maximum is {t['max_clock_hz'] / 1e6:g} MHz, a PLL set-up Kiln does not do yet"
        lines.append(f"time / inference: {t['ms']} ms, {t['cycles']:,} cycles at the {t['core_clock_hz'] / 1e6:g} MHz "
                     f"core clock{note}")
    elif rep["emulated"]:
        lines.append("time: emulated board (QEMU): no hardware timing; the instruction count is the measurement")
    e = rep.get("estimate")
    if e:
        lines.append(f"estimated: {e['estimated_cycles']:,} cycles, {e['estimated_ms']} ms at the "
                     f"{e['clock_hz'] / 1e6:g} MHz core clock (range {e['estimated_cycles_low']:,}-"
                     f"{e['estimated_cycles_high']:,} over the manual's timing ranges; {e['instructions']:,} "
                     f"instructions of the profiled inference, {e['cycles_per_instruction']} cycles/instruction; "
                     f"{e['model']})")
    lines.append(f"memory: arena {_n(m['arena_bytes'])} B, stack high-water {_n(m['stack_used_bytes'])} B, "
                 f".text {_n(m['text'])} B, .rodata {_n(m['rodata'])} B, .data {_n(m['data'])} B, .bss {_n(m['bss'])} B")
    lines.append(f"flash: whole image {_n(m['flash_bytes'])} B (.text + .rodata + .data: model, protocol, drivers, "
                 f"startup, libc)")
    if m.get("model_flash_bytes") is not None:
        b = m["flash_breakdown"]
        lines.append(f"flash: model {m['model_flash_bytes']:,} B (kernels code {b['kernels_code']:,} + constants "
                     f"{b['model_constants']:,} + command-buffer runtime {b['runtime']:,}; counted like TFLM's "
                     f"library + model), harness {m['harness_flash_bytes']:,} B")
    if rep.get("data_metrics"):
        lines.append(f"\n{'on ' + rep['sample_source']:<40} " + "  ".join(
            k for k in next(iter(rep["data_metrics"].values())) or {}))
        for stage, mt in rep["data_metrics"].items():
            lines.append(f"  {stage:<38} " + "  ".join(
                f"{100 * v:.2f}%" if k == "accuracy" else f"{v:.4g}" for k, v in (mt or {}).items()))
    est = any(layer.get("estimated_cycles") is not None for layer in rep["per_layer"])
    lines.append(f"\n{'command':<28} {'MACs':>10} {'instructions':>13} {'MAC/instr':>9} {'ceiling':>7} "
                 f"{'of ceiling':>10}" + (f" {'est. cycles':>12} {'est. ms':>9}" if est else ""))
    for layer in rep["per_layer"]:
        rate, lim, frac = layer["macs_per_instruction"], layer["limit_macs_per_instruction"], layer["of_limit"]
        lines.append(f"{layer['name']:<28} {layer['macs']:>10,} {_n(layer['instructions']):>13} "
                     f"{_n(rate, '.3f'):>9} {_n(lim, 'd'):>7} {_n(None if frac is None else 100 * frac, '.1f'):>9}%"
                     + (f" {_n(layer.get('estimated_cycles')):>12} {_n(layer.get('estimated_ms'), '.3f'):>9}"
                        if est else ""))
    if any(layer["limit_macs_per_instruction"] for layer in rep["per_layer"]):
        lines.append("ceiling: the most MACs one instruction of the core does (1 MLA, 2 SMLAD with DSP, "
                     "16 Helium VMLADAVA)")
    if est:
        lines.append("est. cycles / ms: estimated from the executed instruction mix with the core's timing model "
                     "(docs/firmware.md, Measurement); the instruction counts are exact")
    return "\n".join(lines)


def _run_target(args):
    """--target T: the samples through a backend target, compared with the reference executor:
    bit for bit for integer outputs of an exact target, within the target's tolerance otherwise."""
    t = get_target(args.target)
    graph = hil.package_graph(args.model) if is_package(args.model) else load_model(args.model,
                                                                                     semantics=args.semantics)
    samples = _samples(graph, args)
    with BuildFolder(args.out, args.keep, f"kiln_run_{args.target}_") as build:
        options = {"out": build.path, "out_dir": os.path.join(build.path, "host_package"),
                   "package": os.path.join(build.path, "cuda_package"), "capture": True, "semantics": args.semantics}
        outs = run_target(t, args.model, samples.inputs, options)
    ref = run_reference(graph, samples.inputs)
    err, ok, atol = 0.0, True, t.tolerance(args.model, options)
    exact = t.is_exact(args.model, options)
    for got, want in zip(outs, ref):
        for a, b in zip(got, want):
            bv = np.asarray(b, np.float64).reshape(-1)
            d = np.abs(np.asarray(a, np.float64).reshape(-1) - bv)
            err = max(err, float(d.max(initial=0.0)))
            ok &= bool((d == 0).all()) if exact and np.asarray(b).dtype.kind in "iu" else \
                bool((d <= atol * (1 + np.abs(bv))).all())
    rule = comparison_rule(exact, atol)
    return {"ok": ok and len(outs) == len(ref), "target": args.target, "samples": len(samples), "max_abs_err": err,
            "comparison": rule, "build": build.kept, "semantics": semantics_of(graph),
            "text": f"{len(samples)} samples on {args.target}: max |err| vs NumPy reference {err:.3g} ({rule})"}
