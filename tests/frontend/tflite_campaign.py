"""The .tflite mutation campaign: mutants of real models through Kiln's import and inspect, LiteRT's
reference interpreter, Kiln's NumPy reference and (for a deterministic sample) ``kiln compile`` plus
the generated C on the host.

Every mutant runs in a worker subprocess under a memory ulimit (``RLIMIT_AS``); a worker that dies
(a crash in LiteRT's C++ or in generated C) or goes silent past the time limit is replaced and the
mutant recorded with the stage it was in. Outcomes (one per mutant):

=====================  ==============================================================================
rejected               Kiln refused the file with a KilnError (the message is kept)
same                   Kiln and LiteRT both ran it; every output identical (int) / within 1e-5 (float)
litert_rejects         Kiln accepted a file LiteRT refuses (load, AllocateTensors/Prepare or Invoke)
diff                   both ran it and an output differs; ``culprit`` names the first TFLite operator
                       whose output differs while its inputs agree
c_diff                 the generated C differs from Kiln's reference (compiled sample)
late_error             imported, then a later Kiln stage (inspect, reference) raised a KilnError
compile_rejected       ``kiln compile`` refused an imported mutant with a KilnError
traceback              any Kiln stage raised something that is not a KilnError
hang                   a Kiln stage exceeded the time limit
crash                  the worker died in a Kiln stage
memory                 Kiln ran out of the ulimit (a MemoryError, even one turned into a KilnError)
=====================  ==============================================================================

LiteRT gets the copy Kiln's oracle gives it (``kiln.litert.litert_loadable``: a quantized_dimension
beyond the rank that TFLite Micro ignores, set to 0), so such files count as accepted by both.

Run it at any size from the repository root:

    .venv/bin/python -m tests.frontend.tflite_campaign --per-model 5000 --compile-every 50

"""
from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

from kiln.litert import litert_loadable
from tests.frontend.tflite_mutants import mutant

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEM_LIMIT_MB = 4096
CORES = ("cortex-m4", "cortex-m0plus", "cortex-m7", "cortex-m33", "cortex-m55", "cortex-m3")
FAILURES = ("traceback", "late_error", "hang", "crash", "memory", "c_diff", "litert_rejects")


# ---- worker side ------------------------------------------------------------------------------
def _stage(name):
    sys.stdout.write(f"stage {name}\n")
    sys.stdout.flush()


def _inputs(g, seed, index):
    rng = np.random.default_rng([seed, index, 7])
    xs = []
    for name in g.inputs:
        t = g.types[name]
        if t.dtype in ("int8", "uint8", "int16", "int32"):
            info = np.iinfo(t.dtype)
            xs.append(rng.integers(info.min, int(info.max) + 1, size=t.shape).astype(t.dtype))
        elif t.dtype == "bool":
            xs.append(rng.random(t.shape) < 0.5)
        else:
            xs.append(rng.standard_normal(t.shape).astype(t.dtype))
    return xs


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        return bool(np.allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True))
    return bool(np.array_equal(a, b))


