/* Kiln's integer SVDF kernels (TFLite Micro's EvalIntegerSvdfReference<T>, T the state's and the
 * time weights' type: int16, or int8 for TFLite Micro's 8-bit SVDF; backends/ops_svdf.py lowers
 * svdf_state and svdf to them). Included at the end of kiln_mve.h, so both KILN_HAVE_DSP and
 * KILN_HAVE_MVE are known here. Each kernel is one body (always inlined, taking the element size
 * `bytes`) behind an out-of-line _s16 and _s8 entry point, so the size folds away.
 *
 * svdf_state: the new state is the old one shifted one step left (one copy of F * M - 1 values:
 * the oldest value of filter f + 1 lands in the newest slot of filter f, which the new column then
 * overwrites), and per filter the newest column MBQM(sum_i wf[f, i] * (x[i] - zx)) clamped to
 * the state type, plus the state zero point (stored with the state type's wrap-around, as TFLite
 * Micro does). The input zero point is folded into a per-filter bias at compile time (bias = -zx *
 * sum_i wf[f, i], modulo 2^32: the accumulator wraps the same way). Two variants of the
 * feature-weights dot product: kiln_svdf_state_s{16,8} (every core; SXTB16 + SMLAD on the DSP
 * extension, through the kiln_dot{4,1}_w8 of kiln_intrinsics.h: weights as schedules.pack_w8
 * blocks of 4 filters, the F % 4 rest one filter per block) and kiln_mve_svdf_state_s{16,8}
 * (Helium: VMLADAVA over 16 bytes, weights as ops_mve.pack_gemm, the requantisation of 4 filters
 * as one vector, scattered to the 4 filters' newest slots; q: the table of ops_mve.requant_table).
 *
 * svdf: per output unit u the rank filters u * rank .. u * rank + rank - 1 are contiguous in both
 * the state and the time weights, so the unit's accumulator is one dot product of n = rank * M
 * values plus the bias (the state zero point folded in at compile time), modulo 2^32 as TFLite's
 * int32 sums: int16 (kiln_svdf_s16) with SMLAD (two 16x16 products per instruction, wrapping) on
 * the DSP extension and VMLADAVA.S16 (8 per instruction) on Helium; int8 (kiln_svdf_s8) with
 * SXTB16 of both operands + SMLAD on the DSP extension and VMLADAVA.S8 (16 per instruction) on
 * Helium; 4 units requantised as one vector there. The output is MBQM(acc) + zy clamped to int8
 * (TFLite's integer SVDF applies no activation). */
#ifndef KILN_SVDF_H
#define KILN_SVDF_H

#include <stdint.h>

#define KILN_SVDF_INLINE static inline __attribute__((always_inline))
#define KILN_SVDF_ENTRY static __attribute__((noinline, unused))

/* element i of an int8 (bytes 1) or int16 (bytes 2) state: stores wrap to the type */
KILN_SVDF_INLINE void kiln_svdf_put(void *y, int32_t i, int32_t v, int32_t bytes)
{
    if (bytes == 1) {
        ((int8_t *)y)[i] = (int8_t)(uint8_t)(uint32_t)v;
    } else {
        ((int16_t *)y)[i] = (int16_t)(uint16_t)(uint32_t)v;
    }
}

/* MBQM clamped to the state type, plus the state zero point (the store wraps) */
static inline int32_t kiln_svdf_col(int32_t acc, int32_t mult, int32_t lsh, int32_t rneg, int32_t zs, int32_t bytes)
{
    const int32_t hi = bytes == 1 ? 127 : 32767;
    return kiln_clamp_i32(kiln_mbqm(acc, mult, lsh, rneg), -hi - 1, hi) + zs;
}

/* x: B x I int8; w: the packed feature weights (pack_w8, rows padded to ip = I rounded up to 4);
 * bias: F int32 (folded input zero point); st: the old state, y: the new one (B x F * M of the
 * state type, distinct buffers) */
