/* Kiln's Helium (MVE, Armv8.1-M M-profile Vector Extension) int8 kernels for the Cortex-M55:
 * conv2d (groups 1) as an int8 GEMM with VMLADAVA, depthwise conv with channels across the
 * vector lanes, average pooling, batch-1 FULLY_CONNECTED, ADD and MUL, and TFLite's
 * MultiplyByQuantizedMultiplier as VQRDMULH + a rounding shift. backends/ops_mve.py and
 * backends/ops_helium.py lower to them and pack their constants at compile time.
 *
 * Every kernel has a portable C version (hosts, and cores without MVE) that computes the same
 * int32 accumulators and the same requantisation, so a package compiled for the Cortex-M55 runs
 * bit-exactly on the host too; tests/backends/test_ops_mve.py checks both against the int8
 * reference (the MVE versions on the emulated mps3-an547).
 *
 * Requantisation table q (int32): per block of 4 channel slots, 16 words {bias x4, quantized
 * multiplier x4, left shift x4 (max(shift, 0)), minus the right shift x4 (min(shift, 0))}; the
 * bias has the input zero point folded in (bias - zx * sum(w)). Slot = channel, except in a
 * depthwise conv with C % 16 == 0, whose vectors hold channels {0,4,8,12}, {2,6,10,14},
 * {1,5,9,13}, {3,7,11,15} of each 16, or else C % 8 == 0: {0,2,4,6}, {1,3,5,7} of each 8
 * (kiln_mve_slot; ops_mve.requant_table permutes to match).
 * MultiplyByQuantizedMultiplier(acc, m, shift) = RoundingDivideByPOT(SRDHM(acc << left, m), right):
 * VQRDMULH is SaturatingRoundingDoublingHighMul exactly (its round-half-up of the doubled
 * product equals gemmlowp's truncating form with the 1 - 2^30 nudge, and it saturates the one
 * overflow, INT32_MIN * INT32_MIN, to INT32_MAX as gemmlowp does); VRSHL by -right rounds half
 * up, so negative values get -1 first (VQADD: INT32_MIN stays exact), which makes it
 * RoundingDivideByPOT's round-half-away-from-zero. */
#ifndef KILN_MVE_H
#define KILN_MVE_H

#include <stdint.h>

#include "kiln_intrinsics.h"   /* kiln_fc_rq: the exact FULLY_CONNECTED requantisation */

#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 1) && !defined(KILN_NO_MVE)
#include <arm_mve.h>
#define KILN_HAVE_MVE 1
#else
#define KILN_HAVE_MVE 0
#endif

/* ---- requantisation -------------------------------------------------------------------------- */
static inline int32_t kiln_mve_slot(int32_t c, int32_t perm)
{
    if (perm == 16) {
        const int32_t cc = c & 15;
        return (c & ~15) + ((((cc & 1) << 1) | ((cc >> 1) & 1)) << 2) + (cc >> 2);
    }
    return perm == 8 ? (c & ~7) + ((c & 1) << 2) + ((c & 7) >> 1) : c;
}

static inline int32_t kiln_mve_out1(int32_t acc, const int32_t *q, int32_t slot, int32_t zy, int32_t lo, int32_t hi)
{
    const int32_t *b = q + (slot >> 2) * 16 + (slot & 3);
    int32_t v = kiln_mbqm(acc + b[0], b[4], b[8], b[12]) + zy;
    return v < lo ? lo : (v > hi ? hi : v);
}

#if KILN_HAVE_MVE
/* v + zy clamped to [lo, hi]; full ([lo, hi] = [-128, 127]): saturating VQADD, VQSHL #24, VSHR #24,
 * which needs no vectors of lo and hi */
static inline int32x4_t kiln_mve_clamp(int32x4_t v, int32_t zy, int32x4_t lo, int32x4_t hi, const int full)
{
    if (full) {
        return vshrq_n_s32(vqshlq_n_s32(vqaddq_n_s32(v, zy), 24), 24);
    }
    return vminq_s32(vmaxq_s32(vaddq_n_s32(v, zy), lo), hi);
}

/* acc (bias added) of 4 slots -> MBQM with their multipliers, left shifts (VSHL only when lsh: some
 * slot has one) and minus right shifts in vectors, + zy, clamped to [lo, hi] (kiln_mve_clamp) */
static inline __attribute__((always_inline)) int32x4_t kiln_mve_rqv(int32x4_t acc, int32x4_t mult, int32x4_t lshv,
                                                                    int32x4_t rneg, const int lsh, int32_t zy,
                                                                    int32x4_t lo, int32x4_t hi, const int full)
{
    int32x4_t v = vqrdmulhq_s32(lsh ? vshlq_s32(acc, lshv) : acc, mult);
    v = vqaddq_s32(v, vshrq_n_s32(vandq_s32(v, rneg), 31));
    return kiln_mve_clamp(vrshlq_s32(v, rneg), zy, lo, hi, full);
}

/* acc (bias already added) of a block of 4 slots (qb: its 16 table words) -> int32 in [lo, hi] */
static inline int32x4_t kiln_mve_rq4(int32x4_t acc, const int32_t *qb, int32_t zy, int32_t lo, int32_t hi)
{
    const int32x4_t rneg = vld1q_s32(qb + 12);
    int32x4_t v = vqrdmulhq_s32(vshlq_s32(acc, vld1q_s32(qb + 8)), vld1q_s32(qb + 4));
    v = vqaddq_s32(v, vshrq_n_s32(vandq_s32(v, rneg), 31));
    v = vaddq_n_s32(vrshlq_s32(v, rneg), zy);
    return vminq_s32(vmaxq_s32(v, vdupq_n_s32(lo)), vdupq_n_s32(hi));
}

/* kiln_mve_rq4 without VSHL when no channel has a left shift (lsh 0), and with the clamp as
 * kiln_mve_clamp's saturating form when [lo, hi] is the whole int8 range */
static inline int32x4_t kiln_mve_rq4f(int32x4_t acc, const int32_t *qb, int32_t zy, int32_t lo, int32_t hi,
                                      int32_t lsh)
{
    const int32x4_t rneg = vld1q_s32(qb + 12);
    int32x4_t v = vqrdmulhq_s32(lsh ? vshlq_s32(acc, vld1q_s32(qb + 8)) : acc, vld1q_s32(qb + 4));
    v = vqaddq_s32(v, vshrq_n_s32(vandq_s32(v, rneg), 31));
    v = vrshlq_s32(v, rneg);
    if (lo == -128 && hi == 127) {
        return vshrq_n_s32(vqshlq_n_s32(vqaddq_n_s32(v, zy), 24), 24);
    }
    return vminq_s32(vmaxq_s32(vaddq_n_s32(v, zy), vdupq_n_s32(lo)), vdupq_n_s32(hi));
}
#endif

