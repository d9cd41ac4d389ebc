"""TFLite_Detection_PostProcess (SSD heads): Kiln's reference and the C kernel (host and, slow,
mps2-an386) against LiteRT's reference kernels, fast and regular NMS, with and without a
background class, several classes per detection; malformed options, outputs of the wrong shape and
quantised inputs (TFLite Micro takes float only) are named."""
import flatbuffers.flexbuffers as fx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln
from kiln.frontend.errors import KilnError
from kiln.frontend.tflite_import import load_tflite
from tests.frontend.tflite_builder import Builder
from tests.quantize.litert_util import litert_run

OP = "CUSTOM:TFLite_Detection_PostProcess"


def options(**kw):
    o = dict(max_detections=5, max_classes_per_detection=1, detections_per_class=4, use_regular_nms=False,
             nms_score_threshold=0.3, nms_iou_threshold=0.5, num_classes=3, y_scale=10.0, x_scale=10.0, h_scale=5.0,
             w_scale=5.0)
    o.update(kw)
    return o


def model(rng, B=40, bg=True, quant=False, opts=None, out_shapes=None):
    """A .tflite holding only the op: inputs box encodings and class scores, anchors constant."""
    o = opts or options()
    C = o.get("num_classes", 3)
    NC = C + (1 if bg else 0)
    b = Builder("ssd_head")
    qb = dict(dtype="int8", scale=0.05, zero_point=3) if quant else {}
    qc = dict(dtype="int8", scale=1 / 256, zero_point=-128) if quant else {}
    box, cls = b.tensor("box", (1, B, 4), **qb), b.tensor("cls", (1, B, NC), **qc)
    anc = np.concatenate([rng.uniform(0.1, 0.9, (B, 2)), rng.uniform(0.05, 0.4, (B, 2))], 1).astype(np.float32)
    if quant:
        anchors = b.tensor("anchors", (B, 4), "uint8", data=np.round(anc * 255).astype(np.uint8), scale=1 / 255,
                           zero_point=0)
    else:
        anchors = b.tensor("anchors", (B, 4), data=anc)
    D = o["max_detections"] * o["max_classes_per_detection"]
    shapes = out_shapes or [(1, D, 4), (1, D), (1, D), (1,)]
    outs = [b.tensor(n, s) for n, s in zip(("boxes", "classes", "scores", "count"), shapes)]
    b.op(OP, [box, cls, anchors], outs, None, False, custom_options=bytes(fx.Dumps(o)))
    return b.build([box, cls], outs), [(1, B, 4), (1, B, NC)]


def feeds(rng, shapes):
    return [rng.standard_normal(shapes[0]).astype(np.float32), rng.random(shapes[1]).astype(np.float32)]


def valid(o, count):
    """Output slots TFLite writes (the rest it leaves unwritten; Kiln writes 0)."""
    n = int(count[0])
    if o["use_regular_nms"]:
        return list(range(n))
    k = min(o["max_classes_per_detection"], o["num_classes"])
    return [o["max_classes_per_detection"] * i + c for i in range(n) for c in range(k)]


def assert_same(o, got, want):
    np.testing.assert_array_equal(got[3], want[3])
    s = valid(o, want[3])
    np.testing.assert_array_equal(got[0][0, s], want[0][0, s])
    np.testing.assert_array_equal(got[1][0, s], want[1][0, s])
    np.testing.assert_array_equal(got[2][0, s], want[2][0, s])
    rest = sorted(set(range(got[1].shape[1])) - set(s))
    assert not got[0][0, rest].any() and not got[1][0, rest].any() and not got[2][0, rest].any()


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 80), C=st.integers(1, 6), bg=st.booleans(), regular=st.booleans(), mcpd=st.integers(1, 3),
       maxdet=st.integers(1, 10), dpc=st.integers(1, 8), score=st.floats(0.0, 0.9), iou=st.floats(0.05, 1.0),
       seed=st.integers(0, 2 ** 31))
def test_reference_matches_litert(B, C, bg, regular, mcpd, maxdet, dpc, score, iou, seed):
    rng = np.random.default_rng(seed)
    o = options(num_classes=C, use_regular_nms=regular, max_classes_per_detection=mcpd, max_detections=maxdet,
                detections_per_class=dpc, nms_score_threshold=score, nms_iou_threshold=iou)
    buf, shapes = model(rng, B, bg, False, o)
    g = load_tflite(buf)
    for _ in range(2):
        x = feeds(rng, shapes)
        assert_same(o, kiln.run(g, *x), litert_run(buf, x))