KILN_SVDF_INLINE void kiln_svdf_state(const int8_t *x, int32_t B, int32_t I, int32_t F, int32_t M, const int8_t *w,
                                      const int32_t *bias, int32_t mult, int32_t lsh, int32_t rneg, int32_t zs,
                                      const void *st, void *y, int32_t bytes)
{
    const int32_t ip = (I + 3) & ~3, n = F * M, F4 = F & ~3;
    const int8_t *sb = (const int8_t *)st;
    int8_t *yb = (int8_t *)y;
    for (int32_t b = 0; b < B; b++, x += I, sb += n * bytes, yb += n * bytes) {
        kiln_copy_s8(yb, sb + bytes, bytes * (n - 1));
        const int8_t *wp = w;
        for (int32_t f = 0; f < F4; f += 4, wp += 4 * ip) {
            int32_t acc[4] = {bias[f], bias[f + 1], bias[f + 2], bias[f + 3]};
            kiln_dot4_w8_z(x, wp, I, 0, acc);
            for (int32_t j = 0; j < 4; j++) {
                kiln_svdf_put(yb, (f + j) * M + M - 1, kiln_svdf_col(acc[j], mult, lsh, rneg, zs, bytes), bytes);
            }
        }
        for (int32_t f = F4; f < F; f++, wp += ip) {
            int32_t acc[1] = {bias[f]};
            kiln_dot1_w8_z(x, wp, I, 0, acc);
            kiln_svdf_put(yb, f * M + M - 1, kiln_svdf_col(acc[0], mult, lsh, rneg, zs, bytes), bytes);
        }
    }
}

KILN_SVDF_ENTRY void kiln_svdf_state_s16(const int8_t *x, int32_t B, int32_t I, int32_t F, int32_t M, const int8_t *w,
                                         const int32_t *bias, int32_t mult, int32_t lsh, int32_t rneg, int32_t zs,
                                         const int16_t *st, int16_t *y)
{
    kiln_svdf_state(x, B, I, F, M, w, bias, mult, lsh, rneg, zs, st, y, 2);
}

KILN_SVDF_ENTRY void kiln_svdf_state_s8(const int8_t *x, int32_t B, int32_t I, int32_t F, int32_t M, const int8_t *w,
                                        const int32_t *bias, int32_t mult, int32_t lsh, int32_t rneg, int32_t zs,
                                        const int8_t *st, int8_t *y)
{
    kiln_svdf_state(x, B, I, F, M, w, bias, mult, lsh, rneg, zs, st, y, 1);
}

/* kiln_svdf_state on Helium: w as ops_mve.pack_gemm (blocks of 4 filters, 16-byte chunks),
 * q: ops_mve.requant_table of the folded bias and the (per-tensor) multiplier and shift */
KILN_SVDF_INLINE void kiln_mve_svdf_state(const int8_t *x, int32_t B, int32_t I, int32_t F, int32_t M,
                                          const int8_t *w, const int32_t *q, int32_t zs, const void *st, void *y,
                                          int32_t bytes)
{
    const int32_t kc = (I + 15) >> 4, n = F * M;
    const int8_t *sb = (const int8_t *)st;
    int8_t *yb = (int8_t *)y;
#if KILN_HAVE_MVE
    const int32_t hi = bytes == 1 ? 127 : 32767;
    const uint32x4_t off = vmulq_n_u32(vidupq_n_u32(0, 1), (uint32_t)(bytes * M));   /* bytes between filters */
#endif
    for (int32_t b = 0; b < B; b++, x += I, sb += n * bytes, yb += n * bytes) {
        kiln_mve_copy(yb, sb + bytes, bytes * (n - 1));
        const int8_t *wb = w;
        const int32_t *qb = q;
        for (int32_t f = 0; f < F; f += 4, qb += 16) {
#if KILN_HAVE_MVE
            const int32x4_t a = vaddq_s32(kiln_mve_dot4(x, &wb, I, kc), vld1q_s32(qb));
            const int32x4_t v = vaddq_n_s32(kiln_mve_rq4(a, qb, 0, -hi - 1, hi), zs);
            const mve_pred16_t p = vctp32q((uint32_t)(F - f));
            if (bytes == 1) {
                vstrbq_scatter_offset_p_s32(yb + f * M + M - 1, off, v, p);
            } else {
                vstrhq_scatter_offset_p_s32((int16_t *)yb + f * M + M - 1, off, v, p);
            }
#else
            for (int32_t j = 0; j < 4 && f + j < F; j++) {
                int32_t s = qb[j];
                for (int32_t k = 0; k < I; k++) {
                    s += (int32_t)x[k] * wb[(k >> 4) * 64 + j * 16 + (k & 15)];
                }
                kiln_svdf_put(yb, (f + j) * M + M - 1, kiln_svdf_col(s, qb[4 + j], qb[8 + j], qb[12 + j], zs, bytes),
                              bytes);
            }
            wb += kc * 64;
#endif
        }
    }
}

