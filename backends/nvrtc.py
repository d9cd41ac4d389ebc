"""Compiling a CUDA package's ``kernels.cu`` without a GPU, as the runner compiles it.

NVRTC (pip ``nvidia-cuda-nvrtc-cu12``) compiles the source to PTX with the options the runner
gives CuPy (:func:`options`): C++17, ``-diag-suppress=177`` (TVM's unused variables), and the
include folders of ``nvidia-cuda-runtime-cu12`` (cuda_fp16.h, cuda_bf16.h) and
``nvidia-cuda-cccl-cu12`` (libcu++: cuda/std/...). ``ptxas -v`` (pip ``nvidia-cuda-nvcc-cu12``)
then assembles the PTX for the real architecture and reports each kernel's registers, shared
memory, stack and spills; :func:`check_package` fails naming the kernel and the limit it
exceeds. No driver and no device are needed. ``pip install -e .[cuda]`` (scripts/setup.sh
--test) installs the four packages.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import re
import subprocess
import tempfile

import numpy as np

from kiln.frontend.errors import KilnError

ARCHS = ("sm_80", "sm_90")
SHARED_LIMIT = 48 * 1024          # bytes of shared memory per block without the opt-in attribute
REGISTERS_PER_BLOCK = 64 * 1024   # 32-bit registers per block (sm_80, sm_90)
MAX_REGISTERS_PER_THREAD = 255
PIP = "nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-cccl-cu12 nvidia-cuda-nvcc-cu12"


class NvrtcUnavailable(KilnError):
    """NVRTC, the CUDA headers or ptxas are not installed."""


class NvrtcError(KilnError):
    """The package's source does not compile, or a kernel exceeds a GPU limit."""


def _pkg_dir(name):
    spec = importlib.util.find_spec(f"nvidia.{name}")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def toolkit():
    """{"nvrtc": libnvrtc path, "include": [dirs], "ptxas": path or None} from the pip packages
    (``CUDA_PATH`` as a fallback); raises :class:`NvrtcUnavailable` naming what to install."""
    found = {"include": []}
    d = _pkg_dir("cuda_nvrtc")
    libs = sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so*"))) if d else []
    libs = [p for p in libs if "builtins" not in p and ".alt." not in p]
    cuda_path = os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME")
    if not libs and cuda_path:
        libs = sorted(glob.glob(os.path.join(cuda_path, "lib64", "libnvrtc.so*")))
    if not libs:
        raise NvrtcUnavailable(f"NVRTC not found: pip install {PIP} (bash scripts/setup.sh --test installs "
                               f"them), or set CUDA_PATH to a CUDA 12 toolkit")
    found["nvrtc"] = libs[0]
    for name in ("cuda_runtime", "cuda_cccl"):
        d = _pkg_dir(name)
        if d and os.path.isdir(os.path.join(d, "include")):
            found["include"].append(os.path.join(d, "include"))
    for sub in ("include", os.path.join("include", "cccl")):      # CUDA 13 keeps libcu++ in include/cccl
        if cuda_path and os.path.isdir(os.path.join(cuda_path, sub)):
            found["include"].append(os.path.join(cuda_path, sub))
    if not any(os.path.exists(os.path.join(i, "cuda_fp16.h")) for i in found["include"]):
        raise NvrtcUnavailable(f"cuda_fp16.h not found: pip install nvidia-cuda-runtime-cu12 (with {PIP})")
    if not any(os.path.isdir(os.path.join(i, "cuda", "std")) for i in found["include"]):
        raise NvrtcUnavailable(f"libcu++ (cuda/std/...) not found: pip install nvidia-cuda-cccl-cu12 (with {PIP})")
    d = _pkg_dir("cuda_nvcc")
    ptxas = os.path.join(d, "bin", "ptxas") if d else None
    if not (ptxas and os.path.exists(ptxas)) and cuda_path:
        ptxas = os.path.join(cuda_path, "bin", "ptxas")
    found["ptxas"] = ptxas if ptxas and os.path.exists(ptxas) else None
    return found


def options(arch=None, includes=None):
    """NVRTC options for a package: the runner passes these to CuPy's ``RawModule`` (without
    ``arch``: CuPy adds the device's); :func:`compile_ptx` adds ``-arch=compute_XX``."""
    opts = ["--std=c++17", "-diag-suppress=177"]
    if includes is None:
        try:
            includes = toolkit()["include"]
        except NvrtcUnavailable:
            includes = []
    opts += [f"-I{d}" for d in includes]
    if arch:
        opts.append(f"-arch=compute_{arch_number(arch)}")
    return opts


def arch_number(arch):
    m = re.fullmatch(r"sm_(\d+)", str(arch))
    if not m:
        raise KilnError(f"bad CUDA arch {arch!r} (expected e.g. 'sm_90')")
    return int(m.group(1))


def error_lines(log, limit=40):
    """The error diagnostics of an NVRTC log (each with its source line and caret), without the
    warnings around them, at most ``limit`` lines."""
    out, keep = [], False
    for line in log.splitlines():
        if re.search(r"\(\d+\): (catastrophic )?error", line) or "errors detected" in line or \
                "error detected" in line:
            keep = True
        elif re.search(r"\(\d+\): (warning|remark)", line) or not line.strip():
            keep = False
        if keep:
            out.append(line)
    if not out:
        out = [ln for ln in log.splitlines() if ln.strip()][-limit:]
    return "\n".join(out[:limit]) + (f"\n... ({len(out) - limit} more lines)" if len(out) > limit else "")