def _litert(data, xs):
    """LiteRT BUILTIN_REF outputs and every tensor (or the error text)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    try:
        it = Interpreter(model_content=litert_loadable(data), experimental_op_resolver_type=OpResolverType.BUILTIN_REF,
                         experimental_preserve_all_tensors=True)
        it.allocate_tensors()
        ins = it.get_input_details()
        if len(ins) != len(xs):
            return f"LiteRT has {len(ins)} inputs, Kiln {len(xs)}", None, None
        for d, x in zip(ins, xs):
            if tuple(d["shape"]) != x.shape or d["dtype"] != x.dtype:
                return f"LiteRT input {d['shape']} {d['dtype']} vs Kiln {x.shape} {x.dtype}", None, None
            it.set_tensor(d["index"], x)
        it.invoke()
        outs = [it.get_tensor(d["index"]) for d in it.get_output_details()]
        tensors = {}
        for d in it.get_tensor_details():
            try:
                tensors[d["index"]] = it.get_tensor(d["index"])
            except ValueError:
                pass
        return None, outs, tensors
    except (ValueError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}", None, None


def _litert_accepts(data):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    try:
        it = Interpreter(model_content=litert_loadable(data), experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
        it.allocate_tensors()
        return True
    except (ValueError, RuntimeError):
        return False


def _culprit(data, g, ref_vals, lit_tensors):
    """Name of the first TFLite operator whose output differs (Kiln value vs LiteRT tensor)."""
    import tflite
    m = tflite.Model.GetRootAs(data, 0)
    sg = m.Subgraphs(0)
    by_index = {i: v for v, i in g.meta.get("tflite_tensors", {}).items()}
    from kiln.frontend.tflite_import import opcode_name
    for k in range(sg.OperatorsLength()):
        op = sg.Operators(k)
        opname = opcode_name(m.OperatorCodes(op.OpcodeIndex()))
        for j in range(op.OutputsLength()):
            t = int(op.Outputs(j))
            if t in by_index and by_index[t] in ref_vals and t in lit_tensors:
                if not _same(ref_vals[by_index[t]], lit_tensors[t]):
                    return f"{opname} (operator {k})"
    return "an output"


def _compile_and_run(g, xs, ref_outs, job):
    """``kiln compile`` for a Cortex-M core (its sources are built with arm-none-eabi-gcc -Wall
    -Wextra -Werror) and for the host, whose C runs on ``xs`` and must equal the reference bit for
    bit. ``job``: {"target": core, "optimize": "size" | "speed"}."""
    from kiln import hil
    from kiln.backends.host import HostModel
    d = tempfile.mkdtemp(prefix="kiln_campaign_")
    optimize = job["optimize"]
    try:
        _stage(f"compile {job['target']} --optimize {optimize}")
        hil.compile_model(g, job["target"], os.path.join(d, "mcu"), plot=False, optimize=optimize)
        _stage("compile host")
        pkg = hil.compile_model(g, "host", os.path.join(d, "pkg"), plot=False, optimize=optimize)
        _stage("host C")
        outs = HostModel(pkg.path).run(*xs)
        for k, (a, b) in enumerate(zip(outs, ref_outs)):
            if not _same(a, b):
                bad = int(np.sum(np.asarray(a) != np.asarray(b)))
                return "c_diff", f"output {k}: {bad} of {np.asarray(b).size} elements differ from the reference"
        return None, None
    finally:
        shutil.rmtree(d, ignore_errors=True)


def evaluate(path, seed, index, do_compile):
    """One mutant through every stage (in this process); returns its record. ``do_compile``: None,
    or {"target": a Cortex-M core, "optimize": "size" | "speed"} for the compile stage."""
    from kiln.commands.inspect import summarize
    from kiln.frontend import KilnError, run
    from kiln.frontend.tflite_import import load_tflite
    with open(path, "rb") as f:
        buf = f.read()
    kind, desc, data = mutant(buf, seed, index)
    rec = {"model": os.path.basename(path), "seed": seed, "index": index, "kind": kind, "mutation": desc}
    stage = "import"
    try:
        _stage(stage)
        try:
            g = load_tflite(data)
        except KilnError as e:
            msg = str(e)
            rec.update(outcome="memory" if "MemoryError" in msg else "rejected", message=msg)
            if os.environ.get("KILN_CAMPAIGN_LITERT_ALL"):      # how often is Kiln stricter than LiteRT?
                _stage("litert")
                rec["litert_accepts"] = _litert_accepts(data)
            return rec
        stage = "inspect"
        _stage(stage)
        summarize(g)
        xs = _inputs(g, seed, index)
        stage = "litert"
        _stage(stage)
        err, lit_outs, lit_tensors = _litert(data, xs)
        if err is not None:
            rec.update(outcome="litert_rejects", message=err)
            return rec
        stage = "reference"
        _stage(stage)
        keep = [v for v in g.meta.get("tflite_tensors", {}) if g.kind(v) in ("input", "node")]
        ref_outs, ref_vals = run(g, *xs, keep=keep) if keep else (run(g, *xs), {})
        if len(ref_outs) != len(lit_outs) or not all(_same(a, b) for a, b in zip(ref_outs, lit_outs)):
            rec.update(outcome="diff", culprit=_culprit(data, g, ref_vals, lit_tensors))
            return rec
        rec["outcome"] = "same"
        if do_compile:
            stage = "compile"
            rec["compiled"] = do_compile
            try:
                outcome, msg = _compile_and_run(g, xs, ref_outs, do_compile)
            except KilnError as e:
                outcome, msg = "compile_rejected", str(e)
            if outcome is not None:
                rec.update(outcome=outcome, message=msg)
        return rec
    except MemoryError:
        rec.update(outcome="memory", stage=stage, message=traceback.format_exc()[-2000:])
        return rec
    except KilnError as e:        # accepted by the importer, refused later: the import should have said so
        rec.update(outcome="late_error", stage=stage, message=f"{type(e).__name__}: {e}")
        return rec
    except Exception:  # noqa: BLE001  (the point of the campaign: any escape is recorded)
        rec.update(outcome="traceback", stage=stage, message=traceback.format_exc()[-3000:])
        return rec


def worker_main(mem_mb):
    resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
    from ai_edge_litert import interpreter  # noqa: F401

    import kiln.frontend  # noqa: F401
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        job = json.loads(line)
        rec = evaluate(job["path"], job["seed"], job["index"], job["compile"])
        sys.stdout.write("result " + json.dumps(rec) + "\n")
        sys.stdout.flush()


# ---- parent side ------------------------------------------------------------------------------
class _Worker:
    def __init__(self, mem_mb):
        self.err = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.p = subprocess.Popen([sys.executable, "-m", "tests.frontend.tflite_campaign", "--worker",
                                   "--mem-mb", str(mem_mb)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, cwd=ROOT, env=env)
        self.buf = b""
        line = self.readline(300)
        if line != "ready":
            raise RuntimeError(f"campaign worker did not start: {line!r}; stderr: {self.stderr_tail()}")

    def stderr_tail(self):
        self.err.seek(0, os.SEEK_END)
        n = self.err.tell()
        self.err.seek(max(0, n - 2000))
        return self.err.read().decode("utf-8", "replace")

    def readline(self, timeout):
        deadline = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return ""            # EOF: the worker died
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def kill(self):
        self.p.kill()
        self.p.wait()
        self.err.close()


def _run_jobs(jobs, workers, mem_mb, timeout):
    q = queue.Queue()
    for j in jobs:
        q.put(j)
    results = []
    lock = threading.Lock()

    def loop():
        w = _Worker(mem_mb)
        try:
            while True:
                try:
                    job = q.get_nowait()
                except queue.Empty:
                    return
                w.p.stdin.write((json.dumps(job) + "\n").encode())
                w.p.stdin.flush()
                stage, rec = "start", None
                while rec is None:
                    line = w.readline(timeout)
                    if line is None or line == "":
                        what = "hang" if line is None else "crash"
                        rec = {"model": os.path.basename(job["path"]), "seed": job["seed"], "index": job["index"],
                               "stage": stage, "message": w.stderr_tail()[-1500:]}
                        # LiteRT crashing or hanging on a file Kiln accepted is LiteRT refusing it
                        rec["outcome"] = "litert_rejects" if stage == "litert" else what
                        if stage == "litert":
                            rec["message"] = f"LiteRT {'hung' if what == 'hang' else 'crashed'}: " + rec["message"]
                        w.kill()
                        w = _Worker(mem_mb)
                    elif line.startswith("stage "):
                        stage = line[6:]
                    elif line.startswith("result "):
                        rec = json.loads(line[7:])
                with lock:
                    results.append(rec)
        finally:
            w.kill()
    threads = [threading.Thread(target=loop) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: (r["model"], r["index"]))


def run_campaign(paths, per_model, seed=0, compile_every=0, workers=2, mem_mb=MEM_LIMIT_MB, timeout=300):
    """Run ``per_model`` mutants of every model in ``paths``; mutants with ``index % compile_every
    == 0`` that import and agree with LiteRT also go through compile + host C (the Cortex-M core and
    --optimize mode taken in turn from CORES x (size, speed)). Returns records."""
    def mode(i):
        if not compile_every or i % compile_every:
            return None
        j = i // compile_every
        return {"target": CORES[j % len(CORES)], "optimize": ("size", "speed")[j // len(CORES) % 2]}
    jobs = [{"path": os.fspath(p), "seed": seed, "index": i, "compile": mode(i)}
            for p in paths for i in range(per_model)]
    return _run_jobs(jobs, workers, mem_mb, timeout)


def summary(records):
    """Counts per outcome, per kind and outcome, and the culprits of differences."""
    out = {"mutants": len(records), "outcomes": {}, "by_kind": {}, "culprits": {}, "compiled": 0}
    for r in records:
        o = r["outcome"]
        out["outcomes"][o] = out["outcomes"].get(o, 0) + 1
        k = out["by_kind"].setdefault(r.get("kind", "?"), {})
        k[o] = k.get(o, 0) + 1
        out["compiled"] += bool(r.get("compiled"))
        if o == "diff":
            c = r["culprit"].split(" (")[0]
            out["culprits"][c] = out["culprits"].get(c, 0) + 1
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mem-mb", type=int, default=MEM_LIMIT_MB)
    ap.add_argument("--models", default=os.path.join(os.environ.get("KILN_SHARED", os.path.join(
        os.path.dirname(ROOT), "shared")), "models"))
    ap.add_argument("--per-model", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-every", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", help="write every record to this file")
    ap.add_argument("--litert-all", action="store_true",
                    help="also ask LiteRT about the files Kiln refuses (how often is Kiln stricter?)")
    a = ap.parse_args(argv)
    if a.litert_all:
        os.environ["KILN_CAMPAIGN_LITERT_ALL"] = "1"      # the workers inherit it
    if a.worker:
        worker_main(a.mem_mb)
        return
    paths = sorted(os.path.join(a.models, f) for f in os.listdir(a.models) if f.endswith(".tflite"))
    recs = run_campaign(paths, a.per_model, a.seed, a.compile_every, a.workers, a.mem_mb)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)
    print(json.dumps(summary(recs), indent=1))


if __name__ == "__main__":
    main()