/* ---- conv2d (groups 1) as an int8 GEMM ---------------------------------------------------------
 * w: the (O, K) weights, O padded to Op (a multiple of 4) and K to Kp (a multiple of 16) with
 * zeros, stored per block of 4 output channels, per 16-wide chunk of the reduction, the 4
 * channels' 16 bytes (ops_mve.pack_gemm): one pointer walks a block. Per block of 4 channels and
 * pixel, per chunk: one input load, four weight loads, four VMLADAVA (64 MACs); then the four
 * sums as one vector (two VMOVs), requantised (VSHL left out when no channel has a left shift:
 * lsh 0) and stored. Reductions of at most 16 (kiln_mve_gemm_grp) take a group of P pixels per
 * block: the block's four weight vectors and its table are loaded once for the group. Longer
 * ones (kiln_mve_gemm1) take one pixel at a time, all blocks (at most 32: its two input vectors
 * loaded once for all blocks). */
#if KILN_HAVE_MVE
/* {a, b, c, d} from four general-purpose registers: VMOV Qd[2], Qd[0], Rt, Rt2 writes Rt to lane 0
 * and Rt2 to lane 2 */
static inline int32x4_t kiln_mve_vec4(int32_t a, int32_t b, int32_t c, int32_t d)
{
    int32x4_t v;
    __asm__("vmov %q0[2], %q0[0], %1, %3\n\tvmov %q0[3], %q0[1], %2, %4" : "=&w"(v) : "r"(a), "r"(b), "r"(c), "r"(d));
    return v;
}

/* one pixel's 4 outputs of the block: four VMLADAV, two VMOV, the requantisation (kiln_mve_rqv) */
static inline __attribute__((always_inline)) int32x4_t kiln_mve_grp_px(int8x16_t x, int8x16_t w0, int8x16_t w1,
                                                                       int8x16_t w2, int8x16_t w3, int32x4_t bias,
                                                                       int32x4_t mult, int32x4_t lshv, int32x4_t rneg,
                                                                       int32_t zy, int32x4_t lo, int32x4_t hi,
                                                                       const int lsh, const int full)
{
    const int32x4_t v = kiln_mve_vec4(vmladavq_s8(x, w0), vmladavq_s8(x, w1), vmladavq_s8(x, w2), vmladavq_s8(x, w3));
    return kiln_mve_rqv(vaddq_s32(v, bias), mult, lshv, rneg, lsh, zy, lo, hi, full);
}
#define KILN_MVE_GRP_PX(x) kiln_mve_grp_px(x, w0, w1, w2, w3, bias, mult, lshv, rneg, zy, vlo, vhi, lsh, full)

/* 16 < K <= 32: the same for two chunks; the block's 8 weight vectors do not fit the registers with
 * the inputs and are reloaded per pixel */
static inline __attribute__((always_inline)) void kiln_mve_gemm_grp2(const int8_t *const *a, int32_t P, int32_t Ps,
                                                                     const int8_t *w, int32_t K, int32_t O,
                                                                     const int32_t *q, int32_t zy, int32_t lo,
                                                                     int32_t hi, int8_t *y, const int lsh,
                                                                     const int full)
{
    const int32x4_t vlo = vdupq_n_s32(lo), vhi = vdupq_n_s32(hi);
    const mve_pred16_t pk = vctp8q((uint32_t)(K - 16));
    for (int32_t o = 0; o < O; o += 4, q += 16, w += 128) {
        const int32x4_t bias = vld1q_s32(q), mult = vld1q_s32(q + 4), lshv = vld1q_s32(q + 8);
        const int32x4_t rneg = vld1q_s32(q + 12);
        const mve_pred16_t po = vctp32q((uint32_t)(O - o));
        int8_t *yp = y + o;
        for (int32_t p = 0; p < P; p++, yp += O) {
            const int8x16_t x0 = vld1q_s8(a[p]), x1 = p < Ps ? vld1q_s8(a[p] + 16) : vldrbq_z_s8(a[p] + 16, pk);
            int32x4_t v = kiln_mve_vec4(vmladavaq_s8(vmladavq_s8(x0, vld1q_s8(w)), x1, vld1q_s8(w + 64)),
                                        vmladavaq_s8(vmladavq_s8(x0, vld1q_s8(w + 16)), x1, vld1q_s8(w + 80)),
                                        vmladavaq_s8(vmladavq_s8(x0, vld1q_s8(w + 32)), x1, vld1q_s8(w + 96)),
                                        vmladavaq_s8(vmladavq_s8(x0, vld1q_s8(w + 48)), x1, vld1q_s8(w + 112)));
            v = kiln_mve_rqv(vaddq_s32(v, bias), mult, lshv, rneg, lsh, zy, vlo, vhi, full);
            if (O - o >= 4) {
                vstrbq_s32(yp, v);
            } else {
                vstrbq_p_s32(yp, v, po);
            }
        }
    }
}

/* K <= 16: P pixels (a[p]: their K input bytes; y: their P x O outputs), block by block. The first
 * Ps pixels may read 16 bytes (the lanes past K meet zero weights); the others load K bytes. */
static inline __attribute__((always_inline)) void kiln_mve_gemm_grp(const int8_t *const *a, int32_t P, int32_t Ps,
                                                                    const int8_t *w, int32_t K, int32_t O,
                                                                    const int32_t *q, int32_t zy, int32_t lo,
                                                                    int32_t hi, int8_t *y, const int lsh,
                                                                    const int full)
{
    const int32x4_t vlo = vdupq_n_s32(lo), vhi = vdupq_n_s32(hi);
    const mve_pred16_t pk = vctp8q((uint32_t)K);
    for (int32_t o = 0; o < O; o += 4, q += 16, w += 64) {
        const int8x16_t w0 = vld1q_s8(w), w1 = vld1q_s8(w + 16), w2 = vld1q_s8(w + 32), w3 = vld1q_s8(w + 48);
        const int32x4_t bias = vld1q_s32(q), mult = vld1q_s32(q + 4), lshv = vld1q_s32(q + 8), rneg = vld1q_s32(q + 12);
        int8_t *yp = y + o;
        int32_t p = 0;
        if (O - o >= 4) {
            for (; p < Ps; p++, yp += O) {
                vstrbq_s32(yp, KILN_MVE_GRP_PX(vld1q_s8(a[p])));
            }
        }
        const mve_pred16_t po = vctp32q((uint32_t)(O - o));
        for (; p < P; p++, yp += O) {
            const int8x16_t x = p < Ps ? vld1q_s8(a[p]) : vldrbq_z_s8(a[p], pk);
            vstrbq_p_s32(yp, KILN_MVE_GRP_PX(x), po);
        }
    }
}
#undef KILN_MVE_GRP_PX

#endif

/* K > 16 (and every K without MVE): one pixel (a: its K input bytes), all blocks */
#if KILN_HAVE_MVE
static inline void kiln_mve_store4(int8_t *y, int32x4_t v, int32_t left)
{
    if (left >= 4) {
        vstrbq_s32(y, v);
    } else {
        vstrbq_p_s32(y, v, vctp32q((uint32_t)left));
    }
}

/* kiln_mve_gemm1 for K <= 32: the pixel's (at most) two input vectors are loaded once for all
 * channel blocks */
