/* Kiln's batch-1 int8 FULLY_CONNECTED kernel (matrix-vector): backends/ops_dense.py lowers a
 * dense layer with constant weights to one call of kiln_fc_mv_s8. Included by kiln_intrinsics.h
 * (it uses kiln_fc_rq from there).
 *
 * Weights (ops_dense.pack_dense) are packed at compile time in the order the inner loop reads
 * them: per block of 4 output columns, per group of 4 reduction indices, the 4 columns' 4 int8
 * weights in natural order (16 bytes: one LDM); the K % 4 tail as one zero-padded group; then the
 * N % 4 remaining columns one after the other, 4 bytes per group. The input zero point is folded
 * into the bias at compile time (bias - zx * sum(w), modulo 2^32 like the int32 accumulator), so
 * the kernel multiplies the raw int8 input.
 *
 * On cores with the DSP extension the 4-column dot product is kiln_dense_dot4 below: per group
 * of 4 inputs one LDR, two SXTB16 (lanes {x0, x2} and {x1, x3}), one LDM of the 4 weight words,
 * then per column two SXTB16 and two SMLAD (16 MACs in 20 instructions), unrolled by 4. The
 * portable C version (Cortex-M0+/M3, host builds) computes the same int32 sums.
 *
 * Requantisation is LiteRT's reference FULLY_CONNECTED: round(double(acc) * eff) + zy, clamped
 * (kiln_fc_rq is the exact integer version). The fast path: M = floor(eff * 2^32) (eff < 1/2),
 * p = acc * M; acc * eff * 2^32 lies within |acc| of p and the double product within 2^9 of that,
 * so when the low word of p + 2^31 is at least G away from a multiple of 2^32 (G a compile-time
 * bound on |acc| plus 2^10, ops_dense.dense_requant_guard), floor(p / 2^32 + 1/2) is the
 * answer: SMULL, ADD, SUB, CMP and a branch. Otherwise (probability about 2G / 2^32) kiln_fc_rq
 * decides. c1 = 2^31 + G, c2 = 2^32 - 2G (c2 = 0: always kiln_fc_rq).
 *
 * kiln_fc_mv_s8_fx / kiln_fc_mv_s8_b_fx requantise as TensorFlow Lite Micro's FULLY_CONNECTED
 * (the dense node's requant "fixed"): MultiplyByQuantizedMultiplier as the conv kernels compute
 * it (ops_dense.fixed_constants): c1 = 1, rq = {multiplier, 2^(e-1), e} per channel, the SMMULR
 * form kiln_dw_requant(2 * acc, ...) where the compile-time bound on |acc| makes it exact (every
 * right shift e >= 1, schedules.requant_bound_ok); else c1 = 0, rq = {multiplier, left shift,
 * minus the right shift}, kiln_mbqm. m and c2 are unused.
 */
#ifndef KILN_DENSE_H
#define KILN_DENSE_H

#include <stdint.h>

#if KILN_HAVE_DSP && defined(__thumb2__)
#define KILN_DENSE_ASM 1
/* one group: 4 inputs (r0), 4 columns' weights (r1), accumulators r4-r7 */
#define KILN_DENSE_STEP                                                           \
    "ldr r12, [r0], #4\n\t"                                                       \
    "ldmia r1!, {r8, r9, r10, r11}\n\t"                                           \
    "sxtb16 r3, r12\n\t"                                                          \
    "sxtb16 r12, r12, ror #8\n\t"                                                 \
    "sxtb16 lr, r8\n\t"                                                           \
    "sxtb16 r8, r8, ror #8\n\t"                                                   \
    "smlad r4, r3, lr, r4\n\t"                                                    \
    "smlad r4, r12, r8, r4\n\t"                                                   \
    "sxtb16 lr, r9\n\t"                                                           \
    "sxtb16 r9, r9, ror #8\n\t"                                                   \
    "smlad r5, r3, lr, r5\n\t"                                                    \
    "smlad r5, r12, r9, r5\n\t"                                                   \
    "sxtb16 lr, r10\n\t"                                                          \
    "sxtb16 r10, r10, ror #8\n\t"                                                 \
    "smlad r6, r3, lr, r6\n\t"                                                    \
    "smlad r6, r12, r10, r6\n\t"                                                  \
    "sxtb16 lr, r11\n\t"                                                          \
    "sxtb16 r11, r11, ror #8\n\t"                                                 \
    "smlad r7, r3, lr, r7\n\t"                                                    \
    "smlad r7, r12, r11, r7\n\t"

