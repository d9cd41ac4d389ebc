"""kiln bench: run the shared MLPerf Tiny models (or the models given) across the emulated boards
and report instructions per inference (exact, QEMU plugin), MACs per instruction, estimated cycles and
milliseconds (from the executed instruction mix, kiln.boards.timing), arena, stack
high-water and flash (whole image, and the model's share counted like TFLM's library + model), next
to TensorFlow Lite Micro's measured numbers on the Cortex-M4. Prints a table (or --json); replaces
its section of docs/benchmarks.md (or another Markdown file) only with --write."""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from kiln import hil
from kiln.commands import BuildFolder, positive_int
from kiln.commands.labgrid_options import add_farm_arguments, farm_lease
from kiln.docs_util import add_shared_argument, add_write_argument, shared_models, write_path, write_section
from kiln.errors import UsageError
from kiln.samples import random_inputs
from kiln.targets import run_reference
from kiln.tflm import add_semantics_argument

SECTION = "## Boards (kiln bench)"
SHARED_NOTE = "DIR: the folder whose models/ holds the MLPerf Tiny models; "
BOARDS = "mps2-an385,mps2-an386,mps2-an500,mps2-an505,mps3-an547"
SHARED_MODELS = ("kws_ref_model.tflite", "pretrainedResnet_quant.tflite", "vww_96_int8.tflite", "ad01_int8.tflite")
# TFLite Micro on QEMU mps2-an386 (BASELINES.md of the shared models); flash = TFLM library .text + the
# .tflite model's bytes (kws 75,936 + 53,936; ResNet-8 70,606 + 98,496; VWW 75,936 + 333,288;
# AD 25,994 + 276,976)
TFLM = {"kws_ref_model": {"cmsis_insn": 7_579_262, "ref_insn": 42_214_495, "arena": 22_820, "flash": 129_872},
        "pretrainedResnet_quant": {"cmsis_insn": 29_780_318, "ref_insn": 105_651_146, "arena": 54_996, "flash": 169_102},
        "vww_96_int8": {"cmsis_insn": 23_776_242, "ref_insn": 99_316_202, "arena": 100_708, "flash": 409_224},
        "ad01_int8": {"cmsis_insn": 582_949, "ref_insn": 1_952_144, "arena": 2_580, "flash": 302_970}}


def add_arguments(p):
    p.add_argument("--models", default=None, metavar="FILE[,FILE...]",
                   help="comma-separated .tflite / Kiln graph .json files (default: "
                        f"{' and '.join(SHARED_MODELS)} from --shared)")
    add_shared_argument(p)
    p.add_argument("--boards", default=BOARDS, metavar="B[,B...]",
                   help=f"comma-separated emulated boards (default: {BOARDS}; see `kiln boards`)")
    p.add_argument("--optimize", default=None, choices=["size", "speed"],   # None: both (see help)
                   help="weight storage for every run (default: size on every board, and also speed on "
                        "mps2-an386 for the comparison with TFLM)")
    add_write_argument(p, SECTION)
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="build folder for the packages and firmware (default: a temporary folder, removed "
                        "afterwards unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the temporary build folder (its path is reported)")
    add_semantics_argument(p)
    p.add_argument("-j", "--jobs", type=positive_int, default=1, metavar="N",
                   help="run N builds and boards at once, each QEMU on its own port and folder (default: 1); "
                        "the figures do not depend on N")
    add_farm_arguments(p)


def _models(args):
    if args.models:
        models = [m for m in args.models.split(",") if m]
        missing = [m for m in models if not os.path.exists(m)]
        if missing:
            raise UsageError(f"--models: {', '.join(missing)} not found")
        return models
    return shared_models(args.shared, SHARED_MODELS, flag="--models FILE[,FILE...]")


def bench_one(model, board, tmp, optimize="size", lease=None, semantics=None):
    """One row; ``lease``: a labgrid place (kiln.boards.farm.Lease) whose board runs it;
    ``semantics``: the integer semantics a .tflite is compiled with (--semantics)."""
    name = os.path.splitext(os.path.basename(model))[0]
    out = os.path.join(tmp, f"{name}_{board}_{optimize}")
    t0 = time.time()
    port = lease.url if lease is not None else None
    image, pkg_dir = hil.build_for_board(model, board, out, optimize=optimize, port=port, semantics=semantics)
    graph = hil.package_graph(pkg_dir)
    sample = random_inputs(graph, 1, seed=0)[0]          # one array per model input
    ref = run_reference(graph, [sample])[0]
    if lease is not None:
        lease.flash(image)
    res = hil.run_on_board(image, pkg_dir, [sample if len(sample) > 1 else sample[0]], port=port,
                           device_kw={"flash": False} if lease is not None else None)
    got = res.outputs[0] if isinstance(res.outputs[0], (list, tuple)) else (res.outputs[0],)
    man = hil.read_manifest(pkg_dir)
    ins = res.instructions[0]
    return {"model": name, "board": board, "core": man.target, "optimize": optimize, "semantics": man.semantics,
            "bit_exact": len(got) == len(ref) and all(np.array_equal(np.asarray(a).reshape(-1), np.asarray(b).reshape(-1))
                                                      for a, b in zip(got, ref)),
            "instructions": ins, "instruction_source": res.instruction_source, "macs": man.macs,
            "macs_per_instruction": round(man.macs / ins, 4) if ins else None,
            "arena_bytes": man.arena_bytes, "stack_bytes": res.stack_used,
            "flash_bytes": res.sizes.get("flash_used"), "model_flash_bytes": res.sizes.get("model_flash_bytes"),
            "harness_flash_bytes": res.sizes.get("harness_flash_bytes"),
            "flash_breakdown": res.sizes.get("flash_breakdown"), "text": res.sizes.get("text"),
            "rodata": res.sizes.get("rodata"), "seconds": round(time.time() - t0, 1),
            **_estimate_fields(res)}


