/* Kiln's Helium (MVE, Armv8.1-M M-profile Vector Extension) int8 kernels for the Cortex-M55:
 * conv2d (groups 1) as an int8 GEMM with VMLADAVA, depthwise conv with channels across the
 * vector lanes, and TFLite's MultiplyByQuantizedMultiplier as VQRDMULH + a rounding shift.
 * backends/ops_mve.py lowers to them and packs their constants at compile time.
 *
 * Every kernel has a portable C version (hosts, and cores without MVE) that computes the same
 * int32 accumulators and the same requantisation, so a package compiled for the Cortex-M55 runs
 * bit-exactly on the host too; tests/backends/test_ops_mve.py checks both against the int8
 * reference (the MVE versions on the emulated mps3-an547).
 *
 * Requantisation table q (int32), for N channels padded to Np = N rounded up to 4:
 *   q[0 .. Np)       bias, the input zero point folded in: bias - zx * sum(w)
 *   q[Np .. 2Np)     quantized multiplier
 *   q[2Np .. 3Np)    left shift  (max(shift, 0))
 *   q[3Np .. 4Np)    minus the right shift (min(shift, 0))
 * MultiplyByQuantizedMultiplier(acc, m, shift) = RoundingDivideByPOT(SRDHM(acc << left, m), right):
 * VQRDMULH is SaturatingRoundingDoublingHighMul exactly (its round-half-up of the doubled
 * product equals gemmlowp's truncating form with the 1 - 2^30 nudge, and it saturates the one
 * overflow, INT32_MIN * INT32_MIN, to INT32_MAX as gemmlowp does); VRSHL by -right rounds half
 * up, so negative values get -1 first (VQADD: INT32_MIN stays exact), which makes it
 * RoundingDivideByPOT's round-half-away-from-zero. */
#ifndef KILN_MVE_H
#define KILN_MVE_H

#include <stdint.h>

#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 1) && !defined(KILN_NO_MVE)
#include <arm_mve.h>
#define KILN_HAVE_MVE 1
#else
#define KILN_HAVE_MVE 0
#endif

/* ---- requantisation -------------------------------------------------------------------------- */
static inline int32_t kiln_mve_mbqm1(int32_t acc, int32_t mult, int32_t lsh, int32_t rneg)
{
    const int32_t a = (int32_t)((uint32_t)acc << lsh);   /* TFLite: x * (1 << left), wrapping */
    int32_t v;
    if (a == INT32_MIN && mult == INT32_MIN) {
        v = INT32_MAX;
    } else {
        const int64_t ab = (int64_t)a * mult;
        const int64_t nudge = ab >= 0 ? (1LL << 30) : (1 - (1LL << 30));
        v = (int32_t)((ab + nudge) / (1LL << 31));
    }
    const int32_t e = -rneg;
    if (e == 0) {
        return v;
    }
    const int32_t mask = (int32_t)((1u << e) - 1u);
    const int32_t rem = v & mask;
    const int32_t thr = (mask >> 1) + (v < 0 ? 1 : 0);
    return (v >> e) + (rem > thr ? 1 : 0);
}

static inline int32_t kiln_mve_out1(int32_t acc, const int32_t *q, int32_t np, int32_t ch, int32_t zy, int32_t lo,
                                    int32_t hi)
{
    int32_t v = kiln_mve_mbqm1(acc + q[ch], q[np + ch], q[2 * np + ch], q[3 * np + ch]) + zy;
    return v < lo ? lo : (v > hi ? hi : v);
}

#if KILN_HAVE_MVE
/* acc (bias already added) of 4 channels -> int32 in [lo, hi] */
static inline int32x4_t kiln_mve_rq4(int32x4_t acc, int32x4_t m, int32x4_t lsh, int32x4_t rneg, int32_t zy,
                                     int32_t lo, int32_t hi)
{
    int32x4_t v = vqrdmulhq_s32(vshlq_s32(acc, lsh), m);
    v = vqaddq_s32(v, vshrq_n_s32(vandq_s32(v, rneg), 31));
    v = vaddq_n_s32(vrshlq_s32(v, rneg), zy);
    return vminq_s32(vmaxq_s32(v, vdupq_n_s32(lo)), vdupq_n_s32(hi));
}
#endif