static inline void kiln_mve_gemm1_small(const int8_t *a, const int8_t *w, int32_t K, int32_t O, const int32_t *q,
                                        int32_t zy, int32_t lo, int32_t hi, int32_t lsh, int8_t *y)
{
    const int8x16_t x0 = vldrbq_z_s8(a, vctp8q((uint32_t)K));
    if (K <= 16) {
        for (int32_t o = 0; o < O; o += 4, q += 16, w += 64) {
            int32x4_t v = vdupq_n_s32(vmladavq_s8(x0, vld1q_s8(w)));
            v = vsetq_lane_s32(vmladavq_s8(x0, vld1q_s8(w + 16)), v, 1);
            v = vsetq_lane_s32(vmladavq_s8(x0, vld1q_s8(w + 32)), v, 2);
            v = vsetq_lane_s32(vmladavq_s8(x0, vld1q_s8(w + 48)), v, 3);
            kiln_mve_store4(y + o, kiln_mve_rq4f(vaddq_s32(v, vld1q_s32(q)), q, zy, lo, hi, lsh), O - o);
        }
        return;
    }
    const int8x16_t x1 = vldrbq_z_s8(a + 16, vctp8q((uint32_t)(K - 16)));
    for (int32_t o = 0; o < O; o += 4, q += 16, w += 128) {
        int32x4_t v = vdupq_n_s32(vmladavaq_s8(vmladavq_s8(x0, vld1q_s8(w)), x1, vld1q_s8(w + 64)));
        v = vsetq_lane_s32(vmladavaq_s8(vmladavq_s8(x0, vld1q_s8(w + 16)), x1, vld1q_s8(w + 80)), v, 1);
        v = vsetq_lane_s32(vmladavaq_s8(vmladavq_s8(x0, vld1q_s8(w + 32)), x1, vld1q_s8(w + 96)), v, 2);
        v = vsetq_lane_s32(vmladavaq_s8(vmladavq_s8(x0, vld1q_s8(w + 48)), x1, vld1q_s8(w + 112)), v, 3);
        kiln_mve_store4(y + o, kiln_mve_rq4f(vaddq_s32(v, vld1q_s32(q)), q, zy, lo, hi, lsh), O - o);
    }
}
#endif

static void kiln_mve_gemm1(const int8_t *a, const int8_t *w, int32_t K, int32_t O, const int32_t *q, int32_t zy,
                           int32_t lo, int32_t hi, int32_t lsh, int8_t *y)
{
#if KILN_HAVE_MVE
    if (K <= 32) {
        kiln_mve_gemm1_small(a, w, K, O, q, zy, lo, hi, lsh, y);
        return;
    }
    const int32_t kfull = K >> 4, ktail = K & 15;
    const mve_pred16_t pk = vctp8q((uint32_t)ktail);
    for (int32_t o = 0; o < O; o += 4, q += 16) {
        const int8_t *p = a;
        int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int32_t k = 0; k < kfull; k++) {
            const int8x16_t xv = vld1q_s8(p);
            p += 16;
            s0 = vmladavaq_s8(s0, xv, vld1q_s8(w));
            s1 = vmladavaq_s8(s1, xv, vld1q_s8(w + 16));
            s2 = vmladavaq_s8(s2, xv, vld1q_s8(w + 32));
            s3 = vmladavaq_s8(s3, xv, vld1q_s8(w + 48));
            w += 64;
        }
        if (ktail) {
            const int8x16_t xv = vldrbq_z_s8(p, pk);
            s0 = vmladavaq_s8(s0, xv, vld1q_s8(w));
            s1 = vmladavaq_s8(s1, xv, vld1q_s8(w + 16));
            s2 = vmladavaq_s8(s2, xv, vld1q_s8(w + 32));
            s3 = vmladavaq_s8(s3, xv, vld1q_s8(w + 48));
            w += 64;
        }
        const int32x4_t v = kiln_mve_vec4(s0, s1, s2, s3);
        kiln_mve_store4(y + o, kiln_mve_rq4f(vaddq_s32(v, vld1q_s32(q)), q, zy, lo, hi, lsh), O - o);
    }
#else
    (void)lsh;
    const int32_t kc = (K + 15) >> 4;
    for (int32_t o = 0; o < O; o++) {
        const int8_t *wb = w + (o >> 2) * (kc << 6) + (o & 3) * 16;
        int32_t s = 0;
        for (int32_t k = 0; k < K; k++) {
            s += (int32_t)a[k] * wb[(k >> 4) * 64 + (k & 15)];
        }
        y[o] = (int8_t)kiln_mve_out1(s, q, o, zy, lo, hi);
    }
#endif
}

/* copy n bytes / fill n bytes with v: whole 16-byte vectors, then one predicated one */
static inline void kiln_mve_copy(int8_t *d, const int8_t *s, int32_t n)
{
#if KILN_HAVE_MVE
    for (; n >= 16; n -= 16, d += 16, s += 16) {
        vst1q_s8(d, vld1q_s8(s));
    }
    if (n > 0) {
        const mve_pred16_t p = vctp8q((uint32_t)n);
        vstrbq_p_s8(d, vldrbq_z_s8(s, p), p);
    }
#else
    for (int32_t i = 0; i < n; i++) {
        d[i] = s[i];
    }
#endif
}

static inline void kiln_mve_fill(int8_t *d, int8_t v, int32_t n)
{
#if KILN_HAVE_MVE
    const int8x16_t vv = vdupq_n_s8(v);
    for (; n >= 16; n -= 16, d += 16) {
        vst1q_s8(d, vv);
    }
    if (n > 0) {
        vstrbq_p_s8(d, vv, vctp8q((uint32_t)n));
    }
#else
    for (int32_t i = 0; i < n; i++) {
        d[i] = v;
    }
#endif
}

/* The patch (im2col row) of output pixel (i, j): KH x KW x C bytes, taps outside the input hold
 * the input zero point zx (they add zx * w, which the folded bias takes back: TFLite's padding). */