def _estimate_fields(res):
    """Estimated cycles / ms of the run (kiln.boards.timing, from the executed instruction mix),
    labelled as estimates; None where there is no mix (no QEMU plugin)."""
    e = res.estimate or {}
    return {"estimated_cycles": e.get("estimated_cycles"), "estimated_ms": e.get("estimated_ms"),
            "estimated_cycles_low": e.get("estimated_cycles_low"), "estimated_cycles_high": e.get("estimated_cycles_high"),
            "estimate_clock_hz": e.get("clock_hz"), "estimate_instructions": e.get("instructions"),
            "per_layer_estimated_cycles": [p.get("estimated_cycles") for p in res.profile] if e else None}


def _b(v):
    return f"{v:,}" if v is not None else "n/a"


OPT_TEXT = {"size": "every conv/dense weight stored as int8", "speed": "layers with at most 4 KiB of "
            "weights stored int16-packed: fewer instructions, more flash"}
FLASH_TEXT = (
    "Two flash figures. **Image flash** is .text + .rodata + .data of the whole firmware image: the model "
    "plus the test harness (serial protocol, UART driver, startup code and vector table, profiler, stack "
    "painter, libc/libgcc). **Model flash** is the part of it that corresponds to what TensorFlow Lite "
    "Micro's figure counts (its library .text + the .tflite model; its harness, startup, UART and libc "
    "are outside): everything linked from the compiled model package (kernels.c and model.c: kernel "
    "code, command buffer, weights, requantisation tables) including the command-buffer run loop "
    "`kiln_model_run`, computed exactly from the linker map (each input section placed in flash "
    "attributed to its object file; image flash = model flash + harness flash). See docs/firmware.md.")