/* acc[j] = bias[j] + sum_{k < 4g} x[k] * W[j][k], j < 4, g = (xend - x) / 4 groups (g may be 0),
 * w pointing at the block's 4 int32 biases, the weights after them. Hand-scheduled:
 * the loop needs 14 registers (4 accumulators, 2 input lanes, 4 weight words, a temporary and 3
 * pointers), more than gcc keeps free around it. g % 4 groups first (the flags of LSLS #29 carry
 * bits 2 and 3 of 4g through the steps, which set none), then 4 groups per iteration. */
#define KILN_UNUSED_ARG __attribute__((unused))
static __attribute__((naked, noinline, unused)) void kiln_dense_dot4(KILN_UNUSED_ARG const int8_t *x,
                                                                     KILN_UNUSED_ARG const int8_t *w,
                                                                     KILN_UNUSED_ARG const int8_t *xend,
                                                                     KILN_UNUSED_ARG int32_t *acc)
{
    __asm__ volatile(
        ".syntax unified\n\t"
        "push {r3, r4, r5, r6, r7, r8, r9, r10, r11, lr}\n\t"
        "ldmia r1!, {r4, r5, r6, r7}\n\t"
        "subs r3, r2, r0\n\t"
        "lsls r3, r3, #29\n\t"
        "bpl 1f\n\t"
        KILN_DENSE_STEP
        "1:\n\t"
        "bcc 2f\n\t"
        KILN_DENSE_STEP
        KILN_DENSE_STEP
        "2:\n\t"
        "cmp r0, r2\n\t"
        "beq 4f\n\t"
        "3:\n\t"
        KILN_DENSE_STEP
        KILN_DENSE_STEP
        KILN_DENSE_STEP
        KILN_DENSE_STEP
        "cmp r0, r2\n\t"
        "bne 3b\n\t"
        "4:\n\t"
        "pop {r3}\n\t"
        "stm r3, {r4, r5, r6, r7}\n\t"
        "pop {r4, r5, r6, r7, r8, r9, r10, r11, pc}\n\t");
}
#endif

/* the same sums in C (every core): bias then g groups of 4 inputs against a 4-column block */
static inline void kiln_dense_dot4_c(const int8_t *x, const int8_t *w, int32_t g, int32_t *acc)
{
    int32_t s[4];
    __builtin_memcpy(s, w, sizeof s);
    w += 16;
    for (int32_t i = 0; i < g; ++i, x += 4, w += 16) {
        const int32_t x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
        for (int32_t j = 0; j < 4; ++j) {
            s[j] += x0 * w[4 * j] + x1 * w[4 * j + 1] + x2 * w[4 * j + 2] + x3 * w[4 * j + 3];
        }
    }
    __builtin_memcpy(acc, s, sizeof s);
}

/* kiln_fc_rq limited to [-2^16, 2^16] (beyond that every output clamps the same way, and q + zy
 * cannot overflow); out of line: the rare case */
static __attribute__((noinline, unused)) int32_t kiln_dense_rq_exact(int32_t acc, const int32_t *rq)
{
    const int32_t q = kiln_fc_rq(acc, (uint32_t)rq[0], (uint32_t)rq[1], rq[2]);
    return q > 65536 ? 65536 : (q < -65536 ? -65536 : q);
}

/* round(double(acc) * eff), or a value beyond int8 with the same sign: the fast path described
 * above (|result| < 2^30 there: |acc| < 2^31, eff < 1/2), else kiln_dense_rq_exact (rq = {mh, ml,
 * s} of eff, frontend/ops/nn.py: fc_requant_constants) */
static inline int32_t kiln_dense_rq(int32_t acc, int32_t m, const int32_t *rq, uint32_t c1, uint32_t c2)
{
    const int64_t p = (int64_t)acc * m;
    const uint32_t plo = (uint32_t)p;
    if (__builtin_expect((uint32_t)(plo - c1) < c2, 1)) {
        return (int32_t)(p >> 32) + (int32_t)(plo >> 31);
    }
    return kiln_dense_rq_exact(acc, rq);
}

/* TensorFlow Lite Micro's requantisation (form 1: kiln_dw_requant, |q| < 2^30; form 0: kiln_mbqm,
 * limited to [-2^16, 2^16] as above) */
static inline int32_t kiln_dense_rq_fx(int32_t acc, const int32_t *rq, uint32_t form)
{
    if (form) {
        return kiln_dw_requant(2 * acc, rq[0], rq[1], rq[2]);
    }
    const int32_t q = kiln_mbqm(acc, rq[0], rq[1], rq[2]);
    return q > 65536 ? 65536 : (q < -65536 ? -65536 : q);
}

