"""``detection_postprocess``: TFLite's custom ``TFLite_Detection_PostProcess``, the SSD head that
decodes box encodings against anchors and runs non-maximum suppression (TFLite Micro's
``kernels/detection_postprocess.cc``, which LiteRT's agrees with where noted).

Inputs: box encodings [1, B, >= 4] (y, x, h, w per anchor), class predictions [1, B, C (+ 1
background)], anchors [B, 4] (y, x, h, w); all float32, as TFLite Micro requires (LiteRT also takes
uint8 ones, which Kiln does not import as activations; int8 SSD models dequantise before the op). TFLite's op has four outputs; Kiln's IR
nodes have one, so the op writes them packed into one float32 vector of ``4 * D + D + D + 1``
values (boxes [D, 4] as (ymin, xmin, ymax, xmax), classes [D], scores [D], the number of
detections), and the importer slices the four TFLite outputs out of it. ``D`` is the number of
output slots (``detections``): max_detections * max_classes_per_detection for the fast NMS,
max_detections for the regular one. Slots past the number of detections are 0.

Decoding: ``y = y_e / y_scale * h_a + y_a`` and ``h/2 = 0.5 * exp(h_e / h_scale) * h_a`` in double,
each rounded to float32, then the corners in float32. NMS: the boxes whose score is >= the score
threshold, in decreasing score order (ties: the lower index first, TFLite Micro's order), each
kept unless its float32 IoU with an already kept box is > the IoU threshold. Fast NMS (the
default) runs it once on each box's best class score and reports the top
``max_classes_per_detection`` classes of each kept box (LiteRT's slot layout; TFLite Micro's
differs for more than one class per box and leaves slots unwritten, so it has no defined result
to match there); regular NMS runs it per class (at most ``detections_per_class`` each) and keeps
the ``max_detections`` best over all classes. Not differentiable.
"""
from __future__ import annotations

import math

import flatbuffers.flexbuffers as flexbuffers
import numpy as np

from ..errors import ShapeError
from ..registry import NONDIFF, REQUIRED, Attr, register
from ..types import TensorType
from . import tflite_util as tfl
from ._util import tt

NAME = "CUSTOM:TFLite_Detection_PostProcess"
F32 = np.float32

ATTRS = {"max_detections": Attr("int", REQUIRED), "max_classes_per_detection": Attr("int", 1),
         "detections_per_class": Attr("int", 100), "use_regular_nms": Attr("bool", False),
         "nms_score_threshold": Attr("float", REQUIRED), "nms_iou_threshold": Attr("float", REQUIRED),
         "num_classes": Attr("int", REQUIRED), "y_scale": Attr("float", REQUIRED), "x_scale": Attr("float", REQUIRED),
         "h_scale": Attr("float", REQUIRED), "w_scale": Attr("float", REQUIRED), "detections": Attr("int", REQUIRED)}


def slots(a) -> int:
    """Output slots D of the op's attributes (TFLite's Prepare)."""
    return a["max_detections"] * a["max_classes_per_detection"]


def _infer(ts, a):
    box, cls, anc = ts
    if any(t.dtype != "float32" or t.quant is not None for t in ts):
        raise ShapeError(f"detection_postprocess takes float32 inputs, got {[str(t) for t in ts]} (dequantise first)")
    if len(box.shape) != 3 or box.shape[0] != 1 or box.shape[2] < 4:
        raise ShapeError(f"detection_postprocess: box encodings must be [1, boxes, >= 4], got {list(box.shape)}")
    B = box.shape[1]
    nc = cls.shape[2] if len(cls.shape) == 3 else -1
    if len(cls.shape) != 3 or cls.shape[:2] != (1, B) or nc not in (a["num_classes"], a["num_classes"] + 1):
        raise ShapeError(f"detection_postprocess: class predictions must be [1, {B}, num_classes {a['num_classes']} "
                         f"(+ 1 background)], got {list(cls.shape)}")
    if tuple(anc.shape) != (B, 4):
        raise ShapeError(f"detection_postprocess: anchors must be [{B}, 4], got {list(anc.shape)}")
    if a["detections"] != slots(a) or a["max_detections"] < 1 or a["max_classes_per_detection"] < 1 \
            or a["detections_per_class"] < 1 or not 0 < a["nms_iou_threshold"] <= 1:
        raise ShapeError(f"detection_postprocess: inconsistent attributes {a} (detections must be {slots(a)}; "
                         f"counts >= 1; 0 < nms_iou_threshold <= 1)")
    return tt((6 * a["detections"] + 1,), "float32")