KILN_SVDF_ENTRY void kiln_mve_svdf_state_s16(const int8_t *x, int32_t B, int32_t I, int32_t F, int32_t M,
                                             const int8_t *w, const int32_t *q, int32_t zs, const int16_t *st,
                                             int16_t *y)
{
    kiln_mve_svdf_state(x, B, I, F, M, w, q, zs, st, y, 2);
}

KILN_SVDF_ENTRY void kiln_mve_svdf_state_s8(const int8_t *x, int32_t B, int32_t I, int32_t F, int32_t M,
                                            const int8_t *w, const int32_t *q, int32_t zs, const int8_t *st, int8_t *y)
{
    kiln_mve_svdf_state(x, B, I, F, M, w, q, zs, st, y, 1);
}

/* sum_k a[k] * b[k] of int16 vectors, modulo 2^32 */
static inline int32_t kiln_svdf_dot_s16(const int16_t *a, const int16_t *b, int32_t n)
{
    uint32_t s = 0;
    int32_t k = 0;
#if KILN_HAVE_MVE
    for (; k + 8 <= n; k += 8) {
        s = (uint32_t)vmladavaq_s16((int32_t)s, vld1q_s16(a + k), vld1q_s16(b + k));
    }
    if (k < n) {
        const mve_pred16_t p = vctp16q((uint32_t)(n - k));
        s = (uint32_t)vmladavaq_s16((int32_t)s, vldrhq_z_s16(a + k, p), vldrhq_z_s16(b + k, p));
    }
    return (int32_t)s;
#elif KILN_HAVE_DSP
    for (; k + 4 <= n; k += 4) {
        uint32_t a01, a23, b01, b23;
        __builtin_memcpy(&a01, a + k, 4);
        __builtin_memcpy(&a23, a + k + 2, 4);
        __builtin_memcpy(&b01, b + k, 4);
        __builtin_memcpy(&b23, b + k + 2, 4);
        s = (uint32_t)__smlad(a01, b01, (int32_t)s);
        s = (uint32_t)__smlad(a23, b23, (int32_t)s);
    }
#endif
    for (; k < n; k++) {
        s += (uint32_t)((int32_t)a[k] * b[k]);
    }
    return (int32_t)s;
}

/* sum_k a[k] * b[k] of int8 vectors, modulo 2^32 (SXTB16 of both words gives lanes {0, 2}, with
 * ROR #8 lanes {1, 3}: the same order on both sides, so two SMLADs per 4 values) */