static inline const int8_t *kiln_mve_patch(const int8_t *x, int32_t H, int32_t W, int32_t C, int32_t KH, int32_t KW,
                                           int32_t sh, int32_t sw, int32_t pt, int32_t pl, int32_t i, int32_t j,
                                           int32_t zx, int8_t *patch, int32_t direct)
{
    const int32_t ih0 = i * sh - pt, iw0 = j * sw - pl, row = KW * C;
    if (direct) {
        return x + (ih0 * W + iw0) * C;
    }
    int8_t *d = patch;
#if KILN_HAVE_MVE
    if (row <= 16) {
        /* rows of at most 16 bytes: the in-bounds span of every row is the same, one predicated
         * copy each (after a fill with zx when the span is cut by the left or right edge) */
        const int32_t a = iw0 < 0 ? 0 : iw0, b = iw0 + KW > W ? W : iw0 + KW;
        const int32_t off = (a - iw0) * C, span = b > a ? (b - a) * C : 0;
        const mve_pred16_t pr = vctp8q((uint32_t)row), ps = vctp8q((uint32_t)span);
        const int8x16_t zv = vdupq_n_s8((int8_t)zx);
        for (int32_t kh = 0; kh < KH; kh++, d += row) {
            const int32_t ih = ih0 + kh;
            if (ih < 0 || ih >= H || span != row) {
                vstrbq_p_s8(d, zv, pr);
            }
            if (ih >= 0 && ih < H) {
                vstrbq_p_s8(d + off, vldrbq_z_s8(x + (ih * W + a) * C, ps), ps);
            }
        }
        return patch;
    }
#endif
    for (int32_t kh = 0; kh < KH; kh++, d += row) {
        const int32_t ih = ih0 + kh;
        if (ih < 0 || ih >= H) {
            kiln_mve_fill(d, (int8_t)zx, row);
        } else if (iw0 >= 0 && iw0 + KW <= W) {
            kiln_mve_copy(d, x + (ih * W + iw0) * C, row);
        } else {                      /* a row cut by the left or right edge: fill, then copy its span */
            const int32_t a = iw0 < 0 ? 0 : iw0, b = iw0 + KW > W ? W : iw0 + KW;
            kiln_mve_fill(d, (int8_t)zx, row);
            if (b > a) {
                kiln_mve_copy(d + (a - iw0) * C, x + (ih * W + a) * C, (b - a) * C);
            }
        }
    }
    return patch;
}

/* a 1x1 conv without padding whose pixels all lie inside the input: the input pixel is the reduction
 * (read in place, no patch) */
static inline int32_t kiln_mve_direct(int32_t H, int32_t W, int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt,
                                      int32_t pl, int32_t oh, int32_t ow)
{
    return KH == 1 && KW == 1 && pt == 0 && pl == 0 && (oh - 1) * sh < H && (ow - 1) * sw < W;
}

#define KILN_MVE_GROUP 16      /* the largest group of kiln_mve_conv_s8 (ops_mve.GEMM_GROUP) */

#if KILN_HAVE_MVE
/* kiln_mve_gemm_grp for one group, VSHL left in (lsh) or out, the clamp of [-128, 127] or not */
static __attribute__((noinline)) void kiln_mve_gemm_grp_call(const int8_t *const *a, int32_t P, int32_t Ps,
                                                             const int8_t *w, int32_t K, int32_t O, const int32_t *q,
                                                             int32_t zy, int32_t lo, int32_t hi, int8_t *y,
                                                             int32_t lsh)
{
    const int full = lo == -128 && hi == 127;
    if (lsh) {
        if (full) {
            kiln_mve_gemm_grp(a, P, Ps, w, K, O, q, zy, lo, hi, y, 1, 1);
        } else {
            kiln_mve_gemm_grp(a, P, Ps, w, K, O, q, zy, lo, hi, y, 1, 0);
        }
    } else if (full) {
        kiln_mve_gemm_grp(a, P, Ps, w, K, O, q, zy, lo, hi, y, 0, 1);
    } else {
        kiln_mve_gemm_grp(a, P, Ps, w, K, O, q, zy, lo, hi, y, 0, 0);
    }
}
#endif

/* One image of an int8 conv2d (groups 1, dilation 1): per output pixel, its patch (none for a 1x1
 * conv without padding: the input pixel is the reduction) and kiln_mve_gemm1. patch: K bytes of
 * scratch. */
static __attribute__((noinline, unused)) void kiln_mve_conv_s8(
    const int8_t *x, int32_t H, int32_t W, int32_t C, int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt,
    int32_t pl, int32_t oh, int32_t ow, int32_t zx, int8_t *patch, const int8_t *w, int32_t O, const int32_t *q,
    int32_t zy, int32_t lo, int32_t hi, int32_t lsh, int8_t *y)
{
    const int32_t K = KH * KW * C;
    const int32_t direct = kiln_mve_direct(H, W, KH, KW, sh, sw, pt, pl, oh, ow);
    for (int32_t i = 0; i < oh; i++) {
        for (int32_t j = 0; j < ow; j++, y += O) {
            const int8_t *a = kiln_mve_patch(x, H, W, C, KH, KW, sh, sw, pt, pl, i, j, zx, patch, direct);
            kiln_mve_gemm1(a, w, K, O, q, zy, lo, hi, lsh, y);
        }
    }
}

#if KILN_HAVE_MVE
/* kiln_mve_gemm_grp2 for one group (the common case without left shifts and with the whole int8
 * range specialised) */
static __attribute__((noinline)) void kiln_mve_gemm_grp2_call(const int8_t *const *a, int32_t P, int32_t Ps,
                                                              const int8_t *w, int32_t K, int32_t O, const int32_t *q,
                                                              int32_t zy, int32_t lo, int32_t hi, int8_t *y,
                                                              int32_t lsh)
{
    if (!lsh && lo == -128 && hi == 127) {
        kiln_mve_gemm_grp2(a, P, Ps, w, K, O, q, zy, lo, hi, y, 0, 1);
    } else {
        kiln_mve_gemm_grp2(a, P, Ps, w, K, O, q, zy, lo, hi, y, 1, 0);
    }
}
#endif

/* One image of an int8 conv2d (groups 1, dilation 1) with K = KH x KW x C <= 32, in raster order:
 * per group of KILN_MVE_GROUP pixels their patches (none for a 1x1 conv without padding: the input
 * pixel is the reduction), then kiln_mve_gemm_grp. patch: KILN_MVE_GROUP x K + 32 bytes of scratch
 * (unused when direct), so every patch may be read as whole 16-byte chunks; in place, only the
 * pixels whose chunks end inside the input. lsh: some channel has a left shift. */
#if KILN_HAVE_MVE
/* a 1x1 conv without padding: the group's pixels are read in place, 16-byte chunks only where they
 * end inside the input (xend) */
static __attribute__((noinline)) void kiln_mve_conv_grp_direct(const int8_t *x, const int8_t *xend, int32_t W,
                                                               int32_t C, int32_t sh, int32_t sw, int32_t oh,
                                                               int32_t ow, const int8_t *w, int32_t K, int32_t O,
                                                               const int32_t *q, int32_t zy, int32_t lo, int32_t hi,
                                                               int32_t lsh, int8_t *y)
{
    const int32_t npix = oh * ow;
    const int8_t *a[KILN_MVE_GROUP];
    int32_t i = 0, j = 0;
    for (int32_t n = 0; n < npix; n += KILN_MVE_GROUP, y += KILN_MVE_GROUP * O) {
        const int32_t P = npix - n < KILN_MVE_GROUP ? npix - n : KILN_MVE_GROUP;
        for (int32_t p = 0; p < P; p++) {
            a[p] = x + (i * sh * W + j * sw) * C;
            if (++j == ow) {
                j = 0;
                i++;
            }
        }
        int32_t Ps = P;
        while (Ps > 0 && a[Ps - 1] + (K > 16 ? 32 : 16) > xend) {
            Ps--;
        }
        if (K > 16) {
            kiln_mve_gemm_grp2_call(a, P, Ps, w, K, O, q, zy, lo, hi, y, lsh);
        } else {
            kiln_mve_gemm_grp_call(a, P, Ps, w, K, O, q, zy, lo, hi, y, lsh);
        }
    }
}
#endif