def compile_ptx(src, arch, name="kernels.cu"):
    """PTX of ``src`` for ``arch`` with the runner's NVRTC options; raises :class:`NvrtcError`
    with the error lines of the log."""
    tk = toolkit()
    lib = ctypes.CDLL(tk["nvrtc"])
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None)
    if rc:
        raise NvrtcError(f"nvrtcCreateProgram failed ({rc})")
    try:
        opts = [o.encode() for o in options(arch, tk["include"])]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        if rc:
            raise NvrtcError(f"NVRTC could not compile {name} for {arch}:\n"
                             f"{error_lines(log.value.decode(errors='replace'))}")
        lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
        ptx = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetPTX(prog, ptx)
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text):
    """``ptxas -v`` output -> {kernel: {registers, shared_bytes, stack_bytes, spill_stores, spill_loads}}."""
    res, cur = {}, None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = res.setdefault(m.group(1), {"registers": 0, "shared_bytes": 0, "stack_bytes": 0,
                                              "spill_stores": 0, "spill_loads": 0})
            continue
        if cur is None:
            continue
        m = _PROPS.search(line)
        if m:
            cur["stack_bytes"], cur["spill_stores"], cur["spill_loads"] = map(int, m.groups())
        m = _USED.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            cur["shared_bytes"] = int(s.group(1)) if s else 0
    return res


def ptxas_resources(ptx, arch):
    """Per-kernel resources of ``ptx`` assembled for ``arch`` by ``ptxas -v``; raises
    :class:`NvrtcError` with ptxas's error lines (e.g. a kernel's static shared memory over 48 KiB)."""
    tk = toolkit()
    if tk["ptxas"] is None:
        raise NvrtcUnavailable(f"ptxas not found: pip install nvidia-cuda-nvcc-cu12 (with {PIP})")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernels.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        p = subprocess.run([tk["ptxas"], f"-arch={arch}", "-v", path, "-o", os.devnull],
                           capture_output=True, text=True)
    if p.returncode:
        errs = [_explain(ln) for ln in (p.stderr + p.stdout).splitlines() if "error" in ln.lower()]
        raise NvrtcError(f"ptxas ({arch}) rejected the package's kernels:\n" + "\n".join(errs[:20]))
    return parse_ptxas(p.stderr + p.stdout)


def _explain(line):
    """A ptxas error line, with a shared-memory overflow restated in bytes."""
    m = re.search(r"Entry function '(\w+)' uses too much shared data \((0x[0-9a-f]+) bytes, (0x[0-9a-f]+) max\)", line)
    if m:
        return (f"kernel {m.group(1)}: {int(m.group(2), 16)} bytes of static shared memory, limit "
                f"{int(m.group(3), 16)} ({line.strip()})")
    return line.strip()


def limit_errors(m, resources):
    """What in a package exceeds a GPU limit, one line per kernel launch: static + dynamic shared
    memory per block, registers x threads per block, registers per thread."""
    bad = []
    for st in m.steps:
        for L in st.launches:
            r = resources.get(L.kernel)
            if r is None:
                continue
            threads = int(np.prod(L.block))
            shared = r["shared_bytes"] + L.shared_bytes
            where = f"step {st.step} ({st.func}) kernel {L.kernel}"
            if shared > SHARED_LIMIT:
                bad.append(f"{where}: {shared} bytes of shared memory per block, limit {SHARED_LIMIT}")
            if r["registers"] * threads > REGISTERS_PER_BLOCK:
                bad.append(f"{where}: {r['registers']} registers x {threads} threads per block = "
                           f"{r['registers'] * threads}, limit {REGISTERS_PER_BLOCK}")
    return bad


def check_package(pkg, m, archs=ARCHS):
    """Compile the package's sources with NVRTC and ptxas for each of ``archs``; returns
    {arch: {kernel: resources}} for the launched kernels. Raises :class:`NvrtcError` when the
    source does not compile or a kernel exceeds a limit, naming the kernel and the limit."""
    src = "".join(open(os.path.join(pkg, s)).read() for s in m.sources)
    out = {}
    for arch in archs:
        res = ptxas_resources(compile_ptx(src, arch, m.sources[0]), arch)
        missing = sorted(set(m.kernels) - set(res))
        if missing:
            raise NvrtcError(f"{pkg}: kernels {missing[:5]} launched by the plan are not in the PTX for {arch}")
        bad = limit_errors(m, res)
        if bad:
            raise NvrtcError(f"{pkg} ({arch}): " + "; ".join(bad[:5]))
        out[arch] = {k: res[k] for k in m.kernels}
    return out


def summary(resources):
    """One line per arch: kernels, max registers, max shared bytes, kernels that spill."""
    lines = []
    for arch, res in resources.items():
        spills = sorted(k for k, r in res.items() if r["spill_stores"] or r["spill_loads"])
        lines.append(f"{arch}: {len(res)} kernels, registers <= {max((r['registers'] for r in res.values()), default=0)}, "
                     f"static shared <= {max((r['shared_bytes'] for r in res.values()), default=0)} B, "
                     f"{len(spills)} spill" + (f" ({', '.join(spills[:5])})" if spills else ""))
    return "\n".join(lines)


def table(resources):
    """Text table of {arch: {kernel: resources}}: one row per kernel, then the summary."""
    lines = []
    for arch, res in resources.items():
        lines.append(f"  NVRTC + ptxas {arch}: registers, static shared memory, stack, spill stores/loads per kernel")
        for k in sorted(res):
            r = res[k]
            lines.append(f"    {k:<48} {r['registers']:>4} regs {r['shared_bytes']:>7} B shared {r['stack_bytes']:>5} B stack "
                         f"spills {r['spill_stores']}/{r['spill_loads']} B")
    return "\n".join(lines + ["  " + ln for ln in summary(resources).splitlines()])
