/* Kiln's integer SVDF kernels (TFLite Micro's EvalIntegerSvdfReference with an int16 state and
 * int16 time weights; backends/ops_svdf.py lowers svdf_state and svdf to them). Included at the
 * end of kiln_mve.h, so both KILN_HAVE_DSP and KILN_HAVE_MVE are known here.
 *
 * svdf_state: the new state is the old one shifted one step left (one copy of F * M - 1 values:
 * the oldest value of filter f + 1 lands in the newest slot of filter f, which the new column then
 * overwrites), and per filter the newest column MBQM(sum_i wf[f, i] * (x[i] - zx)) clamped to
 * int16, plus the state zero point (stored with int16's wrap-around, as TFLite Micro does). The
 * input zero point is folded into a per-filter bias at compile time (bias = -zx * sum_i wf[f, i],
 * modulo 2^32: the accumulator wraps the same way). Two variants of the feature-weights dot
 * product: kiln_svdf_state_s16 (every core; SXTB16 + SMLAD on the DSP extension, through the
 * kiln_dot{4,1}_w8 of kiln_intrinsics.h: weights as schedules.pack_w8 blocks of 4 filters, the
 * F % 4 rest one filter per block) and kiln_mve_svdf_state_s16 (Helium: VMLADAVA over 16 bytes,
 * weights as ops_mve.pack_gemm, the requantisation of 4 filters as one vector, q: the table of
 * ops_mve.requant_table).
 *
 * svdf: per output unit u the rank filters u * rank .. u * rank + rank - 1 are contiguous in both
 * the state and the time weights, so the unit's accumulator is one int16 dot product of
 * n = rank * M values plus the bias (the state zero point folded in at compile time), modulo 2^32
 * as TFLite's int32 sums: SMLAD (two 16x16 products per instruction, wrapping) on the DSP
 * extension, VMLADAVA.S16 (8 per instruction) on Helium, 4 units requantised as one vector there.
 * The output is MBQM(acc) + zy clamped to int8 (TFLite's integer SVDF applies no activation). */
#ifndef KILN_SVDF_H
#define KILN_SVDF_H

#include <stdint.h>

/* MBQM clamped to int16, plus the state zero point, with int16's wrap-around */
static inline int16_t kiln_svdf_col(int32_t acc, int32_t mult, int32_t lsh, int32_t rneg, int32_t zs)
{
    const int32_t v = kiln_clamp_i32(kiln_mbqm(acc, mult, lsh, rneg), -32768, 32767) + zs;
    return (int16_t)(uint16_t)(uint32_t)v;
}

/* x: B x I int8; w: the packed feature weights (pack_w8, rows padded to ip = I rounded up to 4);
 * bias: F int32 (folded input zero point); st: the old state, y: the new one (B x F * M int16,
 * distinct buffers) */
static __attribute__((noinline, unused)) void kiln_svdf_state_s16(const int8_t *x, int32_t B, int32_t I, int32_t F,
                                                                  int32_t M, const int8_t *w, const int32_t *bias,
                                                                  int32_t mult, int32_t lsh, int32_t rneg, int32_t zs,
                                                                  const int16_t *st, int16_t *y)
{
    const int32_t ip = (I + 3) & ~3, n = F * M, F4 = F & ~3;
    for (int32_t b = 0; b < B; b++, x += I, st += n, y += n) {
        kiln_copy_s8((int8_t *)y, (const int8_t *)(st + 1), 2 * (n - 1));
        const int8_t *wp = w;
        for (int32_t f = 0; f < F4; f += 4, wp += 4 * ip) {
            int32_t acc[4] = {bias[f], bias[f + 1], bias[f + 2], bias[f + 3]};
            kiln_dot4_w8_z(x, wp, I, 0, acc);
            for (int32_t j = 0; j < 4; j++) {
                y[(f + j) * M + M - 1] = kiln_svdf_col(acc[j], mult, lsh, rneg, zs);
            }
        }
        for (int32_t f = F4; f < F; f++, wp += ip) {
            int32_t acc[1] = {bias[f]};
            kiln_dot1_w8_z(x, wp, I, 0, acc);
            y[f * M + M - 1] = kiln_svdf_col(acc[0], mult, lsh, rneg, zs);
        }
    }
}