static __attribute__((noinline, unused)) void kiln_mve_conv_grp_s8(
    const int8_t *x, int32_t H, int32_t W, int32_t C, int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt,
    int32_t pl, int32_t oh, int32_t ow, int32_t zx, int8_t *patch, const int8_t *w, int32_t O, const int32_t *q,
    int32_t zy, int32_t lo, int32_t hi, int32_t lsh, int8_t *y)
{
    const int32_t K = KH * KW * C, npix = oh * ow;
    const int32_t direct = kiln_mve_direct(H, W, KH, KW, sh, sw, pt, pl, oh, ow);
#if KILN_HAVE_MVE
    if (direct) {
        kiln_mve_conv_grp_direct(x, x + H * W * C, W, C, sh, sw, oh, ow, w, K, O, q, zy, lo, hi, lsh, y);
        return;
    }
#endif
    const int8_t *a[KILN_MVE_GROUP];
    int32_t i = 0, j = 0;
    for (int32_t n = 0; n < npix; n += KILN_MVE_GROUP, y += KILN_MVE_GROUP * O) {
        const int32_t P = npix - n < KILN_MVE_GROUP ? npix - n : KILN_MVE_GROUP;
        for (int32_t p = 0; p < P; p++) {
            a[p] = kiln_mve_patch(x, H, W, C, KH, KW, sh, sw, pt, pl, i, j, zx, patch + p * K, direct);
            if (++j == ow) {
                j = 0;
                i++;
            }
        }
#if KILN_HAVE_MVE
        if (K > 16) {      /* patches: padded, every chunk may be read whole */
            kiln_mve_gemm_grp2_call(a, P, P, w, K, O, q, zy, lo, hi, y, lsh);
        } else {
            kiln_mve_gemm_grp_call(a, P, P, w, K, O, q, zy, lo, hi, y, lsh);
        }
#else
        (void)lsh;
        for (int32_t p = 0; p < P; p++) {
            kiln_mve_gemm1(a[p], w, K, O, q, zy, lo, hi, lsh, y + p * O);
        }
#endif
    }
}


/* ---- depthwise conv2d (depth multiplier 1) -------------------------------------------------------
 * w: (KH * KW, C) int8 (channels contiguous per tap), q: the requantisation table above (the
 * bias with zx * sum over all taps folded in). Per output pixel, its tap pointers (a tap outside
 * the input points at zrow, C bytes of zx, so every tap adds (x - zx) * w exactly as TFLite's
 * padding does), then per block of 4 channels one int32 accumulator vector: per tap two
 * widening loads, VMUL, VADD. pair (C = 8, stride 1 along W): two neighbouring pixels inside the
 * input are computed as one pixel of 16 channels, with the weights (T x 16) and table (16 slots)
 * for it stored after the others. */
#define KILN_MVE_DW_MAX_TAPS 64
#if KILN_HAVE_MVE
/* one output pixel of a depthwise conv with C % 16 == 0: per 16 channels and tap, two loads,
 * VMULLB/VMULLT.S8 (exact int16 products of the even / odd channels) and four widening adds into
 * accumulators holding channels {0,4,8,12}, {2,6,10,14}, {1,5,9,13}, {3,7,11,15}; the table is
 * in that order (kiln_mve_slot), the stores scatter the bytes back to channel order. */
static inline void kiln_mve_dw16(const int8_t *base, const int32_t *toff, int32_t T, const int8_t *w, int32_t C, const int32_t *q,
                                 int32_t zy, int32_t lo, int32_t hi, int32_t lsh, int8_t *y)
{
    const uint32x4_t off = vidupq_n_u32(0, 4);
    for (int32_t c = 0; c < C; c += 16, q += 64) {
        int32x4_t a0 = vld1q_s32(q), a1 = vld1q_s32(q + 16), a2 = vld1q_s32(q + 32), a3 = vld1q_s32(q + 48);
        const int8_t *wp = w + c;
        for (int32_t t = 0; t < T; t++, wp += C) {
            const int8x16_t xv = vld1q_s8(base + toff[t] + c), wv = vld1q_s8(wp);
            const int16x8_t pe = vmullbq_int_s8(xv, wv), po = vmulltq_int_s8(xv, wv);
            a0 = vaddq_s32(a0, vmovlbq_s16(pe));
            a1 = vaddq_s32(a1, vmovltq_s16(pe));
            a2 = vaddq_s32(a2, vmovlbq_s16(po));
            a3 = vaddq_s32(a3, vmovltq_s16(po));
        }
        vstrbq_scatter_offset_s32(y + c, off, kiln_mve_rq4f(a0, q, zy, lo, hi, lsh));
        vstrbq_scatter_offset_s32(y + c + 2, off, kiln_mve_rq4f(a1, q + 16, zy, lo, hi, lsh));
        vstrbq_scatter_offset_s32(y + c + 1, off, kiln_mve_rq4f(a2, q + 32, zy, lo, hi, lsh));
        vstrbq_scatter_offset_s32(y + c + 3, off, kiln_mve_rq4f(a3, q + 48, zy, lo, hi, lsh));
    }
}

/* the same with C % 8 == 0: per 8 channels and tap, two widening loads to int16 and VMULLB/VMULLT.S16
 * into accumulators of channels {0,2,4,6} and {1,3,5,7} */
static inline void kiln_mve_dw8(const int8_t *base, const int32_t *toff, int32_t T, const int8_t *w, int32_t C, const int32_t *q,
                                int32_t zy, int32_t lo, int32_t hi, int32_t lsh, int8_t *y)
{
    const uint32x4_t off = vidupq_n_u32(0, 2);
    for (int32_t c = 0; c < C; c += 8, q += 32) {
        int32x4_t a0 = vld1q_s32(q), a1 = vld1q_s32(q + 16);
        const int8_t *wp = w + c;
        for (int32_t t = 0; t < T; t++, wp += C) {
            const int16x8_t xv = vldrbq_s16(base + toff[t] + c), wv = vldrbq_s16(wp);
            a0 = vaddq_s32(a0, vmullbq_int_s16(xv, wv));
            a1 = vaddq_s32(a1, vmulltq_int_s16(xv, wv));
        }
        vstrbq_scatter_offset_s32(y + c, off, kiln_mve_rq4f(a0, q, zy, lo, hi, lsh));
        vstrbq_scatter_offset_s32(y + c + 1, off, kiln_mve_rq4f(a1, q + 16, zy, lo, hi, lsh));
    }
}
#endif

#if KILN_HAVE_MVE
/* one output pixel through kiln_mve_dw16 (perm 16) or kiln_mve_dw8 (perm 8): 1; else 0 (the 4-lane loop) */
static inline __attribute__((always_inline)) int kiln_mve_dw_vec(const int8_t *base, const int32_t *toff, int32_t T,
                                                                 const int8_t *w, int32_t C, const int32_t *q,
                                                                 int32_t zy, int32_t lo, int32_t hi, int32_t lsh,
                                                                 int32_t perm, int8_t *y)
{
    if (perm == 16) {
        kiln_mve_dw16(base, toff, T, w, C, q, zy, lo, hi, lsh, y);
        return 1;
    }
    if (perm == 8) {
        kiln_mve_dw8(base, toff, T, w, C, q, zy, lo, hi, lsh, y);
        return 1;
    }
    return 0;
}
#endif