def decode(box, anc, a):
    """[B, 4] float32 corners (ymin, xmin, ymax, xmax) of the encoded boxes (double, then float32)."""
    out = np.empty((box.shape[0], 4), F32)
    ys, xs, hs, ws = (float(F32(a[k])) for k in ("y_scale", "x_scale", "h_scale", "w_scale"))
    for i in range(box.shape[0]):
        ye, xe, he, we = (float(v) for v in box[i, :4])
        ay, ax, ah, aw = (float(v) for v in anc[i])
        yc, xc = F32(ye / ys * ah + ay), F32(xe / xs * aw + ax)
        hh, hw = F32(0.5 * math.exp(he / hs) * ah), F32(0.5 * math.exp(we / ws) * aw)
        out[i] = (yc - hh, xc - hw, yc + hh, xc + hw)
    if np.any(out[:, 0] > out[:, 2]) or np.any(out[:, 1] > out[:, 3]):
        raise ShapeError("detection_postprocess: a decoded box has ymin > ymax or xmin > xmax (TFLite refuses it)")
    return out


def iou(b, i, j):
    """TFLite's ComputeIntersectionOverUnion in float32."""
    bi, bj = b[i], b[j]
    ai = (bi[2] - bi[0]) * (bi[3] - bi[1])
    aj = (bj[2] - bj[0]) * (bj[3] - bj[1])
    if ai <= 0 or aj <= 0:
        return F32(0)
    inter = max(min(bi[2], bj[2]) - max(bi[0], bj[0]), F32(0)) * max(min(bi[3], bj[3]) - max(bi[1], bj[1]), F32(0))
    return F32(inter / (ai + aj - inter))


def order(values):
    """Indices by decreasing value, ties by the lower index (TFLite Micro's partial and stable sorts)."""
    return np.argsort(-np.asarray(values, F32), kind="stable")


def nms_single(boxes, scores, a, limit):
    """Indices of the boxes NonMaxSuppressionSingleClassHelper selects, in selection order."""
    keep = np.nonzero(scores >= F32(a["nms_score_threshold"]))[0]
    cand = keep[order(scores[keep])]
    thr, out = F32(a["nms_iou_threshold"]), []
    active = np.ones(len(cand), bool)
    for i in range(len(cand)):
        if len(out) >= min(len(cand), limit):
            break
        if not active[i]:
            continue
        out.append(int(cand[i]))
        active[i] = False
        for j in range(i + 1, len(cand)):
            if active[j] and iou(boxes, cand[i], cand[j]) > thr:
                active[j] = False
    return out


def _fast(boxes, scores, a, y):
    C = a["num_classes"]
    k = min(a["max_classes_per_detection"], C)
    top = [order(row)[:k] for row in scores]
    best = np.asarray([row[t[0]] for row, t in zip(scores, top)], F32)
    sel = nms_single(boxes, best, a, a["max_detections"])
    D = a["detections"]
    for n, b in enumerate(sel):
        for col in range(k):
            s = a["max_classes_per_detection"] * n + col
            y[4 * s:4 * s + 4] = boxes[b]
            y[4 * D + s], y[5 * D + s] = top[b][col], scores[b, top[b][col]]
    y[6 * D] = len(sel)