CASES = [dict(), dict(use_regular_nms=True), dict(max_classes_per_detection=2, num_classes=4),
         dict(use_regular_nms=True, max_detections=8, detections_per_class=3, nms_iou_threshold=0.3)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_host_c_equals_reference_and_litert(tmp_path, case):
    from kiln.backends import compile as compile_pkg
    rng = np.random.default_rng(case)
    o = options(**CASES[case])
    buf, shapes = model(rng, 120, case % 2 == 0, False, o)
    g = load_tflite(buf)
    pkg = compile_pkg(g, target="host", out_dir=tmp_path, plot=False, measure_size=False)
    for _ in range(3):
        x = feeds(rng, shapes)
        got, ref = pkg.run(*x), kiln.run(g, *x)
        for a, b in zip(got, ref):
            np.testing.assert_array_equal(a, b)
        assert_same(o, got, litert_run(buf, x))


@pytest.mark.slow
@pytest.mark.qemu
def test_bit_exact_on_board(tmp_path):
    from kiln.commands.golden import golden
    from kiln.commands.verify import verify
    rng = np.random.default_rng(5)
    buf, shapes = model(rng, 64, True, False, options(use_regular_nms=True))
    p = tmp_path / "ssd_head.tflite"
    p.write_bytes(buf)
    g = load_tflite(buf)
    samples = [tuple(feeds(rng, shapes)) for _ in range(3)]
    gold = str(tmp_path / "g.npz")
    golden(str(p), gold, samples, oracle="reference")     # Kiln's reference: LiteRT leaves unused slots unwritten
    rep = verify(str(p), gold, "mps2-an386", options={"out": str(tmp_path / "board")})
    assert rep["ok"] and rep["matched"] == 3, rep["results"]
    for x in samples:
        assert_same(options(use_regular_nms=True), kiln.run(g, *x), litert_run(buf, list(x)))


def test_bad_options_and_outputs_are_named():
    rng = np.random.default_rng(0)
    buf, _ = model(rng, opts={k: v for k, v in options().items() if k != "num_classes"})
    with pytest.raises(KilnError, match="custom options lack 'num_classes'"):
        load_tflite(buf)
    buf, _ = model(rng, out_shapes=[(1, 4, 4), (1, 4), (1, 4), (1,)])
    with pytest.raises(KilnError, match=r"TFLite_Detection_PostProcess\): output .* has shape \[1, 4, 4\]"):
        load_tflite(buf)
    buf, _ = model(rng, quant=True)
    with pytest.raises(KilnError, match="'box'.* is int8 \\(quantised\\); TFLite Micro's .* takes float32 inputs"):
        load_tflite(buf)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_export_round_trip_runs_in_litert(case):
    """An imported SSD head exports as the custom op with its four outputs (no packed vector, no
    slices), LiteRT runs the export exactly as the original, and it imports back."""
    import tflite

    from kiln.frontend.tflite_import import opcode_name
    from kiln.quantize.tflite_export import export_tflite
    rng = np.random.default_rng(10 + case)
    o = options(**CASES[case])
    buf, shapes = model(rng, 60, case % 2 == 1, False, o)
    out = export_tflite(load_tflite(buf))
    m = tflite.Model.GetRootAsModel(out, 0)
    sg = m.Subgraphs(0)
    assert [opcode_name(m.OperatorCodes(sg.Operators(i).OpcodeIndex())) for i in range(sg.OperatorsLength())] == [OP]
    g2 = load_tflite(out)
    for _ in range(2):
        x = feeds(rng, shapes)
        want = litert_run(buf, x)
        assert_same(o, litert_run(out, x), want)
        assert_same(o, kiln.run(g2, *x), want)


def test_export_of_the_packed_vector_itself():
    """A graph that reads the packed vector directly (not through the importer's slices) exports
    the op's outputs concatenated back into it."""
    from kiln.quantize.tflite_export import export_tflite
    rng = np.random.default_rng(3)
    o = options(use_regular_nms=True, max_detections=6)
    buf, shapes = model(rng, 50, True, False, o)
    g = load_tflite(buf)
    packed = next(n.name for n in g.nodes if n.op == "detection_postprocess")
    g.outputs = [packed]
    out = export_tflite(g)
    for _ in range(2):
        x = feeds(rng, shapes)
        np.testing.assert_array_equal(litert_run(out, x)[0], kiln.run(g, *x)[0])