/* one channel's requantisation: kiln_dense_rq, or kiln_dense_rq_fx when fx (a constant) */
static inline __attribute__((always_inline)) int32_t kiln_dense_q(int32_t acc, int32_t m, const int32_t *rq,
                                                                  uint32_t c1, uint32_t c2, const int fx)
{
    return fx ? kiln_dense_rq_fx(acc, rq, c1) : kiln_dense_rq(acc, m, rq, c1, c2);
}

/* q + zy clamped to [lo, hi] (-128 <= lo <= hi <= 127; |q| <= 2^30) */
static inline int32_t kiln_dense_out(int32_t q, int32_t zy, int32_t lo, int32_t hi)
{
    const int32_t v = q + zy;
    return v < lo ? lo : (v > hi ? hi : v);
}

/* four outputs -> y[0..3] (lo4 / hi4: lo / hi in each byte) */
#if KILN_HAVE_DSP
/* SSAT #8, the four bytes inserted into one word (BFI), then, unless [lo, hi] is the whole int8
 * range, the clamp per byte: SSUB8 sets the GE flags where v >= lo (then hi >= v), SEL keeps v */
static inline void kiln_dense_out4(int32_t q0, int32_t q1, int32_t q2, int32_t q3, int32_t zy, int32_t lo, int32_t hi,
                                   uint32_t lo4, uint32_t hi4, int8_t *y)
{
    uint32_t v = (uint32_t)__ssat(q0 + zy, 8), t;
    __asm__("bfi %0, %1, #8, #8\n\tbfi %0, %2, #16, #8\n\tbfi %0, %3, #24, #8"
            : "+r"(v) : "r"(__ssat(q1 + zy, 8)), "r"(__ssat(q2 + zy, 8)), "r"(__ssat(q3 + zy, 8)));
    if (lo > -128 || hi < 127) {
        __asm__("ssub8 %1, %0, %2\n\tsel %0, %0, %2\n\tssub8 %1, %3, %0\n\tsel %0, %0, %3"
                : "+r"(v), "=&r"(t) : "r"(lo4), "r"(hi4) : "cc");
    }
    __builtin_memcpy(y, &v, sizeof v);
}
#else
static inline void kiln_dense_out4(int32_t q0, int32_t q1, int32_t q2, int32_t q3, int32_t zy, int32_t lo, int32_t hi,
                                   uint32_t lo4, uint32_t hi4, int8_t *y)
{
    (void)lo4, (void)hi4;
    y[0] = (int8_t)kiln_dense_out(q0, zy, lo, hi);
    y[1] = (int8_t)kiln_dense_out(q1, zy, lo, hi);
    y[2] = (int8_t)kiln_dense_out(q2, zy, lo, hi);
    y[3] = (int8_t)kiln_dense_out(q3, zy, lo, hi);
}
#endif

/* y[r, n] = requant(bias[n] + sum_k x[r, k] * w[n, k]) for r < rows: x int8 [rows, K], w the
 * packed stream above (biases with the zero point folded), m int32 [N] or [1] (mstep 1 or 0) the
 * fast-path multipliers, rq int32 [N][3] or [1][3] the exact constants; b: NULL, or the int32 [N]
 * biases (zero point folded) added to the stream's (then zero): the time steps of an unrolled
 * RNN share one weight stream, each step with its own zero point passes its own biases; fx: the
 * fixed-point requantisation (m unused, rq as kiln_dense_rq_fx takes it) */
