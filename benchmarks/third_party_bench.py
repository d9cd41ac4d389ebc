"""Third-party .tflite models nobody on the project wrote: import, Kiln's reference, the host C
package and (with --board) the firmware on an emulated board, each checked against LiteRT's
reference kernels (BUILTIN_REF), the oracle.

Every .tflite under the given folders (recursively) is one row. Inputs: the model's own
``<name>_input<K>_<dtype>.csv`` files where they exist (TFLite Micro's integration tests, e.g. the
int16 seanet set, whose ``<name>_golden_<dtype>.csv`` is checked too), else seeded random inputs
(uniform integers, standard normal floats). Integer outputs must be identical; float outputs
within --float-tol of LiteRT (absolute, after scaling by max(1, |LiteRT|)). A model LiteRT itself
cannot load is not counted. A board run needs the model to fit the board: "too large" rows say by
how much and count as not run.

    .venv/bin/python benchmarks/third_party_bench.py DIR [DIR ...] [--board mps2-an386]
        [--inputs 3] [--json out.json] [--write docs/benchmarks.md]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
import traceback

import numpy as np

from kiln.frontend import KilnError
from kiln.frontend.executor import run_stateful
from kiln.frontend.tflite_import import load_tflite
from kiln.litert import litert_loadable, refuse_unsupported

SECTION = "## Third-party models"


def litert(path):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    with open(path, "rb") as f:       # litert_loadable: TFLM files LiteRT's loader refuses (person_detect)
        it = Interpreter(model_content=litert_loadable(f.read()), experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    return it


def litert_run(it, feeds, reset=True):
    if reset:              # a stateful model's samples are one stream: only the first one resets
        it.reset_all_variables()
    for d, x in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [np.array(it.get_tensor(d["index"])) for d in it.get_output_details()]


def _csv(path, dtype, shape):
    v = np.loadtxt(path, delimiter=",", dtype=np.int64).reshape(-1)
    return v.astype(dtype).reshape(shape)


def model_inputs(path, it, n, seed=0):
    """[(feeds, golden or None)]: the model's csv inputs/golden where present, else random."""
    base = path[:-len(".tflite")]
    details = it.get_input_details()
    csvs = [sorted(glob.glob(f"{base}_input{k}_*.csv")) for k in range(len(details))]
    if all(csvs):
        feeds = [_csv(c[0], d["dtype"], d["shape"]) for c, d in zip(csvs, details)]
        gold = sorted(glob.glob(f"{base}_golden_*.csv"))
        outs = it.get_output_details()
        g = [_csv(gold[0], outs[0]["dtype"], outs[0]["shape"])] if gold and len(outs) == 1 else None
        return [(feeds, g)]
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        feeds = []
        for d in details:
            dt = np.dtype(d["dtype"])
            if np.issubdtype(dt, np.integer):
                info = np.iinfo(dt)
                feeds.append(rng.integers(info.min, info.max, d["shape"], endpoint=True).astype(dt))
            elif dt == np.bool_:
                feeds.append(rng.random(d["shape"]) < 0.5)
            else:
                feeds.append(rng.standard_normal(d["shape"]).astype(dt))
        samples.append((feeds, None))
    return samples


def same(got, want, tol):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape and got.size == want.size:
        got = got.reshape(want.shape)
    if got.shape != want.shape:
        return False, f"shape {got.shape} != {want.shape}"
    if np.issubdtype(want.dtype, np.floating):
        d = float(np.max(np.abs(got.astype(np.float64) - want) / np.maximum(1.0, np.abs(want)))) if want.size else 0.0
        return d <= tol, f"max rel diff {d:.2e}"
    n = int(np.sum(got != want))
    return n == 0, f"{n} of {want.size} differ" if n else "bit-exact"


def compare(outs_list, wants_list, tol):
    notes = []
    for outs, wants in zip(outs_list, wants_list):
        for o, w in zip(outs, wants):
            ok, note = same(o, w, tol)
            if not ok:
                return False, note
            notes.append(note)
    return True, "bit-exact" if all(n == "bit-exact" for n in notes) else notes[-1]


def _ops(g):
    return sorted({n.op for n in g.nodes})


def check_host(g, samples, wants, tol):
    from kiln.backends import compile as compile_pkg
    with tempfile.TemporaryDirectory() as d:
        pkg = compile_pkg(g, target="host", out_dir=d, plot=False, measure_size=False)
        return compare([pkg.run(*f) for f, _ in samples], wants, tol)


def check_board(path, samples, board, tol):
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    with tempfile.TemporaryDirectory() as d:
        gold = os.path.join(d, "g.npz")
        golden(path, gold, [tuple(f) for f, _ in samples])
        rep = verify(path, gold, board, options={"out": os.path.join(d, "board")})
        ok = bool(rep.get("ok"))
        worst = max((r.get("max_abs_diff", 0.0) for r in rep.get("results", [])), default=0.0)
        return ok, (f"{rep.get('matched')}/{len(samples)} matched" if ok else
                    rep.get("error") or f"{rep.get('matched')}/{len(samples)} matched, max abs diff {worst:.2e}")