def markdown(rows, command):
    rows = [{"optimize": "size", **r} for r in rows]
    main_opt = rows[0]["optimize"] if rows else "size"
    all_rows, rows = rows, [r for r in rows if r["optimize"] == main_opt]
    L = [SECTION, "",
         f"Produced by `{command}` ({SHARED_NOTE if '--shared DIR' in command else ''}QEMU 7.2, "
         "arm-none-eabi-gcc 12.2 -O2). Instructions are executed "
         "instructions for one inference, counted exactly by Kiln's QEMU TCG plugin between the model's "
         "entry and exit, the same in every run: the interrupt handlers and the timer reads are left out, so "
         "interrupts landing in an inference do not change it (docs/firmware.md, Measurement); stack is the painted "
         "high-water mark of the whole "
         "firmware during an inference. Every row's output was checked bit-exact against the int8 "
         f"reference. Compiled with `--optimize {main_opt}` ({OPT_TEXT[main_opt]}).", "", FLASH_TEXT, "",
         "Estimated cycles: from the executed instruction mix with the core's timing model (docs/firmware.md, "
         "Measurement): an estimate, not a measurement.", "",
         "| model | board (core) | instructions / inference | MACs / instruction | estimated cycles | arena B | stack B | image flash B | model flash B | bit-exact |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        L.append(f"| {r['model']} | {r['board']} ({r['core']}) | {r['instructions']:,} | {r['macs_per_instruction']} | "
                 f"{_b(r.get('estimated_cycles'))} | {r['arena_bytes']:,} | {r['stack_bytes']:,} | {_b(r['flash_bytes'])} | {_b(r.get('model_flash_bytes'))} | "
                 f"{'yes' if r['bit_exact'] else 'NO'} |")
    m4 = [r for r in all_rows if r["board"] == "mps2-an386" and r["model"] in TFLM]
    if m4:
        L += ["", "Against TensorFlow Lite Micro on the same emulated Cortex-M4 (BASELINES.md). Flash: Kiln image "
              "= the whole firmware image; Kiln model = package kernels + constants + command-buffer runtime, "
              "no harness; TFLM = TFLM library .text + .tflite model bytes (no harness, startup, UART or "
              "libc), i.e. counted like Kiln model flash:", "",
              "| model | optimize | Kiln instructions | TFLM + CMSIS-NN | ratio | TFLM reference kernels | Kiln arena | TFLM arena "
              "| Kiln image flash | Kiln model flash | TFLM flash (library + model) | model flash / TFLM flash |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in m4:
            t = TFLM[r["model"]]
            mf = r.get("model_flash_bytes")
            share = f"{100 * mf / t['flash']:.2f}%" if mf else "n/a"
            L.append(f"| {r['model']} | {r['optimize']} | {r['instructions']:,} | {t['cmsis_insn']:,} | {r['instructions'] / t['cmsis_insn']:.2f}x | "
                     f"{t['ref_insn']:,} | {r['arena_bytes']:,} | {t['arena']:,} | {_b(r['flash_bytes'])} | {_b(mf)} | "
                     f"{t['flash']:,} | {share} |")
    return "\n".join(L) + "\n"


def text_table(rows):
    """The rows as a plain-text table (what `kiln bench` prints without --json)."""
    cols = [("model", "model"), ("board", "board"), ("optimize", "optimize"), ("instructions", "instructions"),
            ("MACs/insn", "macs_per_instruction"), ("est. cycles", "estimated_cycles"), ("est. ms", "estimated_ms"),
            ("arena B", "arena_bytes"), ("stack B", "stack_bytes"),
            ("image flash B", "flash_bytes"), ("model flash B", "model_flash_bytes"), ("bit-exact", "bit_exact")]
    cells = [[h for h, _ in cols]]
    for r in rows:
        cells.append([("yes" if r[k] else "NO") if k == "bit_exact" else
                      (_b(r.get(k)) if isinstance(r.get(k), int) or r.get(k) is None else str(r[k])) for _, k in cols])
    w = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    return "\n".join("  ".join(c.ljust(w[i]) if i < 3 else c.rjust(w[i]) for i, c in enumerate(row)).rstrip()
                     for row in cells)


def _runs(models, args):
    boards = [b for b in args.boards.split(",") if b]
    if not boards:
        raise UsageError("--boards: no board named (see `kiln boards`)")
    runs = [(m, b, args.optimize or "size") for m in models for b in boards]
    if args.optimize is None and "mps2-an386" in boards:
        runs += [(m, "mps2-an386", "speed") for m in models]
    return runs


def _bench_all(runs, folder, jobs, quiet=False, lease=None, semantics=None):
    """bench_one for every (model, board, optimize) run, ``jobs`` at a time in separate processes
    (each with its own build sub-folder and QEMU port); the rows come back in the order of ``runs``."""
    def say(text):
        if not quiet:
            print(f"[kiln bench] {text}", file=sys.stderr, flush=True)
    if jobs == 1 or len(runs) == 1:
        rows = []
        for m, b, opt in runs:
            say(f"{os.path.basename(m)} on {b} (--optimize {opt}) ...")
            rows.append(bench_one(m, b, folder, opt, lease, semantics))
        return rows
    say(f"{len(runs)} runs, {jobs} at a time ...")
    # spawn, not fork: TVM and the LiteRT interpreter hold threads that a fork would copy half-way
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(bench_one, m, b, folder, opt, None, semantics) for m, b, opt in runs]
        rows = []
        for (m, b, opt), f in zip(runs, futures):
            rows.append(f.result())
            say(f"{os.path.basename(m)} on {b} (--optimize {opt}): done")
        return rows


def run(args):
    models = _models(args)
    runs = _runs(models, args)
    md_path = write_path(args.write)        # a usage error before the long runs, not after
    with BuildFolder(args.out, args.keep, "kiln_bench_") as build, farm_lease(args) as lease:
        if lease is not None:       # the labgrid place's board runs every model, one at a time
            runs = [(m, lease.board, opt) for m in models for opt in sorted({o for _, _, o in runs})]
            args.boards = lease.board
        farm = None if lease is None else {"place": lease.place_name, "board": lease.board,
                                           "coordinator": lease.address, "url": lease.url}
        rows = _bench_all(runs, build.path, 1 if lease is not None else args.jobs, quiet=args.json, lease=lease,
                          semantics=args.semantics)
    cmd = "kiln bench" + (f" --models {','.join(os.path.basename(m) for m in models)}" if args.models
                          else " --shared DIR")
    cmd += "" if args.boards == BOARDS else f" --boards {args.boards}"
    cmd += f" --optimize {args.optimize}" if args.optimize else ""
    cmd += f" --semantics {args.semantics}" if args.semantics else ""
    if md_path:
        write_section(md_path, markdown(rows, cmd + " --write"))
    text = text_table(rows)
    if md_path:
        text += f"\nwrote the '{SECTION[3:]}' section of {md_path}"
    if build.temp and build.kept:
        text += f"\nbuild folder kept: {build.kept}"
    return {"ok": all(r["bit_exact"] for r in rows), "rows": rows, "markdown": md_path,
            "build": build.kept, "text": text, **({"labgrid": farm} if farm else {})}