/* ---- conv2d (groups 1) as an int8 GEMM ---------------------------------------------------------
 * w: the (O, K) weights, each row zero-padded to Kp (K rounded up to 16; ops_mve.pack_gemm).
 * a[0..3]: the reductions (patches) of up to four output pixels, K bytes each (unused ones repeat
 * the last); y: the first pixel's O output bytes, the others follow O bytes apart. Per output
 * channel, four pixels at a time: per 16-wide chunk one weight load, four input loads and four
 * VMLADAVA (64 MACs; VMLADAVA accumulates in even registers, so four accumulators is the most
 * that stays in registers), then one vector of four pixels requantised with the channel's
 * constants and scattered to their rows. */
static void kiln_mve_gemm4(const int8_t *const *a, int32_t n, const int8_t *w, int32_t K, int32_t O,
                           const int32_t *q, int32_t zy, int32_t lo, int32_t hi, int8_t *y)
{
    const int32_t kp = (K + 15) & ~15, op = (O + 3) & ~3;
#if KILN_HAVE_MVE
    const int32_t kfull = K >> 4, ktail = K & 15;
    const mve_pred16_t pk = vctp8q((uint32_t)ktail), pn = vctp32q((uint32_t)n);
    const uint32x4_t rows = vmulq_n_u32(vidupq_n_u32(0, 1), (uint32_t)O);
    const int32x4_t vlo = vdupq_n_s32(lo), vhi = vdupq_n_s32(hi);
    for (int32_t o = 0; o < O; o++, w += kp) {
        const int8_t *wp = w, *p0 = a[0], *p1 = a[1], *p2 = a[2], *p3 = a[3];
        int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int32_t k = 0; k < kfull; k++) {
            const int8x16_t wv = vld1q_s8(wp);
            wp += 16;
            s0 = vmladavaq_s8(s0, vld1q_s8(p0), wv);
            s1 = vmladavaq_s8(s1, vld1q_s8(p1), wv);
            s2 = vmladavaq_s8(s2, vld1q_s8(p2), wv);
            s3 = vmladavaq_s8(s3, vld1q_s8(p3), wv);
            p0 += 16;
            p1 += 16;
            p2 += 16;
            p3 += 16;
        }
        if (ktail) {
            const int8x16_t wv = vld1q_s8(wp);
            s0 = vmladavaq_s8(s0, vldrbq_z_s8(p0, pk), wv);
            s1 = vmladavaq_s8(s1, vldrbq_z_s8(p1, pk), wv);
            s2 = vmladavaq_s8(s2, vldrbq_z_s8(p2, pk), wv);
            s3 = vmladavaq_s8(s3, vldrbq_z_s8(p3, pk), wv);
        }
        int32x4_t v = vdupq_n_s32(s0);
        v = vsetq_lane_s32(s1, v, 1);
        v = vsetq_lane_s32(s2, v, 2);
        v = vsetq_lane_s32(s3, v, 3);
        const int32_t rn = q[3 * op + o];
        v = vqrdmulhq_n_s32(vshlq_r_s32(vaddq_n_s32(v, q[o]), q[2 * op + o]), q[op + o]);
        v = vqaddq_s32(v, vshrq_n_s32(vandq_s32(v, vdupq_n_s32(rn)), 31));
        v = vaddq_n_s32(vrshlq_n_s32(v, rn), zy);
        vstrbq_scatter_offset_p_s32(y + o, rows, vminq_s32(vmaxq_s32(v, vlo), vhi), pn);
    }