/* kiln_svdf_state_s16 on Helium: w as ops_mve.pack_gemm (blocks of 4 filters, 16-byte chunks),
 * q: ops_mve.requant_table of the folded bias and the (per-tensor) multiplier and shift */
static __attribute__((noinline, unused)) void kiln_mve_svdf_state_s16(const int8_t *x, int32_t B, int32_t I,
                                                                      int32_t F, int32_t M, const int8_t *w,
                                                                      const int32_t *q, int32_t zs,
                                                                      const int16_t *st, int16_t *y)
{
    const int32_t kc = (I + 15) >> 4, n = F * M;
#if KILN_HAVE_MVE
    const uint32x4_t off = vmulq_n_u32(vidupq_n_u32(0, 1), (uint32_t)(2 * M));   /* bytes between filters */
#endif
    for (int32_t b = 0; b < B; b++, x += I, st += n, y += n) {
        kiln_mve_copy((int8_t *)y, (const int8_t *)(st + 1), 2 * (n - 1));
        const int8_t *wb = w;
        const int32_t *qb = q;
        for (int32_t f = 0; f < F; f += 4, qb += 16) {
#if KILN_HAVE_MVE
            const int32x4_t a = vaddq_s32(kiln_mve_dot4(x, &wb, I, kc), vld1q_s32(qb));
            const int32x4_t v = vaddq_n_s32(kiln_mve_rq4(a, qb, 0, -32768, 32767), zs);
            vstrhq_scatter_offset_p_s32(y + f * M + M - 1, off, v, vctp32q((uint32_t)(F - f)));
#else
            for (int32_t j = 0; j < 4 && f + j < F; j++) {
                int32_t s = qb[j];
                for (int32_t k = 0; k < I; k++) {
                    s += (int32_t)x[k] * wb[(k >> 4) * 64 + j * 16 + (k & 15)];
                }
                y[(f + j) * M + M - 1] = kiln_svdf_col(s, qb[4 + j], qb[8 + j], qb[12 + j], zs);
            }
            wb += kc * 64;
#endif
        }
    }
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

/* st: the new state (B x U * n int16), wt: U x n int16 (n = rank * M), bias: U int32 (the state
 * zero point folded in), y: B x U int8 */
static __attribute__((noinline, unused)) void kiln_svdf_s16(const int16_t *st, int32_t B, int32_t U, int32_t n,
                                                            const int16_t *wt, const int32_t *bias, int32_t mult,
                                                            int32_t lsh, int32_t rneg, int32_t zy, int8_t *y)
{
    for (int32_t b = 0; b < B; b++, st += U * n, y += U) {
        int32_t u = 0;
#if KILN_HAVE_MVE
        const int32x4_t rv = vdupq_n_s32(rneg);
        for (; u < U; u += 4) {
            int32_t s[4] = {0, 0, 0, 0};
            for (int32_t j = 0; j < 4 && u + j < U; j++) {
                s[j] = (int32_t)((uint32_t)bias[u + j] + (uint32_t)kiln_svdf_dot_s16(wt + (u + j) * n,
                                                                                      st + (u + j) * n, n));
            }
            const int32x4_t v = vaddq_n_s32(kiln_mve_mbqm4(vld1q_s32(s), lsh, mult, rv), zy);
            vstrbq_p_s32(y + u, vminq_s32(vmaxq_s32(v, vdupq_n_s32(-128)), vdupq_n_s32(127)),
                         vctp32q((uint32_t)(U - u)));
        }
#else
        for (; u < U; u++) {
            const int32_t acc = (int32_t)((uint32_t)bias[u] + (uint32_t)kiln_svdf_dot_s16(wt + u * n, st + u * n, n));
            y[u] = (int8_t)kiln_clamp_i32(kiln_mbqm(acc, mult, lsh, rneg) + zy, -128, 127);
        }
#endif
    }
}

#endif /* KILN_SVDF_H */
