"""kiln run --board B MODEL --inputs N: run a model on a board (QEMU, or a real board with --port
or a lab map), check every output bit-exact against the host int8 reference, and report latency
(instructions per layer and total, MACs per instruction; cycles/ms on real boards) and memory."""
from __future__ import annotations

import os
import tempfile

import numpy as np

from kiln.commands import add_optimize_argument, positive_int
from kiln.frontend.errors import KilnError


def add_arguments(p):
    p.add_argument("model", help=".tflite, Kiln graph .json, or a package folder")
    add_optimize_argument(p)
    p.add_argument("--board", default=None, help="board name (see `kiln boards`)")
    p.add_argument("--target", default=None, help="'cuda' to run a CUDA package on the GPU")
    p.add_argument("--inputs", type=positive_int, default=4, help="number of seeded random inputs (default 4)")
    p.add_argument("--golden", default=None, help="use the inputs of a golden .npz instead")
    p.add_argument("--port", default=None, help="serial port / pyserial URL of a real board")
    p.add_argument("--lab-map", default=None, help="lab map TOML naming which real board is on which port")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--out", default=None, help="build folder (default: a temporary one)")


def _inputs(graph, args):
    if args.golden:
        from kiln.commands.verify import load_golden
        return [p[0] for p in load_golden(args.golden)]
    t = graph.types[graph.inputs[0]]
    rng = np.random.default_rng(args.seed)
    if t.dtype == "int8":
        return [rng.integers(-128, 128, t.shape).astype(np.int8) for _ in range(args.inputs)]
    return [rng.standard_normal(t.shape).astype(t.dtype) for _ in range(args.inputs)]


def run(args):
    if args.target == "cuda":
        return _run_cuda(args)
    if not args.board:
        raise KilnError("kiln run needs --board B (or --target cuda)")
    from kiln import boards, hil
    board = boards.load(args.board)
    lab_map = None
    if args.lab_map:
        from kiln.boards.labmap import load_lab_map
        lab_map = load_lab_map(args.lab_map)
    out = args.out or tempfile.mkdtemp(prefix=f"kiln_run_{args.board}_")
    image, pkg_dir = hil.build_for_board(args.model, board, out, optimize=args.optimize, port=args.port,
                                         lab_map=lab_map)
    graph = hil.package_graph(pkg_dir)
    xs = _inputs(graph, args)
    ref = hil.reference_outputs(graph, xs)
    res = hil.run_on_board(image, pkg_dir, xs, port=args.port, lab_map=lab_map)
    bad = [k for k, (a, b) in enumerate(zip(res.outputs, ref)) if not np.array_equal(np.asarray(a).reshape(-1), np.asarray(b).reshape(-1))]
    import json
    with open(os.path.join(pkg_dir, "manifest.json")) as f:
        macs = json.load(f)["macs"]
    ins = res.instructions[0] if res.instructions and res.instructions[0] else None
    real = not (board.emulated or board.emulates) or args.port
    cycles_ms = None
    if res.ticks and res.timer_hz:
        secs = res.ticks[0] / res.timer_hz
        cycles_ms = {"ms": round(secs * 1e3, 3), "cycles_at_board_clock": int(secs * board.clock_hz)}
    rep = {"ok": not bad, "board": args.board, "inputs": len(xs), "bit_exact": not bad, "mismatched_inputs": bad,
           "instructions_per_inference": ins, "instruction_source": res.instruction_source,
           "macs": macs, "macs_per_instruction": round(macs / ins, 4) if ins else None,
           "timing": cycles_ms if real else None, "per_layer": res.profile,
           "memory": {"arena_bytes": res.sizes.get("arena"), "stack_used_bytes": res.stack_used,
                      "text": res.sizes.get("text"), "rodata": res.sizes.get("rodata"),
                      "data": res.sizes.get("data"), "bss": res.sizes.get("bss"),
                      "flash_bytes": res.sizes.get("flash_used"),
                      "model_flash_bytes": res.sizes.get("model_flash_bytes"),
                      "harness_flash_bytes": res.sizes.get("harness_flash_bytes"),
                      "flash_breakdown": res.sizes.get("flash_breakdown"),
                      "ram_bytes": res.sizes.get("ram_used")},
           "link_stats": res.stats, "build": out}
    rep["text"] = _table(rep)
    return rep


def _table(rep):
    m = rep["memory"]
    lines = [f"{rep['inputs']} inputs on {rep['board']}: " + ("all outputs bit-exact with the host int8 reference"
                                                              if rep["bit_exact"] else f"MISMATCH on inputs {rep['mismatched_inputs']}")]
    if rep["instructions_per_inference"]:
        lines.append(f"instructions / inference: {rep['instructions_per_inference']:,} ({rep['instruction_source']}), "
                     f"{rep['macs']:,} MACs, {rep['macs_per_instruction']} MACs/instruction")
    if rep["timing"]:
        lines.append(f"time / inference: {rep['timing']['ms']} ms, {rep['timing']['cycles_at_board_clock']:,} cycles")
    lines.append(f"memory: arena {m['arena_bytes']:,} B, stack high-water {m['stack_used_bytes']:,} B, "
                 f".text {m['text']:,} B, .rodata {m['rodata']:,} B, .data {m['data']:,} B, .bss {m['bss']:,} B")
    lines.append(f"flash: whole image {m['flash_bytes']:,} B (.text + .rodata + .data: model, protocol, drivers, "
                 f"startup, libc)")
    if m.get("model_flash_bytes") is not None:
        b = m["flash_breakdown"]
        lines.append(f"flash: model {m['model_flash_bytes']:,} B (kernels code {b['kernels_code']:,} + constants "
                     f"{b['model_constants']:,} + command-buffer runtime {b['runtime']:,}; counted like TFLM's "
                     f"library + model), harness {m['harness_flash_bytes']:,} B")
    lines.append(f"\n{'command':<28} {'MACs':>10} {'instructions':>13} {'MAC/instr':>9}")
    for l in rep["per_layer"]:
        ins = l["instructions"]
        lines.append(f"{l['name']:<28} {l['macs']:>10,} {ins if ins is not None else 'n/a':>13,} "
                     f"{(l['macs'] / ins if ins else 0):>9.3f}")
    return "\n".join(lines)


def _run_cuda(args):
    from kiln.backends import cuda_runner
    from kiln import hil
    graph = hil.package_graph(args.model) if hil.is_package(args.model) else hil.load_model(args.model)
    xs = _inputs(graph, args)
    outs = cuda_runner.run_package(args.model, xs, capture=True)
    ref = hil.reference_outputs(graph, xs)
    err = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(outs, ref))
    return {"ok": err <= 1e-4, "target": "cuda", "inputs": len(xs), "max_abs_err": err,
            "text": f"{len(xs)} inputs on cuda: max |err| vs NumPy reference {err:.3g}"}