def _regular(boxes, scores, a, y):
    C, D = a["num_classes"], a["detections"]
    kept = []                                   # (score, box, class), best first
    for col in range(C):
        sel = nms_single(boxes, scores[:, col], a, a["detections_per_class"])
        cand = kept + [(scores[b, col], b, col) for b in sel]
        kept = [cand[i] for i in order([c[0] for c in cand])[:min(len(cand), a["max_detections"])]]
    for s, (score, b, col) in enumerate(kept):
        y[4 * s:4 * s + 4] = boxes[b]
        y[4 * D + s], y[5 * D + s] = col, score
    y[6 * D] = len(kept)


def _ref(xs, a):
    box, cls, anc = (np.asarray(x, F32) for x in xs)
    boxes = decode(box[0], anc, a)
    scores = cls[0][:, cls.shape[2] - a["num_classes"]:]        # drop the background column
    y = np.zeros(6 * a["detections"] + 1, F32)
    (_regular if a["use_regular_nms"] else _fast)(boxes, scores, a, y)
    return y


register("detection_postprocess", attrs=ATTRS, infer=_infer, ref=_ref, props={NONDIFF}, arity=3,
         doc="TFLite_Detection_PostProcess (SSD): decode boxes against anchors, fast or regular NMS; the four "
             "outputs packed into one float32 vector [boxes 4D, classes D, scores D, count]")


# ---- import ---------------------------------------------------------------------------------------
_OPTION_KEYS = {"max_detections": int, "max_classes_per_detection": int, "detections_per_class": int,
                "use_regular_nms": bool, "nms_score_threshold": float, "nms_iou_threshold": float,
                "num_classes": int, "y_scale": float, "x_scale": float, "h_scale": float, "w_scale": float}


def _options(imp, k, op):
    raw = op.CustomOptionsAsNumpy() if op.CustomOptionsLength() else None
    try:
        m = flexbuffers.Loads(bytes(raw)) if raw is not None else None
    except Exception as e:  # noqa: BLE001  (a malformed flexbuffer: named below)
        raise imp.err(f"{tfl.where(k, NAME)}: custom options are not a valid flexbuffer map ({e})") from None
    if not isinstance(m, dict):
        raise imp.err(f"{tfl.where(k, NAME)}: custom options must be a flexbuffer map of the op's parameters")
    attrs = {}
    for key, typ in _OPTION_KEYS.items():
        if key in m and m[key] is not None:
            attrs[key] = typ(m[key])
        elif ATTRS[key].default is REQUIRED:
            raise imp.err(f"{tfl.where(k, NAME)}: custom options lack {key!r}")
    return attrs


def _float_operand(imp, k, i):
    """The float32 value of input tensor i; quantised inputs are refused as TFLite Micro does (LiteRT
    dequantises uint8 ones, a type Kiln does not import as an activation)."""
    t = imp.tensors[i]
    if t["quant"] is not None or t["dtype"] != "float32":
        raise imp.err(f"{tfl.where(k, NAME)}: input {imp.label(i)} is {t['dtype']}"
                      f"{' (quantised)' if t['quant'] is not None else ''}; TFLite Micro's TFLite_Detection_PostProcess "
                      f"takes float32 inputs: dequantise them first (a DEQUANTIZE before the op, as the TFLite "
                      f"converter writes for int8 SSD models)")
    return imp.value(i, k, NAME)


@tfl.importer(NAME)
def _tfl_detection(imp, k, op, ins, outs):
    tfl.need(imp, k, NAME, ins, 3)
    if len(outs) != 4:
        raise imp.err(f"{tfl.where(k, NAME)} has {len(outs)} outputs; TFLite's op has 4 (boxes, classes, scores, count)")
    a = _options(imp, k, op)
    a.setdefault("max_classes_per_detection", 1)
    a.setdefault("use_regular_nms", False)
    a["detections"] = slots({**ATTRS_DEFAULTS, **a})
    D = a["detections"]
    want = [(1, D, 4), (1, D), (1, D), (1,)]
    for o, shape in zip(outs, want):
        got = tuple(imp.tensors[o]["shape"])
        if got != shape:
            raise imp.err(f"{tfl.where(k, NAME)}: output {imp.label(o)} has shape {list(got)}; with these options "
                          f"it must be {list(shape)}")
    xs = [_float_operand(imp, k, i) for i in ins]
    packed = imp.emit(k, NAME, "detection_postprocess", xs, a, None, name=imp._vname(imp.tensors[outs[0]]["name"] + "_packed"),
                      out_type=tt((6 * D + 1,), "float32"))
    for o, (lo, n), shape in zip(outs, [(0, 4 * D), (4 * D, D), (5 * D, D), (6 * D, 1)], want):
        sl = imp.emit(k, NAME, "slice", [packed], {"begin": [lo], "end": [lo + n], "strides": None}, None,
                      name=imp._vname(imp.tensors[o]["name"] + "_slice"), out_type=tt((n,), "float32"))
        imp.values[o] = imp.emit(k, NAME, "reshape", [sl], {"shape": list(shape)}, o)