static __attribute__((noinline, unused)) void kiln_mve_dw_s8(
    const int8_t *x, int32_t H, int32_t W, int32_t C, int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt,
    int32_t pl, int32_t dh, int32_t dw, int32_t oh, int32_t ow, int32_t zx, int8_t *zrow, const int8_t *w,
    const int32_t *q, int32_t zy, int32_t lo, int32_t hi, int32_t pair, int32_t lsh, int8_t *y)
{
    const int8_t *tap[KILN_MVE_DW_MAX_TAPS];
    int32_t toff[KILN_MVE_DW_MAX_TAPS], boff[KILN_MVE_DW_MAX_TAPS];
    /* taps as offsets from x (the MVE kernels read base + off[t]); a tap outside reads zrow */
    const int32_t zoff = (int32_t)((intptr_t)zrow - (intptr_t)x);
    (void)pair, (void)lsh, (void)boff;
    const int32_t T = KH * KW, perm = (C & 15) == 0 ? 16 : ((C & 7) == 0 ? 8 : 0);
    for (int32_t kh = 0, t = 0; kh < KH; kh++) {
        for (int32_t kw = 0; kw < KW; kw++, t++) {
            toff[t] = (kh * dh * W + kw * dw) * C;
        }
    }
    kiln_mve_fill(zrow, (int8_t)zx, C);
    for (int32_t i = 0; i < oh; i++) {
        for (int32_t j = 0; j < ow; j++, y += C) {
            const int32_t ih0 = i * sh - pt, iw0 = j * sw - pl;
            if (ih0 >= 0 && ih0 + (KH - 1) * dh < H && iw0 >= 0 && iw0 + (KW - 1) * dw < W) {
                const int8_t *xb = x + (ih0 * W + iw0) * C;     /* every tap inside */
#if KILN_HAVE_MVE
                if (pair && j + 1 < ow && iw0 + 1 + (KW - 1) * dw < W) {
                    /* C = 8, stride 1 along W: this pixel and the next one, both inside, as one
                     * pixel of 16 channels (their taps and outputs are adjacent); weights and
                     * table for it follow the others (ops_mve.lower_depthwise_mve) */
                    kiln_mve_dw16(xb, toff, T, w + T * C, 16, q + 4 * C, zy, lo, hi, lsh, y);
                    j++;
                    y += C;
                    continue;
                }
                if (kiln_mve_dw_vec(xb, toff, T, w, C, q, zy, lo, hi, lsh, perm, y)) {
                    continue;
                }
#endif
                for (int32_t t = 0; t < T; t++) {
                    tap[t] = xb + toff[t];
                }
            } else {
                for (int32_t kh = 0, t = 0; kh < KH; kh++) {
                    const int32_t ih = ih0 + kh * dh;
                    for (int32_t kw = 0; kw < KW; kw++, t++) {
                        const int32_t iw = iw0 + kw * dw;
                        const int32_t in = ih >= 0 && ih < H && iw >= 0 && iw < W;
                        tap[t] = in ? x + (ih * W + iw) * C : zrow;
                        boff[t] = in ? (ih * W + iw) * C : zoff;
                    }
                }
#if KILN_HAVE_MVE
                if (kiln_mve_dw_vec(x, boff, T, w, C, q, zy, lo, hi, lsh, perm, y)) {
                    continue;
                }
#endif
            }
#if KILN_HAVE_MVE
            for (int32_t c = 0; c < C; c += 4) {
                const mve_pred16_t pc = vctp32q((uint32_t)(C - c));
                const int32_t *qb = q + 4 * c;
                int32x4_t acc = vld1q_s32(qb);
                const int8_t *wp = w + c;
                for (int32_t t = 0; t < T; t++, wp += C) {
                    acc = vaddq_s32(acc, vmulq_s32(vldrbq_z_s32(tap[t] + c, pc), vldrbq_z_s32(wp, pc)));
                }
                vstrbq_p_s32(y + c, kiln_mve_rq4(acc, qb, zy, lo, hi), pc);
            }
#else
            for (int32_t c = 0; c < C; c++) {
                int32_t s = 0;
                for (int32_t t = 0; t < T; t++) {
                    s += (int32_t)tap[t][c] * w[t * C + c];
                }
                y[c] = (int8_t)kiln_mve_out1(s, q, kiln_mve_slot(c, perm), zy, lo, hi);
            }
#endif
        }
    }
}

/* ---- int8 average pooling ---------------------------------------------------------------------
 * TFLite's int8 AveragePool: per output pixel the sum of its in-image taps (padding excluded)
 * divided by their count, rounding half away from zero, clamped to [lo, hi]. The sums of 8
 * channels accumulate in int16 lanes (ops_mve allows at most 256 taps, so |sum| <= 32768 fits),
 * one widening load and one add per tap; sum: C (rounded up to 8) int16 of scratch. */
static __attribute__((noinline, unused)) void kiln_mve_avgpool_s8(
    const int8_t *x, int32_t H, int32_t W, int32_t C, int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt,
    int32_t pl, int32_t oh, int32_t ow, int16_t *sum, int32_t lo, int32_t hi, int8_t *y)
{
    for (int32_t i = 0; i < oh; i++) {
        for (int32_t j = 0; j < ow; j++, y += C) {
            const int32_t h0 = i * sh - pt, w0 = j * sw - pl;
            const int32_t ha = h0 < 0 ? 0 : h0, hb = h0 + KH > H ? H : h0 + KH;
            const int32_t wa = w0 < 0 ? 0 : w0, wb = w0 + KW > W ? W : w0 + KW;
            const int32_t cnt = (hb - ha) * (wb - wa);
            for (int32_t c = 0; c < C; c += 8) {
#if KILN_HAVE_MVE
                const mve_pred16_t p = vctp16q((uint32_t)(C - c));
                int16x8_t acc = vdupq_n_s16(0);
                for (int32_t h = ha; h < hb; h++) {
                    const int8_t *px = x + (h * W + wa) * C + c;
                    for (int32_t w = wa; w < wb; w++, px += C) {
                        acc = vaddq_s16(acc, vldrbq_z_s16(px, p));
                    }
                }
                vst1q_s16(sum + c, acc);
#else
                for (int32_t cc = c; cc < c + 8 && cc < C; cc++) {
                    int32_t a = 0;
                    for (int32_t h = ha; h < hb; h++) {
                        for (int32_t w = wa; w < wb; w++) {
                            a += x[(h * W + w) * C + cc];
                        }
                    }
                    sum[cc] = (int16_t)a;
                }
#endif
            }
            for (int32_t c = 0; c < C; c++) {
                const int32_t a = sum[c];
                int32_t v = a > 0 ? (a + cnt / 2) / cnt : (a - cnt / 2) / cnt;
                y[c] = (int8_t)(v < lo ? lo : (v > hi ? hi : v));
            }
        }
    }
}

