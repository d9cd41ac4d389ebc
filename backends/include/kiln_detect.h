/* TFLite_Detection_PostProcess (SSD heads) for Kiln's C packages: box decoding against anchors and
 * fast or regular non-maximum suppression, as frontend/ops/detection.py (TFLite Micro's
 * kernels/detection_postprocess.cc; its comments say where LiteRT's differs). Float32 only.
 *
 * out: 6 * D + 1 floats: boxes [D][4] (ymin, xmin, ymax, xmax), classes [D], scores [D], count.
 * fw (float scratch): 4B decoded boxes, B scores, B kept scores, 2P candidate scores.
 * iw (int32 scratch): B kept indices, 2B sort buffers, B active flags, B*C sorted classes (fast),
 * 2P candidate indices; P = max_det + det_per_class (regular NMS). */
#ifndef KILN_DETECT_H
#define KILN_DETECT_H

#include <math.h>
#include <stdint.h>

#define KILN_DPP_FN static __attribute__((unused))

typedef struct {
    int32_t B, stride, NC, C, max_det, max_cls, det_per_class, regular, D;
    float score_th, iou_th, ys, xs, hs, ws;
} kiln_dpp_t;

/* a before b: the larger value first, ties by the lower position (TFLite Micro's sorts) */
static inline int kiln_dpp_before(const float *v, int32_t a, int32_t b)
{
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

/* idx[0..n) = positions 0..n-1 sorted by kiln_dpp_before (bottom-up merge sort, tmp: n ints) */
KILN_DPP_FN void kiln_dpp_sort(const float *v, int32_t n, int32_t *idx, int32_t *tmp)
{
    for (int32_t i = 0; i < n; ++i) idx[i] = i;
    for (int32_t w = 1; w < n; w *= 2) {
        for (int32_t lo = 0; lo < n; lo += 2 * w) {
            int32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int32_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi) tmp[o++] = kiln_dpp_before(v, idx[b], idx[a]) ? idx[b++] : idx[a++];
            while (a < mid) tmp[o++] = idx[a++];
            while (b < hi) tmp[o++] = idx[b++];
        }
        for (int32_t i = 0; i < n; ++i) idx[i] = tmp[i];
    }
}

KILN_DPP_FN void kiln_dpp_decode(const kiln_dpp_t *p, const float *enc, const float *anc, float *box)
{
    for (int32_t i = 0; i < p->B; ++i) {
        const float *e = enc + i * p->stride, *a = anc + 4 * i;
        float yc = (float)((double)e[0] / (double)p->ys * (double)a[2] + (double)a[0]);
        float xc = (float)((double)e[1] / (double)p->xs * (double)a[3] + (double)a[1]);
        float hh = (float)(0.5 * exp((double)e[2] / (double)p->hs) * (double)a[2]);
        float hw = (float)(0.5 * exp((double)e[3] / (double)p->ws) * (double)a[3]);
        box[4 * i] = yc - hh;
        box[4 * i + 1] = xc - hw;
        box[4 * i + 2] = yc + hh;
        box[4 * i + 3] = xc + hw;
    }
}

KILN_DPP_FN float kiln_dpp_iou(const float *box, int32_t i, int32_t j)
{
    const float *a = box + 4 * i, *b = box + 4 * j;
    const float ai = (a[2] - a[0]) * (a[3] - a[1]), aj = (b[2] - b[0]) * (b[3] - b[1]);
    if (ai <= 0 || aj <= 0) return 0.0f;
    float ih = (a[2] < b[2] ? a[2] : b[2]) - (a[0] > b[0] ? a[0] : b[0]);
    float iw = (a[3] < b[3] ? a[3] : b[3]) - (a[1] > b[1] ? a[1] : b[1]);
    const float inter = (ih > 0.0f ? ih : 0.0f) * (iw > 0.0f ? iw : 0.0f);
    return inter / (ai + aj - inter);
}

/* NonMaxSuppressionSingleClassHelper: selected box indices (at most limit) into sel; returns how many */
KILN_DPP_FN int32_t kiln_dpp_nms(const kiln_dpp_t *p, const float *box, const float *score, int32_t limit, float *keep_s,
                            int32_t *iw, int32_t *sel)
{
    int32_t *keep = iw, *order = iw + p->B, *tmp = iw + 2 * p->B, *active = iw + 3 * p->B;
    int32_t n = 0, n_sel = 0;
    for (int32_t i = 0; i < p->B; ++i)
        if (score[i] >= p->score_th) {
            keep_s[n] = score[i];
            keep[n++] = i;
        }
    kiln_dpp_sort(keep_s, n, order, tmp);
    const int32_t out = n < limit ? n : limit;
    for (int32_t i = 0; i < n; ++i) active[i] = 1;
    for (int32_t i = 0; i < n && n_sel < out; ++i) {
        if (!active[i]) continue;
        const int32_t bi = keep[order[i]];
        sel[n_sel++] = bi;
        active[i] = 0;
        for (int32_t j = i + 1; j < n; ++j)
            if (active[j] && kiln_dpp_iou(box, bi, keep[order[j]]) > p->iou_th) active[j] = 0;
    }
    return n_sel;
}

