"""nn.SVDF (Module API): a float SVDF layer exports as one SVDF operator that LiteRT runs like Kiln
over a stream of invocations; ``ptq`` quantises it to TFLite's integer SVDF (int8 input, feature
weights and output, int16 time weights and state, int32 bias), bit-exact with LiteRT's reference
kernel, the re-imported file and the host C package over a stream; calibration carries the state."""
import numpy as np
import pytest

import kiln.frontend as kf
from kiln.autodiff import check_grads
from kiln.backends import compile as compile_pkg
from kiln.frontend import functional as F
from kiln.frontend.executor import run_stateful
from kiln.frontend.tflite_import import load_tflite
from kiln.quantize import ptq
from kiln.quantize.tflite_export import export_tflite
from tests.frontend.svdf_util import litert_stream
from tests.quantize.litert_util import assert_same


@pytest.fixture(autouse=True, scope="module")
def _keep_layer_rng():
    from kiln.frontend import module
    saved = module._rng
    yield
    module._rng = saved


def _model(B=1, I=6, units=4, memory=5, rank=2, act="relu", head=False, seed=0):
    kf.manual_seed(seed)
    svdf = kf.SVDF(I, units, memory, rank=rank, activation=act)
    svdf.bias.data = np.random.default_rng(seed).standard_normal(units).astype(np.float32) * 0.3
    lin = kf.Linear(units, 3)
    return kf.trace((lambda x: lin(svdf(x))) if head else svdf, (B, I))


def _stream(shape, n, seed, int8=False):
    rng = np.random.default_rng(seed)
    if int8:
        return [rng.integers(-128, 128, shape).astype(np.int8) for _ in range(n)]
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("B,rank,act", [(1, 2, "relu"), (2, 1, "none"), (1, 3, "none")])
def test_float_svdf_layer_matches_litert_over_a_stream(B, rank, act):
    g = _model(B, rank=rank, act=act)
    assert [n.op for n in g.nodes] == ["svdf_state", "svdf"] and len(g.states) == 1
    xs = _stream((B, 6), 7, 1)
    lite = litert_stream(export_tflite(g), xs)
    state = {}
    for x, want in zip(xs, lite):
        np.testing.assert_allclose(run_stateful(g, state, x)[0], want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("B,rank,head", [(1, 2, False), (2, 1, True), (1, 3, True)])
def test_ptq_svdf_is_tflites_integer_svdf_bit_exact(B, rank, head, tmp_path):
    g = _model(B, rank=rank, head=head)
    cal = np.random.default_rng(2).standard_normal((96, 6)).astype(np.float32)
    q = ptq(g, cal, int8_io=True)
    svdf = [n for n in q.nodes if n.op in ("svdf_state", "svdf")]
    assert [q.types[n.name].dtype for n in svdf] == ["int16", "int8"]
    assert [q.types[v].dtype for v in svdf[1].inputs[1:]] == ["int16", "int32"]
    st = next(iter(q.states))
    assert q.types[st].dtype == "int16" and q.types[st].quant == q.types[svdf[0].name].quant
    model = export_tflite(q)
    back = load_tflite(model)
    pkg = compile_pkg(q, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    xs = _stream((B, 6), 8, 3, int8=True)
    lite = litert_stream(model, xs)
    s1, s2 = {}, {}
    for k, (x, want) in enumerate(zip(xs, lite)):
        assert_same(run_stateful(q, s1, x)[0], want[0], f"reference, run {k}")
        assert_same(run_stateful(back, s2, x)[0], want[0], f"re-imported, run {k}")
        assert_same(pkg.run(x)[0], want[0], f"host C, run {k}")


def test_calibration_follows_the_stream():
    """The ranges are a running stream's (every memory column filled), not one run's from the reset
    state: the quantised outputs track the float stream within a few output steps."""
    g = _model()
    q = ptq(g, np.random.default_rng(4).standard_normal((128, 6)).astype(np.float32), int8_io=True)
    iq, oq = q.types[q.inputs[0]].quant, q.types[q.outputs[0]].quant
    sf, sq, worst, top = {}, {}, 0.0, 0.0
    for x in _stream((1, 6), 30, 5):
        yf = run_stateful(g, sf, x)[0]
        xq = np.clip(np.round(x / iq.scale[0]) + iq.zero_point[0], -128, 127).astype(np.int8)
        yq = (run_stateful(q, sq, xq)[0].astype(np.float64) - oq.zero_point[0]) * oq.scale[0]
        worst, top = max(worst, float(np.abs(yq - yf).max())), max(top, float(np.abs(yf).max()))
    assert (127 - oq.zero_point[0]) * oq.scale[0] >= 0.5 * top        # the stream's outputs are in range
    assert worst < 0.1 * top, (worst, top)


def test_svdf_layer_gradients():
    res = check_grads(_model(2, rank=2, act="none"), [np.random.default_rng(6).standard_normal((2, 6))])
    assert res.ok, res


def test_svdf_errors():
    with pytest.raises(kf.KilnError, match="integer SVDF takes only RELU"):
        ptq(_model(act="none"), np.zeros((8, 6), np.float32))
    with pytest.raises(kf.KilnError, match="activation must be 'none' or 'relu'"):
        kf.SVDF(6, 4, 5, activation="tanh")
    with pytest.raises(kf.KilnError, match="stateful op"):
        F.svdf(np.zeros((1, 6), np.float32), np.zeros((4, 6), np.float32), np.zeros((4, 3), np.float32),
               np.zeros(2, np.float32), rank=2)


@pytest.mark.slow
@pytest.mark.qemu
def test_ptq_svdf_layer_streams_on_board(tmp_path):
    """nn.SVDF + Linear quantised by ptq: a stream of inferences on mps2-an386 (the state carried
    between them) against LiteRT running the int8 file as one stream."""
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    q = ptq(_model(head=True), np.random.default_rng(2).standard_normal((96, 6)).astype(np.float32), int8_io=True)
    path = tmp_path / "svdf_int8.tflite"
    path.write_bytes(export_tflite(q))
    gold = str(tmp_path / "g.npz")
    golden(str(path), gold, [[x] for x in _stream((1, 6), 5, 8, int8=True)])
    rep = verify(str(path), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 5, rep["results"]