/* ---- batch-1 int8 FULLY_CONNECTED ----------------------------------------------------------------
 * y[r, n] = requant(bias[n] + sum_k x[r, k] * W[n, k]) for r < rows. w: W in the layout of
 * kiln_mve_conv_s8 (ops_mve.pack_gemm: blocks of 4 output rows, 16-wide chunks), bias: int32 [Np]
 * (Np = N rounded up to 4) with the input zero point folded in (bias - zx * sum(W[n]), modulo
 * 2^32), so the kernel multiplies the raw int8 input: per block of 4 output rows and chunk one
 * input load, four weight loads and four VMLADAVA (64 MACs), the K % 16 tail as one predicated
 * load. Requantisation is LiteRT's reference FULLY_CONNECTED, round(double(acc) * eff) + zy,
 * clamped to [lo, hi] (docs/int8_ir.md), with the fast path of kiln_dense.h in vector form:
 * m = floor(eff * 2^32) per row (int32 [Np], or one when mstep is 0), p = acc * m as VMULH (high
 * word) and VMUL (low word); where the low word of p + 2^31 is at least G away from a multiple of
 * 2^32 (c1 = 2^31 + G, c2 = 2^32 - 2G: VSUB and an unsigned VCMP, all four lanes at once), the high
 * word plus the carry of the rounding half is the answer; a lane that is not (probability about
 * 2G / 2^32; c2 = 0: every lane) takes kiln_fc_rq (rq: {mh, ml, s} per row, or one). */
#if KILN_HAVE_MVE
/* the 4 dot products of one block of ops_mve.pack_gemm weights (4 rows, kc 16-byte chunks) with the
 * K input bytes at x: kc - 1 whole chunks, then the last one predicated; *wb moves past the block */
static inline __attribute__((always_inline)) int32x4_t kiln_mve_dot4(const int8_t *x, const int8_t **wb, int32_t K,
                                                                     int32_t kc)
{
    const int8_t *w = *wb, *p = x;
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int32_t k = 1; k < kc; k++, p += 16, w += 64) {
        const int8x16_t xv = vld1q_s8(p);
        s0 = vmladavaq_s8(s0, xv, vld1q_s8(w));
        s1 = vmladavaq_s8(s1, xv, vld1q_s8(w + 16));
        s2 = vmladavaq_s8(s2, xv, vld1q_s8(w + 32));
        s3 = vmladavaq_s8(s3, xv, vld1q_s8(w + 48));
    }
    const int8x16_t xv = vldrbq_z_s8(p, vctp8q((uint32_t)(K - ((kc - 1) << 4))));
    s0 = vmladavaq_s8(s0, xv, vld1q_s8(w));
    s1 = vmladavaq_s8(s1, xv, vld1q_s8(w + 16));
    s2 = vmladavaq_s8(s2, xv, vld1q_s8(w + 32));
    s3 = vmladavaq_s8(s3, xv, vld1q_s8(w + 48));
    *wb = w + 64;
    return kiln_mve_vec4(s0, s1, s2, s3);
}
#endif

static inline int32_t kiln_mve_fc_rq1(int32_t acc, int32_t m, const int32_t *rq, uint32_t c1, uint32_t c2)
{
    const int64_t p = (int64_t)acc * m;
    const uint32_t plo = (uint32_t)p;
    if ((uint32_t)(plo - c1) < c2) {
        return (int32_t)(p >> 32) + (int32_t)(plo >> 31);
    }
    const int32_t q = kiln_fc_rq(acc, (uint32_t)rq[0], (uint32_t)rq[1], rq[2]);
    return q > 65536 ? 65536 : (q < -65536 ? -65536 : q);       /* every output beyond clamps alike */
}

static __attribute__((noinline, unused)) void kiln_mve_fc_s8(const int8_t *x, int32_t rows, int32_t K, int32_t N,
                                                             const int8_t *w, const int32_t *bias, const int32_t *m,
                                                             const int32_t *rq, int32_t mstep, uint32_t c1,
                                                             uint32_t c2, int32_t zy, int32_t lo, int32_t hi,
                                                             int8_t *y)
{
    const int32_t kc = (K + 15) >> 4;
    for (int32_t r = 0; r < rows; r++, x += K, y += N) {
        const int8_t *wb = w;
        for (int32_t n = 0; n < N; n += 4) {
            const int32_t nv = N - n < 4 ? N - n : 4;
            int32_t acc[4];
#if KILN_HAVE_MVE
            const int32x4_t a = vaddq_s32(kiln_mve_dot4(x, &wb, K, kc), vld1q_s32(bias + n));
            const int32x4_t mv = mstep ? vld1q_s32(m + n) : vdupq_n_s32(m[0]);
            const uint32x4_t plo = vreinterpretq_u32_s32(vmulq_s32(a, mv));
            int32x4_t v = vaddq_s32(vmulhq_s32(a, mv), vreinterpretq_s32_u32(vshrq_n_u32(plo, 31)));
            const mve_pred16_t ok = vcmphiq_u32(vdupq_n_u32(c2), vsubq_u32(plo, vdupq_n_u32(c1)));
            if (__builtin_expect((ok & 0x1111) != 0x1111, 0)) {     /* a lane near a half: exact */
                int32_t q[4];
                vst1q_s32(acc, a);
                vst1q_s32(q, v);
                for (int32_t j = 0; j < nv; j++) {
                    if (!((ok >> (4 * j)) & 1)) {
                        q[j] = kiln_mve_fc_rq1(acc[j], m[mstep * (n + j)], rq + 3 * mstep * (n + j), c1, 0);
                    }
                }
                v = vld1q_s32(q);
            }
            v = vminq_s32(vmaxq_s32(vaddq_n_s32(v, zy), vdupq_n_s32(lo)), vdupq_n_s32(hi));
            if (nv == 4) {
                vstrbq_s32(y + n, v);
            } else {
                vstrbq_p_s32(y + n, v, vctp32q((uint32_t)nv));
            }
#else
            for (int32_t j = 0; j < 4; j++) {
                acc[j] = bias[n + j];
                for (int32_t k = 0; k < K; k++) {
                    acc[j] += (int32_t)x[k] * wb[(k >> 4) * 64 + j * 16 + (k & 15)];
                }
            }
            wb += kc * 64;
            for (int32_t j = 0; j < nv; j++) {
                const int32_t c = mstep * (n + j);
                const int32_t v = kiln_mve_fc_rq1(acc[j], m[c], rq + 3 * c, c1, c2) + zy;
                y[n + j] = (int8_t)(v < lo ? lo : (v > hi ? hi : v));
            }
#endif
        }
    }
}

/* kiln_mve_fc_s8 with TensorFlow Lite Micro's requantisation (the dense node's requant "fixed"):
 * MultiplyByQuantizedMultiplier as the conv kernels do (kiln_mve_rq4), rq: the conv's table
 * (ops_mve.requant_table: per block of 4 rows {bias x4, multiplier x4, left shift x4, minus the
 * right shift x4}; its bias words are those of ``bias``); m, mstep, c1 and c2 are unused. */