def check_model(path, args) -> dict:
    row = {"model": os.path.relpath(path, args.common), "import": None, "reference": None, "host": None, "board": None}
    try:
        refuse_unsupported(path)       # models LiteRT would run wrongly or crash on (int8 SVDF states)
        it = litert(path)
    except Exception as e:  # noqa: BLE001  (LiteRT's own refusal: the row is not counted)
        row["skip"] = f"LiteRT cannot load it: {str(e).splitlines()[0][:120]}"
        return row
    try:
        g = load_tflite(path)
    except KilnError as e:
        row["import"], row["note"] = False, str(e).splitlines()[0][:200]
        return row
    row["import"], row["ops"] = True, _ops(g)
    samples = model_inputs(path, it, args.inputs)
    wants = [litert_run(it, f, reset=not g.states or k == 0) for k, (f, _) in enumerate(samples)]
    for (_, gold), w in zip(samples, wants):     # the model's own golden files agree with LiteRT
        if gold is not None and not same(w[0], gold[0], 0)[0]:
            row["note"] = "LiteRT differs from the model's golden csv"
    state = {}                         # stateful models (SVDF): the samples are one stream
    steps = [("reference", lambda: compare([run_stateful(g, state, *f) for f, _ in samples], wants, args.float_tol)),
             ("host", lambda: check_host(g, samples, wants, args.float_tol))]
    if args.board:
        steps.append(("board", lambda: check_board(path, samples, args.board, args.float_tol)))
    for name, fn in steps:
        try:
            row[name], row[name + "_note"] = fn()
        except KilnError as e:
            row[name], row[name + "_note"] = False, str(e).splitlines()[0][:200]
        except Exception as e:  # noqa: BLE001  (a crash is a failure of that step, reported with its type)
            row[name], row[name + "_note"] = False, f"{type(e).__name__}: {str(e)[:160]}"
            if args.verbose:
                traceback.print_exc()
    return row


def summary(rows, board):
    counted = [r for r in rows if "skip" not in r]
    n = len(counted)
    s = {"models": n, "skipped": len(rows) - n}
    for k in ("import", "reference", "host") + (("board",) if board else ()):
        s[k] = sum(1 for r in counted if r.get(k))
    return s


def markdown(rows, s, cmd, board):
    pct = {k: f"{s[k]} / {s['models']} ({100 * s[k] / max(s['models'], 1):.0f}%)" for k in s if k not in ("models", "skipped")}
    lines = [SECTION, "", f"`{cmd}`", "",
             "Each model against LiteRT's reference kernels (BUILTIN_REF); integer outputs bit-exact, float within "
             "the stated tolerance.", "",
             "| | " + " | ".join(pct) + " |", "|---|" + "---|" * len(pct), "| passed | " + " | ".join(pct.values()) + " |",
             "", "| model | import | reference | host C | " + ("board | " if board else "") + "note |",
             "|---|---|---|---|" + ("---|" if board else "") + "---|"]
    mark = {True: "yes", False: "NO", None: "—"}
    for r in rows:
        if "skip" in r:
            continue
        failed = [k for k in ("reference", "host", "board") if r.get(k) is False]
        note = r.get("note") or (r.get(failed[0] + "_note") if failed else r.get("board_note") or r.get("host_note")) or ""
        cells = [mark[r["import"]], mark[r["reference"]], mark[r["host"]]] + ([mark[r["board"]]] if board else [])
        lines.append(f"| {r['model']} | " + " | ".join(cells) + f" | {str(note).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def write_section(path, text):
    doc = open(path).read() if os.path.exists(path) else ""
    if SECTION in doc:
        head, rest = doc.split(SECTION, 1)
        nxt = rest.find("\n## ")
        doc = head + text + (rest[nxt + 1:] if nxt >= 0 else "")
    else:
        doc = doc.rstrip("\n") + "\n\n" + text
    with open(path, "w") as f:
        f.write(doc)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--board", default=None, help="also run on this emulated board (e.g. mps2-an386)")
    ap.add_argument("--inputs", type=int, default=3, help="random inputs per model without csv inputs")
    ap.add_argument("--float-tol", type=float, default=1e-4)
    ap.add_argument("--json", default=None)
    ap.add_argument("--write", default=None, help="replace the 'Third-party models' section of this markdown file")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    paths = sorted(p for d in args.dirs for p in glob.glob(os.path.join(d, "**", "*.tflite"), recursive=True))
    args.common = os.path.commonpath([os.path.dirname(p) for p in paths]) if paths else "."
    rows, t0 = [], time.time()
    for i, p in enumerate(paths):
        rows.append(check_model(p, args))
        r = rows[-1]
        print(f"[{i + 1}/{len(paths)} {time.time() - t0:.0f}s] {r['model']}: " +
              (r.get("skip") or " ".join(f"{k}={r[k]}" for k in ("import", "reference", "host", "board"))
               + (f"  ({r.get('note') or r.get('host_note') or ''})" if not r.get("host") else "")), flush=True)
    s = summary(rows, args.board)
    print(json.dumps(s))
    cmd = "python benchmarks/third_party_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": s, "rows": rows}, f, indent=1, default=str)
    if args.write:
        write_section(args.write, markdown(rows, s, cmd, args.board))
    return 0


if __name__ == "__main__":
    sys.exit(main())
