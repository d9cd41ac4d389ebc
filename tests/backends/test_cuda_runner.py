"""backends/cuda_runner.py against a recording stand-in for CuPy (tests/backends/fake_cupy.py):
no GPU is lent here, so what is checked is what the runner asks of CuPy: one stream for every
copy and launch, the requested device selected before it is checked, a warm-up run before graph
capture and no partial graph after a failed one, a poisoned arena between guard zones, NVRTC
options with the CUDA headers. The real runs are the gpu-marked tests in test_cuda_codegen.py."""
import subprocess
import sys

import pytest

from kiln.backends import cuda, cuda_runner, nvrtc
from tests.backends import fake_cupy
from tests.backends.server_models import make


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    fwd, _, x, _ = make("mlp")
    return cuda.compile(fwd, str(tmp_path_factory.mktemp("runner") / "mlp"), check=False), fwd, x


def _runner(monkeypatch, pkg, **kw):
    cp = fake_cupy.make(**{k: v for k, v in kw.items() if k in ("devices", "fail_launch")})
    monkeypatch.setitem(__import__("sys").modules, "cupy", cp)
    return cuda_runner.CudaRunner(pkg, device=kw.get("device")), cp


def test_every_copy_and_launch_is_on_the_runner_stream(monkeypatch, pkg):
    path, fwd, x = pkg
    r, cp = _runner(monkeypatch, path)
    r.set_params({k: v for k, v in fwd.params.items() if k in r.weight_names})
    r(x)
    ops = [e for e in cp.log if e[0] in ("set", "get", "full", "launch")]
    assert {e[0] for e in ops} == {"set", "get", "full", "launch"}
    streams = {e[1] if e[0] != "launch" else e[2] for e in ops}
    assert streams == {r.stream.name} and r.stream.name.endswith("-nb")


def test_arena_is_poisoned_between_guard_zones(monkeypatch, pkg):
    path, _, x = pkg
    r, cp = _runner(monkeypatch, path)
    assert ("full", r.stream.name, 0xFF) in cp.log          # the arena: NaN bytes, not zeros
    m = r.m
    biggest = max(a.bytes for st in m.steps for L in st.launches for a in L.args if a.space)
    assert r.guard >= biggest and r.guard % 256 == 0
    raw = {"arena": r._arena_raw, "weights": r._weights_raw}
    size = {"arena": m.arena_bytes, "weights": m.weights_bytes}
    spaces = set()
    for _, L, args in r._plan:                                # every pointer between the guard zones
        for a, p in zip(L.args, args):
            if a.space:
                spaces.add(a.space)
                lo = raw[a.space].data.ptr + r.guard
                assert int(p) == lo + a.offset and lo <= int(p) and int(p) + a.bytes <= lo + size[a.space]
    assert spaces == {"arena", "weights"} and r.guards_clean()
    r._arena_raw.a[3] = 0
    assert not r.guards_clean()


def test_probe_selects_the_requested_device_before_checking_it(monkeypatch, pkg):
    path, _, _ = pkg
    # device 0 is too old for sm_90, device 1 is an sm_90: asking for device 1 must work
    r, cp = _runner(monkeypatch, path, devices=(75, 90), device=1)
    assert r.cc == 90 and ("use", 1) in cp.log
    with pytest.raises(cuda_runner.CudaUnavailable, match=r"device 0 .*compute capability 7.5"):
        _runner(monkeypatch, path, devices=(75, 90))
    with pytest.raises(cuda_runner.CudaUnavailable, match=r"device 2 asked for.*2 CUDA device"):
        _runner(monkeypatch, path, devices=(75, 90), device=2)


def test_capture_warms_up_first(monkeypatch, pkg):
    path, _, x = pkg
    r, cp = _runner(monkeypatch, path)
    del cp.log[:]
    r.capture()
    begin = cp.log.index(("begin_capture", r.stream.name))
    n = len(r._plan)
    assert [e[0] for e in cp.log[:begin]].count("launch") == n      # one plain run before capture
    assert [e[0] for e in cp.log[begin:]].count("launch") == n
    r(x)
    assert ("graph", r.stream.name) in cp.log


def test_failed_capture_leaves_no_graph(monkeypatch, pkg):
    path, _, x = pkg
    last = None

    def fail(kernel, capturing):
        return capturing and kernel == last
    r, cp = _runner(monkeypatch, path, fail_launch=fail)
    last = r.m.steps[-1].launches[-1].kernel
    with pytest.raises(cuda_runner.CudaLaunchError, match=last):
        r.capture()
    assert r.graph is None and cp.log[-1][0] == "end_capture" and not cp.capturing[0]
    del cp.log[:]
    r(x)                                                       # launches kernel by kernel
    assert not any(e[0] == "graph" for e in cp.log)


def test_nvrtc_options_carry_the_cuda_headers(monkeypatch, pkg):
    path, _, _ = pkg
    _, cp = _runner(monkeypatch, path)
    assert "-diag-suppress=177" in cp.options and "--std=c++17" in cp.options
    assert [o for o in cp.options if o.startswith("-I")] == [f"-I{d}" for d in nvrtc.toolkit()["include"]]


def test_the_runner_imports_without_tvm_or_torch():
    """A GPU server runs packages without TVM (the package is generated elsewhere): importing the
    runner must not pull in TVM (which imports torch), so that it works where neither is installed."""
    code = ("import sys, kiln.backends.cuda_runner; "
            "print(sorted(m for m in ('tvm', 'torch', 'tvm_ffi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