static inline __attribute__((always_inline)) void kiln_fc_mv_body(const int8_t *x, int32_t rows, int32_t K,
                                                                  int32_t N, const int8_t *w, const int32_t *b,
                                                                  const int32_t *m, const int32_t *rq,
                                                                  int32_t mstep, uint32_t c1, uint32_t c2,
                                                                  int32_t zy, int32_t lo, int32_t hi, int8_t *y,
                                                                  const int fx)
{
    const int32_t g = K >> 2, tail = K & 3, gp = (K + 3) >> 2, N4 = N & ~3;
    const uint32_t lo4 = 0x01010101u * ((uint32_t)lo & 0xFFu), hi4 = 0x01010101u * ((uint32_t)hi & 0xFFu);
    for (int32_t r = 0; r < rows; ++r, x += K, y += N) {
        const int8_t *wb = w;
        for (int32_t n = 0; n < N4; n += 4, wb += 16 + 16 * gp) {
            int32_t acc[4];
#ifdef KILN_DENSE_ASM
            kiln_dense_dot4(x, wb, x + 4 * g, acc);
#else
            kiln_dense_dot4_c(x, wb, g, acc);
#endif
            for (int32_t t = 0; t < tail; ++t) {
                for (int32_t j = 0; j < 4; ++j) {
                    acc[j] += x[4 * g + t] * wb[16 + 16 * g + 4 * j + t];
                }
            }
            if (b != 0) {           /* modulo 2^32, as the accumulator from the stream's bias */
                for (int32_t j = 0; j < 4; ++j) {
                    acc[j] = (int32_t)((uint32_t)acc[j] + (uint32_t)b[n + j]);
                }
            }
            const int32_t ms = fx ? 0 : mstep, *mc = m + ms * n, *rc = rq + 3 * mstep * n;
            const int32_t q0 = kiln_dense_q(acc[0], mc[0], rc, c1, c2, fx);
            const int32_t q1 = kiln_dense_q(acc[1], mc[ms], rc + 3 * mstep, c1, c2, fx);
            const int32_t q2 = kiln_dense_q(acc[2], mc[2 * ms], rc + 6 * mstep, c1, c2, fx);
            const int32_t q3 = kiln_dense_q(acc[3], mc[3 * ms], rc + 9 * mstep, c1, c2, fx);
            kiln_dense_out4(q0, q1, q2, q3, zy, lo, hi, lo4, hi4, y + n);
        }
        for (int32_t n = N4; n < N; ++n, wb += 4 + 4 * gp) {
            int32_t acc;
            __builtin_memcpy(&acc, wb, sizeof acc);
            for (int32_t k = 0; k < K; ++k) {
                acc += x[k] * wb[4 + k];
            }
            if (b != 0) {
                acc = (int32_t)((uint32_t)acc + (uint32_t)b[n]);
            }
            const int32_t c = mstep * n;
            y[n] = (int8_t)kiln_dense_out(kiln_dense_q(acc, m[fx ? 0 : c], rq + 3 * c, c1, c2, fx), zy, lo, hi);
        }
    }
}

/* the layer, its biases in the stream */
static __attribute__((noinline, unused)) void kiln_fc_mv_s8(const int8_t *x, int32_t rows, int32_t K, int32_t N,
                                                            const int8_t *w, const int32_t *m, const int32_t *rq,
                                                            int32_t mstep, uint32_t c1, uint32_t c2, int32_t zy,
                                                            int32_t lo, int32_t hi, int8_t *y)
{
    kiln_fc_mv_body(x, rows, K, N, w, 0, m, rq, mstep, c1, c2, zy, lo, hi, y, 0);
}

/* the layer with its own biases b [N] beside a stream whose biases are zero (shared weights) */
static __attribute__((noinline, unused)) void kiln_fc_mv_s8_b(const int8_t *x, int32_t rows, int32_t K, int32_t N,
                                                              const int8_t *w, const int32_t *b, const int32_t *m,
                                                              const int32_t *rq, int32_t mstep, uint32_t c1,
                                                              uint32_t c2, int32_t zy, int32_t lo, int32_t hi,
                                                              int8_t *y)
{
    kiln_fc_mv_body(x, rows, K, N, w, b, m, rq, mstep, c1, c2, zy, lo, hi, y, 0);
}

/* the two above with TensorFlow Lite Micro's requantisation (rq: ops_dense.fixed_constants) */
static __attribute__((noinline, unused)) void kiln_fc_mv_s8_fx(const int8_t *x, int32_t rows, int32_t K, int32_t N,
                                                               const int8_t *w, const int32_t *m, const int32_t *rq,
                                                               int32_t mstep, uint32_t c1, uint32_t c2, int32_t zy,
                                                               int32_t lo, int32_t hi, int8_t *y)
{
    kiln_fc_mv_body(x, rows, K, N, w, 0, m, rq, mstep, c1, c2, zy, lo, hi, y, 1);
}

static __attribute__((noinline, unused)) void kiln_fc_mv_s8_b_fx(const int8_t *x, int32_t rows, int32_t K, int32_t N,
                                                                 const int8_t *w, const int32_t *b, const int32_t *m,
                                                                 const int32_t *rq, int32_t mstep, uint32_t c1,
                                                                 uint32_t c2, int32_t zy, int32_t lo, int32_t hi,
                                                                 int8_t *y)
{
    kiln_fc_mv_body(x, rows, K, N, w, b, m, rq, mstep, c1, c2, zy, lo, hi, y, 1);
}

#endif /* KILN_DENSE_H */