static __attribute__((noinline, unused)) void kiln_mve_fc_s8_fx(const int8_t *x, int32_t rows, int32_t K, int32_t N,
                                                                const int8_t *w, const int32_t *bias,
                                                                const int32_t *m, const int32_t *rq, int32_t mstep,
                                                                uint32_t c1, uint32_t c2, int32_t zy, int32_t lo,
                                                                int32_t hi, int8_t *y)
{
    (void)m, (void)mstep, (void)c1, (void)c2;
    const int32_t kc = (K + 15) >> 4;
    for (int32_t r = 0; r < rows; r++, x += K, y += N) {
        const int8_t *wb = w;
        for (int32_t n = 0; n < N; n += 4) {
            const int32_t nv = N - n < 4 ? N - n : 4;
            const int32_t *qb = rq + 4 * n;
#if KILN_HAVE_MVE
            const int32x4_t a = vaddq_s32(kiln_mve_dot4(x, &wb, K, kc), vld1q_s32(bias + n));
            const int32x4_t v = kiln_mve_rq4(a, qb, zy, lo, hi);
            if (nv == 4) {
                vstrbq_s32(y + n, v);
            } else {
                vstrbq_p_s32(y + n, v, vctp32q((uint32_t)nv));
            }
#else
            for (int32_t j = 0; j < nv; j++) {
                int32_t acc = bias[n + j];
                for (int32_t k = 0; k < K; k++) {
                    acc += (int32_t)x[k] * wb[(k >> 4) * 64 + j * 16 + (k & 15)];
                }
                const int32_t v = kiln_mbqm(acc, qb[4 + j], qb[8 + j], qb[12 + j]) + zy;
                y[n + j] = (int8_t)(v < lo ? lo : (v > hi ? hi : v));
            }
            wb += kc * 64;
#endif
        }
    }
}

/* ---- int8 ADD and MUL (TFLite's reference kernels, same-shape operands) ------------------------------
 * MultiplyByQuantizedMultiplier(v, m, shift) on 4 lanes with per-tensor constants: VSHL by the left
 * shift (lsh, wrapping as TFLite's x * (1 << left)), VQRDMULH by m, then RoundingDivideByPOT as in
 * kiln_mve_rq4 (rneg: minus the right shift, a vector; 0: none). */
#if KILN_HAVE_MVE
static inline int32x4_t kiln_mve_mbqm4(int32x4_t v, int32_t lsh, int32_t m, int32x4_t rneg)
{
    v = vqrdmulhq_n_s32(vshlq_r_s32(v, lsh), m);
    v = vqaddq_s32(v, vshrq_n_s32(vandq_s32(v, rneg), 31));
    return vrshlq_s32(v, rneg);
}
#endif

static inline int32_t kiln_mve_mbqm_s(int32_t v, int32_t lsh, int32_t m, int32_t rneg)
{
    return kiln_mbqm(lsh >= 32 ? 0 : v, m, lsh >= 32 ? 0 : lsh, rneg);
}

/* p: {za, 20 + left shift 1, m1, -right shift 1, zb, 20 + left shift 2, m2, -right 2, left shift out,
 * m out, -right out, zy, lo, hi} (ops_mve.add_params); y = clamp(MBQM(MBQM((a - za) << 20, m1, s1)
 * + MBQM((b - zb) << 20, m2, s2), mo, so) + zy, lo, hi), n elements: 4 per step, the last step
 * predicated (VCTP). */
static __attribute__((noinline, unused)) void kiln_mve_add_s8(const int8_t *a, const int8_t *b, int32_t n,
                                                              const int32_t *p, int8_t *y)
{
    const int32_t za = p[0], la = p[1], ma = p[2], zb = p[4], lb = p[5], mb = p[6], lo_ = p[8], mo = p[9];
    const int32_t zy = p[11], lo = p[12], hi = p[13];
#if KILN_HAVE_MVE
    const int32x4_t ra = vdupq_n_s32(p[3]), rb = vdupq_n_s32(p[7]), ro = vdupq_n_s32(p[10]);
    const int32x4_t vlo = vdupq_n_s32(lo), vhi = vdupq_n_s32(hi);
    for (int32_t i = 0; i < n; i += 4) {
        const mve_pred16_t pr = vctp32q((uint32_t)(n - i));
        const int32x4_t va = vsubq_n_s32(vldrbq_z_s32(a + i, pr), za), vb = vsubq_n_s32(vldrbq_z_s32(b + i, pr), zb);
        const int32x4_t s = vaddq_s32(kiln_mve_mbqm4(va, la, ma, ra), kiln_mve_mbqm4(vb, lb, mb, rb));
        const int32x4_t v = vaddq_n_s32(kiln_mve_mbqm4(s, lo_, mo, ro), zy);
        vstrbq_p_s32(y + i, vminq_s32(vmaxq_s32(v, vlo), vhi), pr);
    }
#else
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = (int32_t)((uint32_t)kiln_mve_mbqm_s(a[i] - za, la, ma, p[3]) +
                                    (uint32_t)kiln_mve_mbqm_s(b[i] - zb, lb, mb, p[7]));
        const int32_t v = kiln_mve_mbqm_s(s, lo_, mo, p[10]) + zy;
        y[i] = (int8_t)(v < lo ? lo : (v > hi ? hi : v));
    }
#endif
}

/* p: {za, zb, left shift, m, -right shift, zy, lo, hi}; y = clamp(MBQM((a - za) * (b - zb), m, s)
 * + zy, lo, hi) */
static __attribute__((noinline, unused)) void kiln_mve_mul_s8(const int8_t *a, const int8_t *b, int32_t n,
                                                              const int32_t *p, int8_t *y)
{
    const int32_t za = p[0], zb = p[1], l = p[2], m = p[3], zy = p[5], lo = p[6], hi = p[7];
#if KILN_HAVE_MVE
    const int32x4_t r = vdupq_n_s32(p[4]), vlo = vdupq_n_s32(lo), vhi = vdupq_n_s32(hi);
    for (int32_t i = 0; i < n; i += 4) {
        const mve_pred16_t pr = vctp32q((uint32_t)(n - i));
        const int32x4_t prod = vmulq_s32(vsubq_n_s32(vldrbq_z_s32(a + i, pr), za),
                                         vsubq_n_s32(vldrbq_z_s32(b + i, pr), zb));
        const int32x4_t v = vaddq_n_s32(kiln_mve_mbqm4(prod, l, m, r), zy);
        vstrbq_p_s32(y + i, vminq_s32(vmaxq_s32(v, vlo), vhi), pr);
    }
#else
    for (int32_t i = 0; i < n; i++) {
        const int32_t v = kiln_mve_mbqm_s((a[i] - za) * (b[i] - zb), l, m, p[4]) + zy;
        y[i] = (int8_t)(v < lo ? lo : (v > hi ? hi : v));
    }
#endif
}

#include "kiln_svdf.h"   /* the SVDF kernels (DSP, Helium and portable paths) */

#endif /* KILN_MVE_H */