KILN_DPP_FN void kiln_dpp_put(const kiln_dpp_t *p, const float *box, int32_t slot, int32_t b, int32_t cls, float score,
                         float *out)
{
    for (int32_t t = 0; t < 4; ++t) out[4 * slot + t] = box[4 * b + t];
    out[4 * p->D + slot] = (float)cls;
    out[5 * p->D + slot] = score;
}

KILN_DPP_FN void kiln_dpp_fast(const kiln_dpp_t *p, const float *box, const float *scores, float *fw, int32_t *iw,
                          float *out)
{
    const int32_t k = p->max_cls < p->C ? p->max_cls : p->C, off = p->NC - p->C;
    float *best = fw, *keep_s = fw + p->B;
    int32_t *cls = iw + 4 * p->B, *sel = cls + p->B * p->C, *tmp = sel + p->B;
    for (int32_t b = 0; b < p->B; ++b) {
        const float *row = scores + b * p->NC + off;
        kiln_dpp_sort(row, p->C, cls + b * p->C, tmp);
        best[b] = row[cls[b * p->C]];
    }
    const int32_t n = kiln_dpp_nms(p, box, best, p->max_det, keep_s, iw, sel);
    for (int32_t s = 0; s < n; ++s)
        for (int32_t col = 0; col < k; ++col) {
            const int32_t b = sel[s], c = cls[b * p->C + col];
            kiln_dpp_put(p, box, p->max_cls * s + col, b, c, scores[b * p->NC + off + c], out);
        }
    out[6 * p->D] = (float)n;
}

KILN_DPP_FN void kiln_dpp_regular(const kiln_dpp_t *p, const float *box, const float *scores, float *fw, int32_t *iw,
                             float *out)
{
    const int32_t P = p->max_det + p->det_per_class, off = p->NC - p->C;
    float *col_s = fw, *keep_s = fw + p->B, *cand_s = fw + 2 * p->B, *new_s = cand_s + P;
    int32_t *sel = iw + 4 * p->B, *cand_b = sel + p->B, *cand_c = cand_b + P, *order = cand_c + P, *tmp = order + P;
    int32_t *new_b = tmp + P, *new_c = new_b + P;
    int32_t n = 0;
    for (int32_t c = 0; c < p->C; ++c) {
        for (int32_t b = 0; b < p->B; ++b) col_s[b] = scores[b * p->NC + off + c];
        const int32_t m = kiln_dpp_nms(p, box, col_s, p->det_per_class, keep_s, iw, sel);
        for (int32_t i = 0; i < m; ++i) {
            cand_s[n + i] = col_s[sel[i]];
            cand_b[n + i] = sel[i];
            cand_c[n + i] = c;
        }
        const int32_t total = n + m, keep = total < p->max_det ? total : p->max_det;
        kiln_dpp_sort(cand_s, total, order, tmp);
        for (int32_t i = 0; i < keep; ++i) {
            new_s[i] = cand_s[order[i]];
            new_b[i] = cand_b[order[i]];
            new_c[i] = cand_c[order[i]];
        }
        for (int32_t i = 0; i < keep; ++i) {
            cand_s[i] = new_s[i];
            cand_b[i] = new_b[i];
            cand_c[i] = new_c[i];
        }
        n = keep;
    }
    for (int32_t s = 0; s < n; ++s) kiln_dpp_put(p, box, s, cand_b[s], cand_c[s], cand_s[s], out);
    out[6 * p->D] = (float)n;
}

/* The whole op: returns 0, or -1 when a decoded box has ymin > ymax or xmin > xmax (TFLite's
 * ValidateBoxes; the output is then all zeros). */
KILN_DPP_FN int32_t kiln_detection_postprocess(const kiln_dpp_t *p, const float *enc, const float *scores,
                                               const float *anc, float *fw, int32_t *iw, float *out)
{
    for (int32_t i = 0; i < 6 * p->D + 1; ++i) out[i] = 0.0f;
    float *box = fw;
    kiln_dpp_decode(p, enc, anc, box);
    for (int32_t i = 0; i < p->B; ++i)
        if (box[4 * i] > box[4 * i + 2] || box[4 * i + 1] > box[4 * i + 3]) return -1;
    (p->regular ? kiln_dpp_regular : kiln_dpp_fast)(p, box, scores, fw + 4 * p->B, iw, out);
    return 0;
}

/* The op as one call with scalar parameters (what a generated kernel passes). */
KILN_DPP_FN int32_t kiln_dpp_run(const float *enc, const float *scores, const float *anc, float *fw, int32_t *iw,
                                 float *out, int32_t B, int32_t stride, int32_t NC, int32_t C, int32_t max_det,
                                 int32_t max_cls, int32_t det_per_class, int32_t regular, int32_t D, float score_th,
                                 float iou_th, float ys, float xs, float hs, float ws)
{
    const kiln_dpp_t p = {B, stride, NC, C, max_det, max_cls, det_per_class, regular, D,
                          score_th, iou_th, ys, xs, hs, ws};
    return kiln_detection_postprocess(&p, enc, scores, anc, fw, iw, out);
}

#endif /* KILN_DETECT_H */
