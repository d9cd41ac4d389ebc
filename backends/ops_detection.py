"""C kernel of ``detection_postprocess`` (TFLite_Detection_PostProcess): one call of
``kiln_dpp_run`` (include/kiln_detect.h), the same arithmetic and order as the reference
(frontend/ops/detection.py), with two arena scratch buffers for the decoded boxes, the sort
buffers and the candidate lists."""
from __future__ import annotations

from tvm import te, tirx

from kiln.frontend.ops.detection import slots

from .lower import lower_rule
from .qmath import c


def scratch_sizes(B, C, a):
    """(float words, int32 words) of scratch the kernel needs (see kiln_detect.h's layout)."""
    P = a["max_detections"] + a["detections_per_class"]
    return 6 * B + 2 * P, 5 * B + max(B * C + C, 6 * P)


@lower_rule("detection_postprocess")
def lower_detection_postprocess(k, node, xs):
    a = node.attrs
    enc, scores, anc = xs
    tb, tc = k.type(node.inputs[0]), k.type(node.inputs[1])
    B, S, NC, C = int(tb.shape[1]), int(tb.shape[2]), int(tc.shape[2]), a["num_classes"]
    D = slots(a)
    nf, ni = scratch_sizes(B, C, a)
    fw = te.compute((nf,), lambda i: tirx.const(0.0, "float32"), name="dpp_fw")
    iw = te.compute((ni,), lambda i: tirx.const(0, "int32"), name="dpp_iw")

    def f32(v):
        return tirx.const(float(v), "float32")

    def body(ins, outs):
        e, s, an, fwb, iwb = ins
        return tirx.Evaluate(tirx.call_extern(
            "int32", "kiln_dpp_run", e.access_ptr("r"), s.access_ptr("r"), an.access_ptr("r"), fwb.access_ptr("rw"),
            iwb.access_ptr("rw"), outs[0].access_ptr("w"), c(B), c(S), c(NC), c(C), c(a["max_detections"]),
            c(a["max_classes_per_detection"]), c(a["detections_per_class"]), c(int(a["use_regular_nms"])), c(D),
            f32(a["nms_score_threshold"]), f32(a["nms_iou_threshold"]), f32(a["y_scale"]), f32(a["x_scale"]),
            f32(a["h_scale"]), f32(a["w_scale"])))
    ins = [enc, scores, anc, fw, iw]
    bufs = [tirx.decl_buffer(t.shape, t.dtype, name=t.op.name, elem_offset=0) for t in ins]
    out = tirx.decl_buffer((6 * D + 1,), "float32", name="detection", elem_offset=0)
    return te.extern((6 * D + 1,), ins, body, name="detection", dtype="float32", in_buffers=bufs, out_buffers=[out])