_tfl_detection.multi_output = True
ATTRS_DEFAULTS = {k: v.default for k, v in ATTRS.items() if v.default is not REQUIRED}


# ---- export ---------------------------------------------------------------------------------------
def _segments(D):
    """(start, length, TFLite shape) of the four outputs in the packed vector."""
    return [(0, 4 * D, (1, D, 4)), (4 * D, D, (1, D)), (5 * D, D, (1, D)), (6 * D, 1, (1,))]


def _import_pattern(g, n):
    """The four reshape values (boxes, classes, scores, count) and the slice/reshape nodes that carry
    them, when the packed vector feeds exactly the slices and reshapes the importer writes; else None."""
    cons = g.consumers()
    found, nodes = {}, []
    for c in cons.get(n.name, []):
        if c.op != "slice" or c.name in g.outputs or len(c.attrs["begin"]) != 1 or len(cons.get(c.name, [])) != 1:
            return None
        r = cons[c.name][0]
        lo, hi = int(c.attrs["begin"][0]), int(c.attrs["end"][0])
        seg = [(s, ln, shp) for s, ln, shp in _segments(n.attrs["detections"]) if (s, s + ln) == (lo, hi)]
        if (r.op != "reshape" or not seg or tuple(g.types[r.name].shape) != seg[0][2]
                or c.attrs.get("strides") not in (None, [1]) or lo in found):
            return None
        found[lo] = r.name
        nodes += [c.name, r.name]
    if n.name in g.outputs or len(found) != 4:
        return None
    return [found[s] for s, _, _ in _segments(n.attrs["detections"])], nodes


@tfl.exporter("detection_postprocess")
def _tfl_export_detection(e, n, act, out, int8):
    """The custom op with its flexbuffer options and four float32 outputs. Where the packed vector
    only feeds the four slices and reshapes the importer writes, their values are the op's outputs
    and those nodes are not written (an imported model exports as it came); otherwise the outputs
    are flattened and concatenated back into the packed vector the other consumers read."""
    g, D = e.g, n.attrs["detections"]
    xs = [e.value(i) for i in n.inputs]
    opts = {k: typ(n.attrs[k]) for k, typ in _OPTION_KEYS.items()}
    pattern = _import_pattern(g, n)
    if pattern is not None:
        values, covered = pattern
        outs = [e.tensor(v, g.types[v]) for v in values]
        e.skip.update(covered)
    else:
        outs = [e.tensor(e._fresh(f"{n.name}/{what}"), TensorType(shp, "float32"))
                for what, (_, _, shp) in zip(("boxes", "classes", "scores", "count"), _segments(D))]
    e.op(NAME, xs, outs, None, False, custom_options=bytes(flexbuffers.Dumps(opts)))
    if pattern is None:
        flat = []
        for o, (_, ln, _) in zip(outs, _segments(D)):
            f = e.tensor(e._fresh(f"{n.name}/flat"), TensorType((ln,), "float32"))
            e.op("RESHAPE", [o, e.const(f"{n.name}/flat_shape", np.asarray([ln], np.int32))], [f], "ReshapeOptions",
                 NewShape=[ln])
            flat.append(f)
        e.op("CONCATENATION", flat, [e.tensor(n.name, g.types[n.name])], "ConcatenationOptions", Axis=0,
             FusedActivationFunction=0)