static inline int32_t kiln_svdf_dot_s8(const int8_t *a, const int8_t *b, int32_t n)
{
    uint32_t s = 0;
    int32_t k = 0;
#if KILN_HAVE_MVE
    for (; k + 16 <= n; k += 16) {
        s = (uint32_t)vmladavaq_s8((int32_t)s, vld1q_s8(a + k), vld1q_s8(b + k));
    }
    if (k < n) {
        const mve_pred16_t p = vctp8q((uint32_t)(n - k));
        s = (uint32_t)vmladavaq_s8((int32_t)s, vldrbq_z_s8(a + k, p), vldrbq_z_s8(b + k, p));
    }
    return (int32_t)s;
#elif KILN_HAVE_DSP
    for (; k + 4 <= n; k += 4) {
        const uint32_t av = kiln_read_s8x4(a + k), bv = kiln_read_s8x4(b + k);
        s = (uint32_t)__smlad(__sxtb16(av), __sxtb16(bv), (int32_t)s);
        s = (uint32_t)__smlad(kiln_sxtb16_ror8(av), kiln_sxtb16_ror8(bv), (int32_t)s);
    }
#endif
    for (; k < n; k++) {
        s += (uint32_t)((int32_t)a[k] * b[k]);
    }
    return (int32_t)s;
}

/* unit u's accumulator: bias + the dot product of its n time weights and state values (mod 2^32) */
KILN_SVDF_INLINE int32_t kiln_svdf_unit(const void *st, const void *wt, const int32_t *bias, int32_t u, int32_t n,
                                        int32_t bytes)
{
    const int32_t d = bytes == 1 ? kiln_svdf_dot_s8((const int8_t *)wt + u * n, (const int8_t *)st + u * n, n)
                                 : kiln_svdf_dot_s16((const int16_t *)wt + u * n, (const int16_t *)st + u * n, n);
    return (int32_t)((uint32_t)bias[u] + (uint32_t)d);
}

/* st: the new state (B x U * n of the state type), wt: U x n of the state type (n = rank * M),
 * bias: U int32 (the state zero point folded in), y: B x U int8 */
KILN_SVDF_INLINE void kiln_svdf_out(const void *st, int32_t B, int32_t U, int32_t n, const void *wt,
                                    const int32_t *bias, int32_t mult, int32_t lsh, int32_t rneg, int32_t zy, int8_t *y,
                                    int32_t bytes)
{
    const int8_t *sb = (const int8_t *)st;
    for (int32_t b = 0; b < B; b++, sb += U * n * bytes, y += U) {
        int32_t u = 0;
#if KILN_HAVE_MVE
        const int32x4_t rv = vdupq_n_s32(rneg);
        for (; u < U; u += 4) {
            int32_t s[4] = {0, 0, 0, 0};
            for (int32_t j = 0; j < 4 && u + j < U; j++) {
                s[j] = kiln_svdf_unit(sb, wt, bias, u + j, n, bytes);
            }
            const int32x4_t v = vaddq_n_s32(kiln_mve_mbqm4(vld1q_s32(s), lsh, mult, rv), zy);
            vstrbq_p_s32(y + u, vminq_s32(vmaxq_s32(v, vdupq_n_s32(-128)), vdupq_n_s32(127)),
                         vctp32q((uint32_t)(U - u)));
        }
#else
        for (; u < U; u++) {
            const int32_t acc = kiln_svdf_unit(sb, wt, bias, u, n, bytes);
            y[u] = (int8_t)kiln_clamp_i32(kiln_mbqm(acc, mult, lsh, rneg) + zy, -128, 127);
        }
#endif
    }
}

KILN_SVDF_ENTRY void kiln_svdf_s16(const int16_t *st, int32_t B, int32_t U, int32_t n, const int16_t *wt,
                                   const int32_t *bias, int32_t mult, int32_t lsh, int32_t rneg, int32_t zy, int8_t *y)
{
    kiln_svdf_out(st, B, U, n, wt, bias, mult, lsh, rneg, zy, y, 2);
}

KILN_SVDF_ENTRY void kiln_svdf_s8(const int8_t *st, int32_t B, int32_t U, int32_t n, const int8_t *wt,
                                  const int32_t *bias, int32_t mult, int32_t lsh, int32_t rneg, int32_t zy, int8_t *y)
{
    kiln_svdf_out(st, B, U, n, wt, bias, mult, lsh, rneg, zy, y, 1);
}

#endif /* KILN_SVDF_H */
