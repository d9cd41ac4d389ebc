"""kiln verify MODEL --golden G.npz --target T: every golden pair must match on the target."""
from __future__ import annotations

import os
import time

import numpy as np

from kiln.frontend.errors import KilnError
from kiln.targets import get_target


def add_arguments(p):
    p.add_argument("model", help="model file (.tflite or Kiln graph .json) or a compiled package folder")
    p.add_argument("--golden", required=True, help=".npz with arrays in_0..in_K and out_0..out_K")
    p.add_argument("--target", default="reference",
                   help="reference | host | host-llvm | cuda | a board name (see `kiln boards`)")
    p.add_argument("--atol", type=float, default=None, help="tolerance for float outputs (default: the target's)")
    p.add_argument("--max-report", type=int, default=10, help="mismatching elements to list per pair")


def load_golden(path):
    if not os.path.exists(path):
        raise KilnError(f"golden file {path} not found")
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as e:
        raise KilnError(f"{path}: not a readable .npz ({type(e).__name__}: {e})") from None
    with z:
        keys = set(z.files)
        ins = sorted((k for k in keys if k.startswith("in_")), key=lambda k: int(k[3:]))
        pairs = []
        for k in ins:
            o = "out_" + k[3:]
            if o not in keys:
                raise KilnError(f"{path}: {k} has no matching {o}")
            pairs.append((z[k], z[o]))
    if not pairs:
        raise KilnError(f"{path}: no in_K/out_K arrays found (have: {sorted(keys)})")
    return pairs


def compare(got, want, exact, atol, max_report=10):
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return {"match": False, "reason": f"shape {got.shape} != expected {want.shape}", "mismatches": []}
    if exact:
        bad = np.argwhere(got != want)
    else:
        bad = np.argwhere(~np.isclose(got.astype(np.float64), want.astype(np.float64), atol=atol, rtol=0))
    mism = [{"index": [int(i) for i in idx], "got": got[tuple(idx)].item(), "expected": want[tuple(idx)].item()}
            for idx in bad[:max_report]]
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return {"match": len(bad) == 0, "mismatched_elements": int(len(bad)), "elements": int(want.size),
            "max_abs_diff": float(diff.max()) if diff.size else 0.0, "mismatches": mism}


def verify(model, golden, target, atol=None, max_report=10, options=None):
    t = get_target(target)
    pairs = load_golden(golden)
    t0 = time.time()
    outs = t.runner(model, [p[0] for p in pairs], options or {})
    elapsed = time.time() - t0
    results = []
    for k, ((_, want), got) in enumerate(zip(pairs, outs)):
        exact = t.exact and want.dtype.kind in "iu"
        r = compare(got, want, exact, atol if atol is not None else t.atol, max_report)
        r["pair"] = k
        results.append(r)
    ok = all(r["match"] for r in results) and len(outs) == len(pairs)
    return {"ok": ok, "model": str(model), "golden": str(golden), "target": target, "pairs": len(pairs),
            "matched": sum(r["match"] for r in results), "seconds": round(elapsed, 3), "results": results}


def run(args):
    rep = verify(args.model, args.golden, args.target, args.atol, args.max_report)
    lines = [f"verify {rep['model']} on {rep['target']}: {rep['matched']}/{rep['pairs']} golden pairs match"]
    for r in rep["results"]:
        if not r["match"]:
            lines.append(f"  pair {r['pair']}: {r.get('reason') or str(r['mismatched_elements']) + ' of ' + str(r['elements']) + ' elements differ'}"
                         f" (max |diff| {r.get('max_abs_diff', 'n/a')})")
            for m in r["mismatches"]:
                lines.append(f"    at {m['index']}: got {m['got']}, expected {m['expected']}")
    lines.append("OK" if rep["ok"] else "FAILED")
    rep["text"] = "\n".join(lines)
    return rep