#else
    for (int32_t o = 0; o < O; o++) {
        for (int32_t p = 0; p < n; p++) {
            int32_t s = 0;
            for (int32_t k = 0; k < K; k++) {
                s += (int32_t)a[p][k] * w[o * kp + k];
            }
            y[p * O + o] = (int8_t)kiln_mve_out1(s, q, op, o, zy, lo, hi);
        }
    }
#endif
}

/* copy n bytes / fill n bytes with v (predicated 16-byte steps on MVE) */
static inline void kiln_mve_copy(int8_t *d, const int8_t *s, int32_t n)
{
#if KILN_HAVE_MVE
    for (; n > 0; n -= 16, d += 16, s += 16) {
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
    for (; n > 0; n -= 16, d += 16) {
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
    for (int32_t kh = 0; kh < KH; kh++, d += row) {
        const int32_t ih = ih0 + kh;
        if (ih < 0 || ih >= H) {
            kiln_mve_fill(d, (int8_t)zx, row);
        } else if (iw0 >= 0 && iw0 + KW <= W) {
            kiln_mve_copy(d, x + (ih * W + iw0) * C, row);
        } else {
            for (int32_t kw = 0; kw < KW; kw++) {
                const int32_t iw = iw0 + kw;
                if (iw < 0 || iw >= W) {
                    kiln_mve_fill(d + kw * C, (int8_t)zx, C);
                } else {
                    kiln_mve_copy(d + kw * C, x + (ih * W + iw) * C, C);
                }
            }
        }
    }
    return patch;
}

/* One image of an int8 conv2d (groups 1, dilation 1): per four output pixels, their patches
 * (none for a 1x1 conv without padding: the input pixel is the reduction) and kiln_mve_gemm4.
 * patch: 4 * K bytes of scratch. */
static __attribute__((noinline, unused)) void kiln_mve_conv_s8(
    const int8_t *x, int32_t H, int32_t W, int32_t C, int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt,
    int32_t pl, int32_t oh, int32_t ow, int32_t zx, int8_t *patch, const int8_t *w, int32_t O, const int32_t *q,
    int32_t zy, int32_t lo, int32_t hi, int8_t *y)
{
    const int32_t K = KH * KW * C, n = oh * ow;
    const int32_t direct = KH == 1 && KW == 1 && pt == 0 && pl == 0 && (oh - 1) * sh < H && (ow - 1) * sw < W;
    const int8_t *a[4];
    for (int32_t p = 0; p < n; p += 4) {
        const int32_t m = n - p < 4 ? n - p : 4;
        for (int32_t i = 0; i < 4; i++) {
            const int32_t pi = p + (i < m ? i : m - 1);
            a[i] = i < m ? kiln_mve_patch(x, H, W, C, KH, KW, sh, sw, pt, pl, pi / ow, pi % ow, zx, patch + i * K,
                                          direct)
                         : a[m - 1];
        }
        kiln_mve_gemm4(a, m, w, K, O, q, zy, lo, hi, y + p * O);
    }
}

/* ---- depthwise conv2d (depth multiplier 1) -------------------------------------------------------
 * w: (KH * KW, C) int8 (channels contiguous per tap), q: the requantisation table above (the
 * bias with zx * sum over all taps folded in). Per output pixel, its tap pointers (a tap outside
 * the input points at zrow, C bytes of zx, so every tap adds (x - zx) * w exactly as TFLite's
 * padding does), then per block of 4 channels one int32 accumulator vector: per tap two
 * widening loads, VMUL, VADD. */
#define KILN_MVE_DW_MAX_TAPS 64
#if KILN_HAVE_MVE
#define KILN_MVE_DW_TAP(A, K) A = vaddq_s32(A, vmulq_s32(vldrbq_s32(xp + K), vldrbq_s32(wp + K)))
#define KILN_MVE_DW_OUT(A, K)                                                                               \
    vstrbq_s32(y + c + K, kiln_mve_rq4(A, vld1q_s32(q + cp + c + K), vld1q_s32(q + 2 * cp + c + K),       \
                                       vld1q_s32(q + 3 * cp + c + K), zy, lo, hi))
/* one output pixel of a depthwise conv with C % 16 == 0: 16 channels (four accumulator vectors)
 * per pass over the taps */
static inline void kiln_mve_dw16(const int8_t *const *tap, int32_t T, const int8_t *w, int32_t C, const int32_t *q,
                                 int32_t cp, int32_t zy, int32_t lo, int32_t hi, int8_t *y)
{
    for (int32_t c = 0; c < C; c += 16) {
        int32x4_t a0 = vld1q_s32(q + c), a1 = vld1q_s32(q + c + 4), a2 = vld1q_s32(q + c + 8);
        int32x4_t a3 = vld1q_s32(q + c + 12);
        const int8_t *wp = w + c;
        for (int32_t t = 0; t < T; t++, wp += C) {
            const int8_t *xp = tap[t] + c;
            KILN_MVE_DW_TAP(a0, 0);
            KILN_MVE_DW_TAP(a1, 4);
            KILN_MVE_DW_TAP(a2, 8);
            KILN_MVE_DW_TAP(a3, 12);
        }
        KILN_MVE_DW_OUT(a0, 0);
        KILN_MVE_DW_OUT(a1, 4);
        KILN_MVE_DW_OUT(a2, 8);
        KILN_MVE_DW_OUT(a3, 12);
    }
}
#endif
static __attribute__((noinline, unused)) void kiln_mve_dw_s8(
    const int8_t *x, int32_t H, int32_t W, int32_t C, int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt,
    int32_t pl, int32_t dh, int32_t dw, int32_t oh, int32_t ow, int32_t zx, int8_t *zrow, const int8_t *w,
    const int32_t *q, int32_t zy, int32_t lo, int32_t hi, int8_t *y)
{
    const int8_t *tap[KILN_MVE_DW_MAX_TAPS];
    const int32_t T = KH * KW, cp = (C + 3) & ~3;
    kiln_mve_fill(zrow, (int8_t)zx, C);
    for (int32_t i = 0; i < oh; i++) {
        for (int32_t j = 0; j < ow; j++, y += C) {
            const int32_t ih0 = i * sh - pt, iw0 = j * sw - pl;
            for (int32_t kh = 0, t = 0; kh < KH; kh++) {
                const int32_t ih = ih0 + kh * dh;
                for (int32_t kw = 0; kw < KW; kw++, t++) {
                    const int32_t iw = iw0 + kw * dw;
                    tap[t] = (ih < 0 || ih >= H || iw < 0 || iw >= W) ? zrow : x + (ih * W + iw) * C;
                }
            }
#if KILN_HAVE_MVE
            if ((C & 15) == 0) {
                kiln_mve_dw16(tap, T, w, C, q, cp, zy, lo, hi, y);
                continue;
            }
            for (int32_t c = 0; c < C; c += 4) {
                const mve_pred16_t pc = vctp32q((uint32_t)(C - c));
                int32x4_t acc = vld1q_s32(q + c);
                const int8_t *wp = w + c;
                for (int32_t t = 0; t < T; t++, wp += C) {
                    acc = vaddq_s32(acc, vmulq_s32(vldrbq_z_s32(tap[t] + c, pc), vldrbq_z_s32(wp, pc)));
                }
                const int32x4_t r = kiln_mve_rq4(acc, vld1q_s32(q + cp + c), vld1q_s32(q + 2 * cp + c),
                                                 vld1q_s32(q + 3 * cp + c), zy, lo, hi);
                vstrbq_p_s32(y + c, r, pc);
            }
#else
            for (int32_t c = 0; c < C; c++) {
                int32_t s = 0;
                for (int32_t t = 0; t < T; t++) {
                    s += (int32_t)tap[t][c] * w[t * C + c];
                }
                y[c] = (int8_t)kiln_mve_out1(s, q, cp, c, zy, lo, hi);
            }
#endif
        }
    }
}

#endif /* KILN_MVE_H */
