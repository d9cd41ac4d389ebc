/* Kiln DSP intrinsics: the dot products the Cortex-M schedules call.
 *
 * On cores with the DSP extension (Cortex-M4/M7/M33/M55: __ARM_FEATURE_DSP) they use
 * SXTB16/SXTAB16 and SMLAD (two 16x16 multiply-accumulates per instruction); everywhere else
 * (host builds, Cortex-M0+/M3) the portable C versions below compute the same int32 results.
 * Both are exact: |x + offset| <= 255 fits a 16-bit lane and products accumulate in int32,
 * as in TFLite's reference kernels.
 */
#ifndef KILN_INTRINSICS_H
#define KILN_INTRINSICS_H

#include <stdint.h>
#include <string.h>

/* KILN_OPTIMIZE_SIZE (kernels.c sets it from `kiln compile --optimize`): 1 keeps a few helpers
 * out of line (less flash, ~1% more instructions) */
#ifndef KILN_OPTIMIZE_SIZE
#define KILN_OPTIMIZE_SIZE 0
#endif
#if KILN_OPTIMIZE_SIZE
#define KILN_SIZE_NOINLINE __attribute__((noinline, unused))
#else
#define KILN_SIZE_NOINLINE inline
#endif

#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && !defined(KILN_NO_DSP)
#include <arm_acle.h>
#define KILN_HAVE_DSP 1
#else
#define KILN_HAVE_DSP 0
#endif

/* four int8 values from any address (an unaligned LDR on Armv7-M and later). __builtin_memcpy,
 * not memcpy: firmware builds use -ffreestanding (-fno-builtin), under which a plain memcpy is
 * an out-of-line library call per load. */
static inline uint32_t kiln_read_s8x4(const int8_t *p)
{
    uint32_t v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

/* ---- dot products against weights packed at compile time (schedules.pack_w16) -------------
 * nb output channels (4, 2 or 1) share one block of the packed array; for each group of four
 * reduction indices k..k+3 the block holds, channel after channel, the int16 values
 * {w[k], w[k+2], w[k+1], w[k+3]}: exactly the lanes SXTAB16 produces from one input word and its
 * ROR #8, so the inner loop is one input load + two SXTAB16 shared by the nb channels, then per
 * channel one 8-byte weight load and two SMLADs (two MACs per instruction). The n % 4 tail
 * follows as one 4-slot group per channel {w[k], w[k+1], w[k+2], 0}. Blocks start 8-byte
 * aligned (the arrays are 16-byte aligned and every block is a multiple of 8 bytes). */
static inline int32_t kiln_w16_at(const int8_t *w, int32_t i)
{
    int16_t v;
    __builtin_memcpy(&v, w + 2 * i, sizeof v);
    return v;
}

#if KILN_HAVE_DSP
/* SXTB16/SXTAB16 with their built-in ROR #8 (one instruction; gcc emits a separate ROR) */
static inline uint32_t kiln_sxtb16_ror8(uint32_t x)
{
    uint32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(x));
    return r;
}

static inline uint32_t kiln_sxtab16_ror8(uint32_t acc, uint32_t x)
{
    uint32_t r;
    __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(acc), "r"(x));
    return r;
}

/* two words of a packed weight block (8-byte aligned, read-only flash/RAM constants) with one
 * LDRD; gcc does not pair the two loads itself */
#define KILN_LDRD(LO, HI, P, OFF) __asm__("ldrd %0, %1, [%2, %3]" : "=r"(LO), "=r"(HI) : "r"(P), "i"(OFF))
#define KILN_DOTW_STEP(S, J)                                                      \
    do {                                                                          \
        uint32_t wlo_, whi_;                                                      \
        KILN_LDRD(wlo_, whi_, w, 8 * (J));                                        \
        S = (int32_t)__smlad(a02, wlo_, S);                                       \
        S = (int32_t)__smlad(a13, whi_, S);                                       \
    } while (0)
/* a_offset is a compile-time constant at every call site: the branch folds away */
#define KILN_DOTW_PREP()                                                          \
    const uint32_t av = kiln_read_s8x4(a + i);                                    \
    const uint32_t a02 = zero_ ? __sxtb16(av) : __sxtab16(off2, av);      \
    const uint32_t a13 = zero_ ? kiln_sxtb16_ror8(av) : kiln_sxtab16_ror8(off2, av)
#else
#define KILN_DOTW_STEP(S, J)                                                      \
    S += x0 * kiln_w16_at(w, 4 * (J)) + x2 * kiln_w16_at(w, 4 * (J) + 1)         \
       + x1 * kiln_w16_at(w, 4 * (J) + 2) + x3 * kiln_w16_at(w, 4 * (J) + 3)
#define KILN_DOTW_PREP()                                                          \
    const int32_t x0 = (int32_t)a[i] + a_offset, x1 = (int32_t)a[i + 1] + a_offset; \
    const int32_t x2 = (int32_t)a[i + 2] + a_offset, x3 = (int32_t)a[i + 3] + a_offset
#endif
#if KILN_HAVE_DSP
#define KILN_DOTW_OFF2 const uint32_t off2 = ((uint32_t)a_offset & 0xFFFFu) | ((uint32_t)a_offset << 16)
#else
#define KILN_DOTW_OFF2 (void)0
#endif
#define KILN_DOTW_TAIL(S, J)                                                      \
    for (int32_t t = 0; t < n - i; ++t) {                                         \
        S += ((int32_t)a[i + t] + a_offset) * kiln_w16_at(w, 4 * (J) + t);       \
    }

/* acc[j] += sum_{k < n} (a[k] + a_offset) * W[j][k], j < NB, W packed as above. The loops are
 * out-of-line functions (one call per pixel and channel block): inlined into a kernel's loop
 * nest they run out of registers and spill. ZERO: a variant for a_offset == 0 (the zero point
 * folded into the bias at compile time), where plain SXTB16 does. */
#define KILN_DOTW_ACC4(X) X(0) X(1) X(2) X(3)
#define KILN_DOTW_ACC2(X) X(0) X(1)
#define KILN_DOTW_ACC1(X) X(0)
#define KILN_DOTW_LD(J) int32_t s##J = acc[J];
#define KILN_DOTW_ST(J) acc[J] = s##J;
#define KILN_DOTW_MAC(J) KILN_DOTW_STEP(s##J, J);
#define KILN_DOTW_TL(J) KILN_DOTW_TAIL(s##J, J)
/* one dot-product function: ALIGN, the packed weights' alignment; STEP, their bytes per group of 4
 * reduction indices; MACS, the group's multiply-accumulates; TL(J), channel J's n % 4 tail */
#define KILN_DEF_DOT(NB, NAME, ZERO, ALIGN, STEP, MACS, TL)                                    \
    static __attribute__((noinline, unused)) void NAME(const int8_t *a, const int8_t *wp, int32_t n, \
                                                       int32_t a_offset, int32_t *acc)           \
    {                                                                                        \
        const int8_t *w = (const int8_t *)__builtin_assume_aligned(wp, ALIGN);               \
        const int zero_ = (ZERO);                                                            \
        int32_t i = 0;                                                                       \
        KILN_DOTW_ACC##NB(KILN_DOTW_LD)                                                      \
        KILN_DOTW_OFF2;                                                                      \
        (void)zero_;                                                                         \
        if (zero_) {                                                                         \
            a_offset = 0;                                                                    \
        }                                                                                    \
        for (; i + 4 <= n; i += 4, w += STEP) {                                              \
            KILN_DOTW_PREP();                                                                \
            MACS                                                                             \
        }                                                                                    \
        KILN_DOTW_ACC##NB(TL)                                                                \
        KILN_DOTW_ACC##NB(KILN_DOTW_ST)                                                      \
    }
#define KILN_DEF_DOTW(NB, NAME, ZERO) \
    KILN_DEF_DOT(NB, NAME, ZERO, 8, 8 * (NB), KILN_DOTW_ACC##NB(KILN_DOTW_MAC), KILN_DOTW_TL)
KILN_DEF_DOTW(4, kiln_dot4_w16_z, 1)
KILN_DEF_DOTW(4, kiln_dot4_w16_o, 0)
KILN_DEF_DOTW(2, kiln_dot2_w16_z, 1)
KILN_DEF_DOTW(2, kiln_dot2_w16_o, 0)
KILN_DEF_DOTW(1, kiln_dot1_w16_z, 1)
KILN_DEF_DOTW(1, kiln_dot1_w16_o, 0)

/* ---- dot products against int8 weights (schedules.pack_w8, half the flash of _w16) ----------
 * Per block of NB channels, per group of four reduction indices, channel after channel the four
 * int8 weights in natural order; the n % 4 tail as one zero-padded 4-byte group per channel.
 * SXTB16 of a weight word gives {w0, w2} and SXTB16 ROR #8 gives {w1, w3}: the same lane order as
 * the input, so per 4 MACs and channel: half an LDRD, two SXTB16, two SMLAD. */
#if KILN_HAVE_DSP
#define KILN_DOTW8_PAIR(SA, SB, J)                                                \
    do {                                                                          \
        uint32_t wa_, wb_;                                                        \
        KILN_LDRD(wa_, wb_, w, 4 * (J));                                          \
        SA = (int32_t)__smlad(a02, __sxtb16(wa_), SA);                            \
        SA = (int32_t)__smlad(a13, kiln_sxtb16_ror8(wa_), SA);                    \
        SB = (int32_t)__smlad(a02, __sxtb16(wb_), SB);                            \
        SB = (int32_t)__smlad(a13, kiln_sxtb16_ror8(wb_), SB);                    \
    } while (0)
#define KILN_DOTW8_ONE(S, J)                                                      \
    do {                                                                          \
        const uint32_t wa_ = kiln_read_s8x4(w + 4 * (J));                         \
        S = (int32_t)__smlad(a02, __sxtb16(wa_), S);                              \
        S = (int32_t)__smlad(a13, kiln_sxtb16_ror8(wa_), S);                      \
    } while (0)
#else
#define KILN_DOTW8_ONE(S, J)                                                      \
    S += x0 * (int32_t)w[4 * (J)] + x1 * (int32_t)w[4 * (J) + 1]                  \
       + x2 * (int32_t)w[4 * (J) + 2] + x3 * (int32_t)w[4 * (J) + 3]
#define KILN_DOTW8_PAIR(SA, SB, J)                                                \
    do {                                                                          \
        KILN_DOTW8_ONE(SA, J);                                                    \
        KILN_DOTW8_ONE(SB, (J) + 1);                                              \
    } while (0)
#endif
#define KILN_DOTW8_MAC4 KILN_DOTW8_PAIR(s0, s1, 0); KILN_DOTW8_PAIR(s2, s3, 2);
#define KILN_DOTW8_MAC2 KILN_DOTW8_PAIR(s0, s1, 0);
#define KILN_DOTW8_MAC1 KILN_DOTW8_ONE(s0, 0);
#define KILN_DOTW8_TAIL(S, J)                                                     \
    for (int32_t t = 0; t < n - i; ++t) {                                         \
        S += ((int32_t)a[i + t] + a_offset) * (int32_t)w[4 * (J) + t];            \
    }
#define KILN_DOTW8_TL(J) KILN_DOTW8_TAIL(s##J, J)
#define KILN_DEF_DOTW8(NB, NAME, ZERO) \
    KILN_DEF_DOT(NB, NAME, ZERO, 4 * (NB), 4 * (NB), KILN_DOTW8_MAC##NB, KILN_DOTW8_TL)
KILN_DEF_DOTW8(4, kiln_dot4_w8_z, 1)
KILN_DEF_DOTW8(4, kiln_dot4_w8_o, 0)
KILN_DEF_DOTW8(2, kiln_dot2_w8_z, 1)
KILN_DEF_DOTW8(2, kiln_dot2_w8_o, 0)
KILN_DEF_DOTW8(1, kiln_dot1_w8_z, 1)
KILN_DEF_DOTW8(1, kiln_dot1_w8_o, 0)

/* kiln_dot{4,2,1}_w{8,16}: the zero-offset variant when a_offset is 0 (a compile-time constant at
 * every call site, so the branch folds away) */
#define KILN_DEF_DOT_PICK(NAME)                                                                  \
    static inline void NAME(const int8_t *a, const int8_t *w, int32_t n, int32_t a_offset, int32_t *acc) \
    {                                                                                        \
        if (a_offset == 0) NAME##_z(a, w, n, 0, acc); else NAME##_o(a, w, n, a_offset, acc);  \
    }
KILN_DEF_DOT_PICK(kiln_dot4_w8)
KILN_DEF_DOT_PICK(kiln_dot2_w8)
KILN_DEF_DOT_PICK(kiln_dot1_w8)
KILN_DEF_DOT_PICK(kiln_dot4_w16)
KILN_DEF_DOT_PICK(kiln_dot2_w16)
KILN_DEF_DOT_PICK(kiln_dot1_w16)

/* ---- depthwise conv (depth multiplier 1), one output pixel: schedules.pack_dw / ops_nn --------
 * Weights packed at compile time as int16, per block of 4 channels, per tap (kh, kw) row-major:
 * {w[c0], w[c2], w[c1], w[c3]}: one LDRD gives the lanes SXTAB16 produces from one input word
 * (channels c0, c2) and its ROR #8 (c1, c3), so a tap of 4 channels is one input load, one
 * LDRD, two SXTAB16 and four SMLABB/SMLATT (the input offset rides in SXTAB16).
 * x: the pixel's first in-bounds tap (channel 0); nh x nw in-bounds taps, row_step / col_step
 * bytes apart in the input; w: the packed weights at that tap of channel block 0, w_row bytes per
 * kernel row, w_block bytes per channel block. q: per block of 4 channels
 * {2 * bias x4, multiplier x4, half + (zy << shift) x4, right shift x4}; weights are stored
 * doubled too, so the accumulator is 2 * acc. Requantisation: gemmlowp's
 * SaturatingRoundingDoublingHighMul is exactly (acc * m + 2^30) >> 31 (m > 0, so no saturation,
 * and floor((p + 2^30) / 2^31) equals its truncating form with the -2^30+1 nudge), which is
 * SMMULR(2 * acc, m) = (2 * acc * m + 2^31) >> 32; TFLite's RoundingDivideByPOT for shift >= 1,
 * plus the output zero point, is exactly (v + half + (zy << shift) - (v < 0)) >> shift when that
 * sum cannot overflow (schedules.dw_dsp_ok checks the accumulator bound at compile time). The
 * activation clamp [lo, hi] lies inside [-128, 127], so SSAT #8 then the clamp is exact. */
#if KILN_HAVE_DSP
/* SMMULR and PKHBT (not in gcc 12's arm_acle.h) */
static inline int32_t kiln_smmulr(int32_t a, int32_t b)
{
    int32_t r;
    __asm__("smmulr %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

static inline uint32_t kiln_pkhbt16(uint32_t lo, uint32_t hi)
{
    uint32_t r;
    __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(r) : "r"(lo), "r"(hi));
    return r;
}
#endif

static inline int32_t kiln_clamp_i32(int32_t v, int32_t lo, int32_t hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* TFLite's MultiplyByQuantizedMultiplier(acc, m, shift) for any int32 acc: SRDHM(acc << lsh, m)
 * (gemmlowp's SaturatingRoundingDoublingHighMul: round half away from zero, INT32_MIN * INT32_MIN
 * saturates), then RoundingDivideByPOT by -rneg; lsh = max(shift, 0), rneg = min(shift, 0) */
static inline int32_t kiln_mbqm(int32_t acc, int32_t mult, int32_t lsh, int32_t rneg)
{
    const int32_t a = (int32_t)((uint32_t)acc << lsh);   /* TFLite: x * (1 << left), wrapping */
    /* gemmlowp's (ab + nudge) / 2^31, nudge 2^30 or 1 - 2^30 by the sign of ab, truncating, is
     * floor((ab + 2^30) / 2^31) for every ab: one arithmetic shift (SMLAL and two shifts on the M4) */
    const int32_t v = a == INT32_MIN && mult == INT32_MIN ? INT32_MAX
                                                         : (int32_t)(((int64_t)a * mult + (1LL << 30)) >> 31);
    const int32_t e = -rneg;
    if (e == 0) {
        return v;
    }
    const int32_t mask = (int32_t)((1u << e) - 1u);
    const int32_t rem = v & mask;
    const int32_t thr = (mask >> 1) + (v < 0 ? 1 : 0);
    return (v >> e) + (rem > thr ? 1 : 0);
}

/* acc2 = 2 * acc (weights and bias are stored doubled): (acc2 * m + 2^31) >> 32 is SMMULR. */
static inline int32_t kiln_dw_requant(int32_t acc2, int32_t mult, int32_t halfz, int32_t shift)
{
#if KILN_HAVE_DSP
    const int32_t v = kiln_smmulr(acc2, mult);
#else
    const int32_t v = (int32_t)(((int64_t)acc2 * mult + (1LL << 31)) >> 32);
#endif
    return (v + halfz + (v >> 31)) >> shift;
}

/* One conv/dense output (ops_nn.requant_epilogue, when schedules.requant_bound_ok holds):
 * acc + bias -> int8 in [lo, hi], the same exact shortcuts as kiln_dw_s8 with the doubling done
 * here (|acc| < 2^30 is checked at compile time). halfz = half + (zy << shift). */
static inline int32_t kiln_rq_s8(int32_t acc, int32_t mult, int32_t halfz, int32_t shift, int32_t lo, int32_t hi)
{
    return kiln_clamp_i32(kiln_dw_requant(acc * 2, mult, halfz, shift), lo, hi);
}

/* four requantised outputs -> int8 clamped to [lo, hi], bytes y0 y1 y2 y3 of one word */
static inline uint32_t kiln_pack4_clamp(int32_t y0, int32_t y1, int32_t y2, int32_t y3, int32_t lo, int32_t hi)
{
#if KILN_HAVE_DSP
    const uint32_t lo4 = ((uint32_t)lo & 0xFFu) * 0x01010101u, hi4 = ((uint32_t)hi & 0xFFu) * 0x01010101u;
    const uint32_t t02 = __uxtb16(kiln_pkhbt16((uint32_t)__ssat(y0, 8), (uint32_t)__ssat(y2, 8)));
    const uint32_t t13 = __uxtb16(kiln_pkhbt16((uint32_t)__ssat(y1, 8), (uint32_t)__ssat(y3, 8)));
    uint32_t packed = t02 | (t13 << 8);
    if (lo == -128 && hi == 127) {
        return packed;   /* SSAT #8 was the whole clamp (loop-invariant; folds in constant-propagated copies) */
    }
    (void)__ssub8(packed, lo4);
    packed = __sel(packed, lo4);
    (void)__ssub8(hi4, packed);
    return __sel(packed, hi4);
#else
    return ((uint32_t)kiln_clamp_i32(y0, lo, hi) & 0xFFu) | (((uint32_t)kiln_clamp_i32(y1, lo, hi) & 0xFFu) << 8) |
           (((uint32_t)kiln_clamp_i32(y2, lo, hi) & 0xFFu) << 16) | ((uint32_t)kiln_clamp_i32(y3, lo, hi) << 24);
#endif
}

#if KILN_HAVE_DSP
#define KILN_DW_TAP(XP, WP, WO)                                                     \
    do {                                                                          \
        const uint32_t xv_ = kiln_read_s8x4(XP);                                  \
        const uint32_t x02_ = __sxtab16(off2, xv_);                               \
        const uint32_t x13_ = kiln_sxtab16_ror8(off2, xv_);                       \
        uint32_t w02_, w13_;                                                      \
        KILN_LDRD(w02_, w13_, (WP), (WO));                                       \
        s0 = __smlabb((int32_t)x02_, (int32_t)w02_, s0);                          \
        s2 = __smlatt((int32_t)x02_, (int32_t)w02_, s2);                          \
        s1 = __smlabb((int32_t)x13_, (int32_t)w13_, s1);                          \
        s3 = __smlatt((int32_t)x13_, (int32_t)w13_, s3);                          \
        __asm__ volatile("" ::: "memory"); /* keeps gcc from hoisting all 9 loads (spills) */ \
    } while (0)
#else
#define KILN_DW_TAP(XP, WP, WO)                                                     \
    do {                                                                          \
        const int8_t *xp_ = (XP);                                                 \
        const int8_t *wp_ = (WP) + (WO);                                            \
        s0 += ((int32_t)xp_[0] + a_offset) * kiln_w16_at(wp_, 0);                 \
        s2 += ((int32_t)xp_[2] + a_offset) * kiln_w16_at(wp_, 1);                 \
        s1 += ((int32_t)xp_[1] + a_offset) * kiln_w16_at(wp_, 2);                 \
        s3 += ((int32_t)xp_[3] + a_offset) * kiln_w16_at(wp_, 3);                 \
    } while (0)
#endif

static inline __attribute__((always_inline)) void kiln_dw_s8(const int8_t *x, int32_t col_step, int32_t row_step,
                                                         int32_t nh, int32_t nw, const int8_t *wp, int32_t w_row,
                                                         int32_t w_block, int32_t C, int32_t a_offset,
                                                         const int32_t *q, int32_t zy, int32_t lo, int32_t hi,
                                                         int8_t *y)
{
#if KILN_HAVE_DSP
    const uint32_t off2 = ((uint32_t)a_offset & 0xFFFFu) | ((uint32_t)a_offset << 16);
#endif
    (void)zy;
    const int full3 = nh == 3 && nw == 3 && w_row == 24;
    for (int32_t cb = 0; cb < C; cb += 4, x += 4, wp += w_block, q += 16, y += 4) {
        const int8_t *w = (const int8_t *)__builtin_assume_aligned(wp, 8);
        int32_t s0 = q[0], s1 = q[1], s2 = q[2], s3 = q[3];
        if (full3) {
            const int8_t *r0 = x, *r1 = x + row_step, *r2 = r1 + row_step;
            const int32_t c2 = 2 * col_step;
            KILN_DW_TAP(r0, w, 0);
            KILN_DW_TAP(r0 + col_step, w, 8);
            KILN_DW_TAP(r0 + c2, w, 16);
            KILN_DW_TAP(r1, w, 24);
            KILN_DW_TAP(r1 + col_step, w, 32);
            KILN_DW_TAP(r1 + c2, w, 40);
            KILN_DW_TAP(r2, w, 48);
            KILN_DW_TAP(r2 + col_step, w, 56);
            KILN_DW_TAP(r2 + c2, w, 64);
        } else if (nw == 3 || nw == 2) {
            /* a window clipped by the top/bottom or one side: kernel rows in a loop, their 3 or 2
             * in-bounds taps unrolled */
            const int8_t *xr = x, *wr = w;
            const int32_t c2 = 2 * col_step;
            for (int32_t i = 0; i < nh; ++i, xr += row_step, wr += w_row) {
                KILN_DW_TAP(xr, wr, 0);
                KILN_DW_TAP(xr + col_step, wr, 8);
                if (nw == 3) {
                    KILN_DW_TAP(xr + c2, wr, 16);
                }
            }
        } else {
            const int8_t *xr = x, *wr = w;
            for (int32_t i = 0; i < nh; ++i, xr += row_step, wr += w_row) {
                const int8_t *xc = xr, *wc = wr;
                for (int32_t j = 0; j < nw; ++j, xc += col_step, wc += 8) {
                    KILN_DW_TAP(xc, wc, 0);
                }
            }
        }
        const int32_t y0 = kiln_dw_requant(s0, q[4], q[8], q[12]);
        const int32_t y1 = kiln_dw_requant(s1, q[5], q[9], q[13]);
        const int32_t y2 = kiln_dw_requant(s2, q[6], q[10], q[14]);
        const int32_t y3 = kiln_dw_requant(s3, q[7], q[11], q[15]);
        const uint32_t packed = kiln_pack4_clamp(y0, y1, y2, y3, lo, hi);
        __builtin_memcpy(y, &packed, sizeof packed);
    }
}

/* floor(a / b) for b > 0 */
static inline int32_t kiln_floordiv(int32_t a, int32_t b)
{
    return a >= 0 ? a / b : -((b - 1 - a) / b);
}

/* One depthwise image (schedules.dw_dsp_extern): x (H x W x C), output oh x ow pixels at y. Each
 * output pixel runs kiln_dw_s8 (inlined) over its in-bounds taps, so the per-pixel window
 * arithmetic and the call are paid once per pixel in C, not per pixel through a 15-argument call. */
static __attribute__((noinline, unused)) void kiln_dwconv_s8(const int8_t *x, int32_t H, int32_t W, int32_t C,
                                                             int32_t KH, int32_t KW, int32_t sh, int32_t sw,
                                                             int32_t dh, int32_t dw, int32_t pt, int32_t pl,
                                                             int32_t oh, int32_t ow, int32_t zx, const int8_t *wp,
                                                             const int32_t *q, int32_t lo, int32_t hi, int8_t *y)
{
    for (int32_t i = 0; i < oh; ++i) {
        const int32_t ih0 = i * sh - pt;
        const int32_t kh0 = ih0 < 0 ? kiln_floordiv(dh - 1 - ih0, dh) : 0;
        const int32_t kh1t = kiln_floordiv(H - ih0 + dh - 1, dh);
        const int32_t kh1 = kh1t < KH ? kh1t : KH;
        for (int32_t j = 0; j < ow; ++j, y += C) {
            const int32_t iw0 = j * sw - pl;
            const int32_t kw0 = iw0 < 0 ? kiln_floordiv(dw - 1 - iw0, dw) : 0;
            const int32_t kw1t = kiln_floordiv(W - iw0 + dw - 1, dw);
            const int32_t kw1 = kw1t < KW ? kw1t : KW;
            const int8_t *xp = x + ((ih0 + kh0 * dh) * W + iw0 + kw0 * dw) * C;
            kiln_dw_s8(xp, dw * C, dh * W * C, kh1 - kh0, kw1 - kw0, wp + (kh0 * KW + kw0) * 8, KW * 8,
                       KH * KW * 8, C, -zx, q, 0, lo, hi, y);
        }
    }
}

/* ---- fused conv (groups 1, dilation 1, C_out % 2 == 0): ops_nn._conv_dsp_fused ----------------
 * One call per output row (schedules.conv_fused_extern). Output pixels go in pairs: for each
 * pair the two padded patches [KH][KW][C] (in-bounds runs copied a word at a time when C % 4 == 0,
 * out-of-bounds taps filled with the input zero point, the reduction zero-padded to a multiple
 * of 4) are written interleaved, per group of 4 reduction indices pixel 0's 4 bytes then pixel
 * 1's, and then widened to int16 once (kiln_put16), so the inner loop never sign-extends an
 * input. Then per block of 2 output channels a 2-channel x 2-pixel tile (4 accumulators; the
 * weights are int8, packed by schedules.pack_w8 with nb = 2: per group of 4 reduction indices
 * channel 0's 4 weights then channel 1's), each weight word sign-extended once (SXTB16, SXTB16
 * ROR #8) for both pixels: per 16 MACs three LDRD, four SXTB16, eight SMLAD. Odd rows end with the
 * last pixel in both slots (its outputs are written twice, to the same place).
 * q: per block of 2 channels {bias0, bias1, mult0, mult1, hz0, hz1} (int32, hz = half + (zy << e)),
 * then one byte per channel: e, the right shift (>= 1) (schedules.conv_requant_table).
 * Requantisation as kiln_dw_s8 (exact: schedules.requant_bound_ok holds, checked at compile time). */

#if KILN_HAVE_DSP
/* the four SMLADs of one weight pair (WL, WH: lanes {0,2} and {1,3}) against both pixels */
#define KILN_D22_MACS(WL, WH, S0, S1)                                             \
    S0 = (int32_t)__smlad(a0l_, (WL), S0);                                        \
    S0 = (int32_t)__smlad(a0h_, (WH), S0);                                        \
    S1 = (int32_t)__smlad(a1l_, (WL), S1);                                        \
    S1 = (int32_t)__smlad(a1h_, (WH), S1)
/* group G of the widened pair (kiln_put16: 16 bytes, pixel 0's {x0, x2} {x1, x3} then
 * pixel 1's): two LDRDs, no sign extension in the inner loop */
#define KILN_D22_INPUT(G)                                                         \
    uint32_t a0l_, a0h_, a1l_, a1h_, w0_, w1_;                                    \
    KILN_LDRD(a0l_, a0h_, a, 16 * (G));                                           \
    KILN_LDRD(a1l_, a1h_, a, 16 * (G) + 8)
/* int8 weights (pack_w8, nb = 2): each weight word sign-extended once for both pixels */
#define KILN_D22_STEP(G)                                                          \
    do {                                                                          \
        KILN_D22_INPUT(G);                                                        \
        KILN_LDRD(w0_, w1_, w, 8 * (G));                                          \
        KILN_D22_MACS(__sxtb16(w0_), kiln_sxtb16_ror8(w0_), s00, s10);            \
        KILN_D22_MACS(__sxtb16(w1_), kiln_sxtb16_ror8(w1_), s01, s11);            \
    } while (0)
/* int16 weights (pack_w16, nb = 2: per group of 4 reduction indices and channel
 * {w[k], w[k+2], w[k+1], w[k+3]}, the lanes of the widened input) */
#define KILN_D22W_STEP(G)                                                         \
    do {                                                                          \
        KILN_D22_INPUT(G);                                                        \
        KILN_LDRD(w0_, w1_, w, 16 * (G));                                         \
        KILN_D22_MACS(w0_, w1_, s00, s10);                                        \
        KILN_LDRD(w0_, w1_, w, 16 * (G) + 8);                                     \
        KILN_D22_MACS(w0_, w1_, s01, s11);                                        \
    } while (0)
#else
/* portable: the widened pair holds, per group, pixel 0's int16 {x0, x2, x1, x3} then pixel 1's;
 * WAT(B, t) is weight t of the 4-group at B (channel 0 at B, channel 1 at B + 4) */
#define KILN_PERM4(T) ((T) == 1 ? 2 : (T) == 2 ? 1 : (T))   /* {0,2,1,3} */
#define KILN_D22_C(G, WAT)                                                        \
    do {                                                                          \
        for (int32_t t_ = 0; t_ < 4; ++t_) {                                      \
            const int32_t x0_ = kiln_w16_at(a, 8 * (G) + KILN_PERM4(t_));         \
            const int32_t x1_ = kiln_w16_at(a, 8 * (G) + 4 + KILN_PERM4(t_));     \
            const int32_t v0_ = WAT(8 * (G), t_), v1_ = WAT(8 * (G) + 4, t_);     \
            s00 += x0_ * v0_;                                                     \
            s01 += x0_ * v1_;                                                     \
            s10 += x1_ * v0_;                                                     \
            s11 += x1_ * v1_;                                                     \
        }                                                                         \
    } while (0)
#define KILN_W8_AT(B, T) ((int32_t)w[(B) + (T)])
#define KILN_W16_AT(B, T) kiln_w16_at(w, (B) + KILN_PERM4(T))
#define KILN_D22_STEP(G) KILN_D22_C(G, KILN_W8_AT)
#define KILN_D22W_STEP(G) KILN_D22_C(G, KILN_W16_AT)
#endif

/* All O output channels of one pixel pair, 2 at a time. a: the widened patch pair
 * (kiln_put16, 8-byte aligned); w: the packed weights (8-byte aligned, channel blocks
 * contiguous, so w just runs on); n: the padded reduction length (a multiple of 4); q: per block
 * {bias0, bias1, mult0, mult1, hz0, hz1}; eb: one right-shift byte per channel; writes y0[0..O-1]
 * and y1[0..O-1]. The channel loop is inside (one call per pixel pair, not per channel block:
 * ~30 instructions of call overhead saved per block). */
#define KILN_DEF_DOT2X2RQ(NAME, STEP, WSTEP, AG)                                             \
    static __attribute__((noinline, unused)) void NAME(const int8_t *ap, const int8_t *wp, int32_t n, \
                                                       const int32_t *q, const uint8_t *eb, int32_t O, \
                                                       int32_t lo, int32_t hi, int8_t *y0, int8_t *y1) \
    {                                                                                        \
        const int8_t *w = (const int8_t *)__builtin_assume_aligned(wp, 8);                   \
        for (int32_t ob = 0; ob < O; ob += 2, q += 6) {                                      \
            const int8_t *a = (const int8_t *)__builtin_assume_aligned(ap, 8);               \
            const int8_t *const end = a + (AG) / 4 * n;                                      \
            int32_t s00 = q[0], s01 = q[1], s10 = q[0], s11 = q[1];                          \
            for (; a + 4 * (AG) <= end; a += 4 * (AG), w += 4 * (WSTEP)) {                   \
                STEP(0);                                                                     \
                STEP(1);                                                                     \
                STEP(2);                                                                     \
                STEP(3);                                                                     \
            }                                                                                \
            for (; a < end; a += (AG), w += (WSTEP)) {                                       \
                STEP(0);                                                                     \
            }                                                                                \
            const int32_t m0 = q[2], m1 = q[3], h0 = q[4], h1 = q[5], e0 = eb[ob], e1 = eb[ob + 1]; \
            const uint32_t v = kiln_pack4_clamp(kiln_dw_requant(2 * s00, m0, h0, e0),                 \
                                                kiln_dw_requant(2 * s01, m1, h1, e1),                 \
                                                kiln_dw_requant(2 * s10, m0, h0, e0),                 \
                                                kiln_dw_requant(2 * s11, m1, h1, e1), lo, hi);        \
            const uint16_t v0 = (uint16_t)v, v1 = (uint16_t)(v >> 16);                       \
            __builtin_memcpy(y0 + ob, &v0, sizeof v0);                                       \
            __builtin_memcpy(y1 + ob, &v1, sizeof v1);                                       \
        }                                                                                    \
    }
KILN_DEF_DOT2X2RQ(kiln_dot2x2rq_w8, KILN_D22_STEP, 8, 16)
KILN_DEF_DOT2X2RQ(kiln_dot2x2rq_w16, KILN_D22W_STEP, 16, 16)

/* The same tile over an int8 pair (kiln_patch_s8: per group of 4 reduction indices pixel 0's 4
 * bytes then pixel 1's, 8 bytes a group) and int8 weights: each input word sign-extended here
 * (two more SXTB16 per pixel and group than the widened pair) - kiln_conv8_s8, the small-layer
 * kernel of --optimize size, which needs no widened patch (half the scratch, less code). */
#if KILN_HAVE_DSP
#define KILN_D8_STEP(G)                                                           \
    do {                                                                          \
        uint32_t v0_, v1_, w0_, w1_;                                              \
        KILN_LDRD(v0_, v1_, a, 8 * (G));                                          \
        const uint32_t a0l_ = __sxtb16(v0_), a0h_ = kiln_sxtb16_ror8(v0_);        \
        const uint32_t a1l_ = __sxtb16(v1_), a1h_ = kiln_sxtb16_ror8(v1_);        \
        KILN_LDRD(w0_, w1_, w, 8 * (G));                                          \
        KILN_D22_MACS(__sxtb16(w0_), kiln_sxtb16_ror8(w0_), s00, s10);            \
        KILN_D22_MACS(__sxtb16(w1_), kiln_sxtb16_ror8(w1_), s01, s11);            \
    } while (0)
#else
#define KILN_D8_STEP(G)                                                           \
    do {                                                                          \
        for (int32_t t_ = 0; t_ < 4; ++t_) {                                      \
            const int32_t x0_ = a[8 * (G) + t_], x1_ = a[8 * (G) + 4 + t_];       \
            const int32_t v0_ = w[8 * (G) + t_], v1_ = w[8 * (G) + 4 + t_];       \
            s00 += x0_ * v0_;                                                     \
            s01 += x0_ * v1_;                                                     \
            s10 += x1_ * v0_;                                                     \
            s11 += x1_ * v1_;                                                     \
        }                                                                         \
    } while (0)
#endif
KILN_DEF_DOT2X2RQ(kiln_dot2x2rq_w8i, KILN_D8_STEP, 8, 8)

/* n bytes into patch slot `slot` of an interleaved pair at reduction index k (see above): from
 * src (step 1) or the fill word at src repeated (step 0: src points at 4 copies of the byte).
 * A head up to the next group boundary and a tail byte by byte, whole groups a word at a time
 * (unaligned loads are fine on Armv7-M and the host), so C_in = 1 or 3 patches are not built a
 * byte at a time. Out of line under KILN_OPTIMIZE_SIZE. */
static KILN_SIZE_NOINLINE void kiln_put_s8(int8_t *pair, int32_t slot, int32_t k, const int8_t *src, int32_t step,
                                           int32_t n)
{
    int8_t *g = pair + 2 * (k & ~3) + 4 * slot;   /* this slot's 4 bytes of k's group */
    int32_t j = k & 3;
    if (j) {
        for (; n > 0 && j < 4; --n, ++j, src += step) g[j] = *src;
        g += 8;
    }
    for (; n >= 4; n -= 4, g += 8, src += 4 * step) {
        const uint32_t v = kiln_read_s8x4(src);
        __builtin_memcpy(g, &v, sizeof v);
    }
    /* the tail, n < 4 bytes, unrolled: as a loop gcc's -Waggressive-loop-optimizations saw a 5th
     * iteration in some constant-propagated copies (an error under -Werror) */
    if (n > 0) g[0] = src[0];
    if (n > 1) g[1] = src[step];
    if (n > 2) g[2] = src[2 * step];
}

/* the padded patch of the output pixel whose window starts at (ih0, iw0) into slot `slot`
 * (out of line: inlined at its two call sites it costs ~500 B of flash per model) */
static __attribute__((noinline, unused)) void kiln_patch_s8(int8_t *pair, int32_t slot, const int8_t *x, int32_t ih0, int32_t iw0, int32_t H,
                                 int32_t W, int32_t C, int32_t KH, int32_t KW, uint32_t z4, int32_t K, int32_t kp)
{
    const int32_t kw0 = iw0 < 0 ? -iw0 : 0;
    const int32_t kw1 = W - iw0 < KW ? W - iw0 : KW;
    const int32_t row = KW * C, left = kw0 * C, mid = (kw1 - kw0) * C, right = (KW - kw1) * C;
    const int8_t *xr = x + (ih0 * W + iw0 + kw0) * C;
    const int8_t *z = (const int8_t *)&z4;
    static const uint32_t zero4 = 0;
    int32_t k = 0;
    for (int32_t kh = 0; kh < KH; ++kh, k += row, xr += W * C) {
        const int32_t ih = ih0 + kh;
        if (ih < 0 || ih >= H || mid <= 0) {
            kiln_put_s8(pair, slot, k, z, 0, row);
        } else {
            if (left) kiln_put_s8(pair, slot, k, z, 0, left);
            kiln_put_s8(pair, slot, k + left, xr, 1, mid);
            if (right) kiln_put_s8(pair, slot, k + left + mid, z, 0, right);
        }
    }
    kiln_put_s8(pair, slot, K, (const int8_t *)&zero4, 0, kp - K);   /* the reduction padded to a multiple of 4 */
}

/* The widened pair: per group of 4 reduction indices, pixel 0's int16 {x0, x2, x1, x3} (the lanes
 * SXTB16 / SXTB16 ROR #8 give) then pixel 1's, 16 bytes per group, 8-byte aligned.
 * kiln_put16 widens `groups` groups of int8 (4 bytes each, `step` bytes apart at src) into one
 * slot (d: the slot's first group), each input word loaded and sign-extended once per pixel, not
 * once per channel block. */
static inline void kiln_put16(int8_t *d, const int8_t *src, int32_t step, int32_t groups)
{
    for (; groups > 0; --groups, src += step, d += 16) {
        const uint32_t v = kiln_read_s8x4(src);
#if KILN_HAVE_DSP
        const uint32_t o[2] = {__sxtb16(v), kiln_sxtb16_ror8(v)};
#else
        const int16_t o[4] = {src[0], src[2], src[1], src[3]};
        (void)v;
#endif
        __builtin_memcpy(d, o, sizeof o);
    }
}

static inline void kiln_fill16(int8_t *d, uint32_t z2, int32_t groups)
{
    const uint32_t o[2] = {z2, z2};
    for (; groups > 0; --groups, d += 16) {
        __builtin_memcpy(d, o, sizeof o);
    }
}

/* C % 4 == 0 (so KW * C and every in-bounds run are whole groups of 4 and kp == K): the padded
 * patch of the output pixel whose window starts at (ih0, iw0) straight into slot `slot` of the
 * widened pair, out-of-bounds groups filled with z2 (the input zero point in both int16 lanes). */
static __attribute__((noinline, unused)) void kiln_patch16_s8(int8_t *pair, int32_t slot, const int8_t *x, int32_t ih0,
                                                              int32_t iw0, int32_t H, int32_t W, int32_t C, int32_t KH,
                                                              int32_t KW, uint32_t z2)
{
    const int32_t kw0 = iw0 < 0 ? -iw0 : 0;
    const int32_t kw1 = W - iw0 < KW ? W - iw0 : KW;
    const int32_t g = C / 4, row = KW * g, left = kw0 * g, mid = (kw1 - kw0) * g, right = (KW - kw1) * g;
    const int8_t *xr = x + (ih0 * W + iw0 + kw0) * C;
    int8_t *d = pair + 8 * slot;
    for (int32_t kh = 0; kh < KH; ++kh, d += 16 * row, xr += W * C) {
        const int32_t ih = ih0 + kh;
        if (ih < 0 || ih >= H || mid <= 0) {
            kiln_fill16(d, z2, row);
        } else {
            kiln_fill16(d, z2, left);
            kiln_put16(d + 16 * left, xr, 4, mid);
            kiln_fill16(d + 16 * (left + mid), z2, right);
        }
    }
}

/* n bytes from s to d, a word at a time (unaligned loads and stores are fine on Armv7-M and the
 * host); the tail unrolled (see kiln_put_s8) */
static inline void kiln_copy_s8(int8_t *d, const int8_t *s, int32_t n)
{
    for (; n >= 4; n -= 4, s += 4, d += 4) {
        const uint32_t v = kiln_read_s8x4(s);
        __builtin_memcpy(d, &v, sizeof v);
    }
    if (n > 0) d[0] = s[0];
    if (n > 1) d[1] = s[1];
    if (n > 2) d[2] = s[2];
}

/* C % 4 != 0 (the first layers: 1 or 3 input channels): the patch of the pixel whose window
 * starts at (ih0, iw0) into slot `slot` of the widened pair through lin (2 * kp bytes of
 * scratch). A window inside the image is KH runs of KW * C contiguous bytes: copied a word at a
 * time into lin as one run of K bytes (zero-padded to kp), then widened. A clipped one is built by
 * kiln_patch_s8 (zero point fill) in slot 0 of an int8 pair at lin, then widened. */
static __attribute__((noinline, unused)) void kiln_patch_small_s8(int8_t *pair, int32_t slot, const int8_t *x,
                                                                  int32_t ih0, int32_t iw0, int32_t H, int32_t W,
                                                                  int32_t C, int32_t KH, int32_t KW, uint32_t z4,
                                                                  int32_t K, int32_t kp, int8_t *lin)
{
    if (ih0 >= 0 && iw0 >= 0 && ih0 + KH <= H && iw0 + KW <= W) {
        const int32_t row = KW * C;
        const int8_t *xr = x + (ih0 * W + iw0) * C;
        int8_t *l = lin;
        for (int32_t kh = 0; kh < KH; ++kh, l += row, xr += W * C) {
            kiln_copy_s8(l, xr, row);
        }
        for (int32_t k = K; k < kp; ++k) {
            lin[k] = 0;
        }
        kiln_put16(pair + 8 * slot, lin, 4, kp / 4);
    } else {
        kiln_patch_s8(lin, 0, x, ih0, iw0, H, W, C, KH, KW, z4, K, kp);
        kiln_put16(pair + 8 * slot, lin, 8, kp / 4);
    }
}

/* One image: x (H x W x C), output oh x ow pixels with O channels at y; window of output pixel
 * (i, j) starts at (i * sh - pt, j * sw - pl). Pixels go in pairs in raster order (a pair may
 * span two rows); patch: 4 * kp + 8 bytes of scratch for the widened pair (C % 4 == 0: built
 * directly, kiln_patch16_s8), 2 * kp more when C % 4 != 0 (kiln_patch_small_s8). wbits: 8 (pack_w8) or 16 (pack_w16). */
static __attribute__((noinline, unused)) void kiln_conv_s8(const int8_t *x, int32_t H, int32_t W, int32_t C,
                                                           int32_t KH, int32_t KW, int32_t sh, int32_t sw,
                                                           int32_t pt, int32_t pl, int32_t oh, int32_t ow, int32_t zx,
                                                           int8_t *patch, const int8_t *w, int32_t K, int32_t O,
                                                           int32_t wbits, const int32_t *q, int32_t zy, int32_t lo,
                                                           int32_t hi, int8_t *y)
{
    const int32_t kp = (K + 3) & ~3;
    const uint32_t z4 = ((uint32_t)zx & 0xFFu) * 0x01010101u, z2 = ((uint32_t)zx & 0xFFFFu) * 0x00010001u;
    const int direct = C % 4 == 0;   /* whole groups: the widened patch is built directly (kiln_patch16_s8) */
    int8_t *pair = (int8_t *)(((uintptr_t)patch + 7u) & ~(uintptr_t)7u);   /* the widened pair, 4 * kp bytes */
    int8_t *lin = pair + 4 * kp;                                               /* C % 4 != 0: 2 * kp bytes */
    const int32_t npix = oh * ow;
    (void)zy;   /* folded into q's hz words */
    int32_t i = 0, j = 0;
    for (int32_t p = 0; p < npix; p += 2, y += 2 * O) {
        const int32_t ih0 = i * sh - pt, iw0 = j * sw - pl;
        const int32_t two = p + 1 < npix;
        if (two && ++j == ow) {
            j = 0;
            ++i;
        }
        if (direct) {
            kiln_patch16_s8(pair, 0, x, ih0, iw0, H, W, C, KH, KW, z2);
            kiln_patch16_s8(pair, 1, x, i * sh - pt, j * sw - pl, H, W, C, KH, KW, z2);
        } else {
            kiln_patch_small_s8(pair, 0, x, ih0, iw0, H, W, C, KH, KW, z4, K, kp, lin);
            kiln_patch_small_s8(pair, 1, x, i * sh - pt, j * sw - pl, H, W, C, KH, KW, z4, K, kp, lin);
        }
        if (++j == ow) {
            j = 0;
            ++i;
        }
        int8_t *y1 = two ? y + O : y;
        const uint8_t *eb = (const uint8_t *)(q + 3 * O);
        if (wbits == 16) {
            kiln_dot2x2rq_w16(pair, w, kp, q, eb, O, lo, hi, y, y1);
        } else {
            kiln_dot2x2rq_w8(pair, w, kp, q, eb, O, lo, hi, y, y1);
        }
    }
}

/* kiln_conv_s8 without the widening (schedules.conv_fused_extern, narrow): each pixel pair's
 * patch as an int8 pair (kiln_patch_s8, any C) and kiln_dot2x2rq_w8i; patch: 2 * kp + 8 bytes;
 * int8 weights (pack_w8, nb = 2). */
static __attribute__((noinline, unused)) void kiln_conv8_s8(const int8_t *x, int32_t H, int32_t W, int32_t C,
                                                            int32_t KH, int32_t KW, int32_t sh, int32_t sw,
                                                            int32_t pt, int32_t pl, int32_t oh, int32_t ow, int32_t zx,
                                                            int8_t *patch, const int8_t *w, int32_t K, int32_t O,
                                                            const int32_t *q, int32_t lo, int32_t hi, int8_t *y)
{
    const int32_t kp = (K + 3) & ~3;
    const uint32_t z4 = ((uint32_t)zx & 0xFFu) * 0x01010101u;
    int8_t *pair = (int8_t *)(((uintptr_t)patch + 7u) & ~(uintptr_t)7u);
    const int32_t npix = oh * ow;
    const uint8_t *eb = (const uint8_t *)(q + 3 * O);
    int32_t i = 0, j = 0;
    for (int32_t p = 0; p < npix; p += 2, y += 2 * O) {
        const int32_t ih0 = i * sh - pt, iw0 = j * sw - pl;
        const int32_t two = p + 1 < npix;
        if (two && ++j == ow) {
            j = 0;
            ++i;
        }
        kiln_patch_s8(pair, 0, x, ih0, iw0, H, W, C, KH, KW, z4, K, kp);
        kiln_patch_s8(pair, 1, x, i * sh - pt, j * sw - pl, H, W, C, KH, KW, z4, K, kp);
        if (++j == ow) {
            j = 0;
            ++i;
        }
        kiln_dot2x2rq_w8i(pair, w, kp, q, eb, O, lo, hi, y, two ? y + O : y);
    }
}

/* ---- int8 FULLY_CONNECTED requantisation (LiteRT's reference kernel, every target) -----------
 * (int32)round((double)acc * eff) with eff = double(s_in) * double(s_w) / double(s_out), computed
 * in integers, bit-exact with IEEE double arithmetic and C's round (ties away from zero), on
 * cores with no double-precision FPU (kiln.frontend.ops.nn.fc_requantize is the reference).
 * eff = m * 2^-s, m = mh * 2^32 + ml its 53-bit significand (frontend/ops/nn.py: fc_requant_constants).
 * The exact product P = |acc| * m (< 2^84) is rounded to 53 significant bits, ties to even (the
 * double multiply), then (P + 2^(s-1)) >> s (the round). Saturates to int32 where C's conversion
 * would be undefined. */
/* |acc| * eff, rounded as above, before saturation (q < 2^64); out of line: the fast path below
 * settles all but products within about |acc| / 2^(s-21) of a half */
static __attribute__((noinline, unused)) uint64_t kiln_fc_rq_abs(uint32_t a, uint32_t mh, uint32_t ml, int32_t s)
{
    const uint64_t p0 = (uint64_t)a * ml;
    uint64_t hi = (uint64_t)a * mh + (p0 >> 32);   /* P = hi * 2^32 + lo, hi < 2^52 */
    uint64_t lo = (uint32_t)p0;
    if (hi >> 21) {
        /* P has 53 + r significant bits, 1 <= r <= 32: drop r bits, ties to even */
        const int32_t r = 43 - __builtin_clzll(hi);
        const uint64_t low = lo & ((1ull << r) - 1u), half = 1ull << (r - 1);
        const uint64_t odd = r == 32 ? (hi & 1u) : ((lo >> r) & 1u);
        lo -= low;
        if (low > half || (low == half && odd)) {
            lo += 1ull << r;
            hi += lo >> 32;
            lo &= 0xFFFFFFFFull;
        }
    }
    if (s > 84) {
        return 0;                    /* P < 2^84 <= 2^(s-1): rounds to 0 */
    }
    if (s < 22) {
        return a ? 0xFFFFFFFFull : 0;    /* eff >= 2^31: saturates */
    }
    /* floor((P + 2^(s-1)) / 2^s) from P >> 21 (< 2^63), exact as s - 1 >= 21 */
    const uint64_t p21 = (hi << 11) | (lo >> 21);
    return (p21 + (1ull << (s - 22))) >> (s - 21);
}

static inline int32_t kiln_fc_rq(int32_t acc, uint32_t mh, uint32_t ml, int32_t s)
{
    const uint32_t a = acc < 0 ? 0u - (uint32_t)acc : (uint32_t)acc;
    uint64_t q;
    if (s >= 53 && s <= 84) {
        /* Fast path (every eff < 2^-1): R = a * (m >> 21), one 32x32 -> 64 multiply, and P / 2^21
         * lies in [R, R + a). The double multiply moves P by at most P * 2^-52, under 2^11 units
         * of R. The result floor((P' / 2^21 + 2^(t-1)) / 2^t), t = s - 21 >= 32, is monotone in
         * the rounded product P', so when both ends of [R - 2^12, R + a + 2^12] give the same
         * integer, that integer is the answer. Otherwise (a product within about a / 2^t of a
         * half) the exact path decides. */
        const uint64_t r = (uint64_t)a * ((mh << 11) | (ml >> 21));
        const uint64_t half = 1ull << (s - 22);
        const uint32_t u = (uint32_t)(s - 53);
        const uint32_t qlo = (uint32_t)((r + half - 4096u) >> 32) >> u;
        const uint32_t qhi = (uint32_t)((r + half + a + 4096u) >> 32) >> u;
        q = qlo == qhi ? qlo : kiln_fc_rq_abs(a, mh, ml, s);
    } else {
        q = kiln_fc_rq_abs(a, mh, ml, s);
    }
    if (acc < 0) {
        return q >= 0x80000000ull ? INT32_MIN : -(int32_t)q;
    }
    return q > 0x7FFFFFFFull ? INT32_MAX : (int32_t)q;
}

/* acc (int32, bias added) -> int8 in [lo, hi]: kiln_fc_rq + the output zero point zy */
static inline int32_t kiln_fc_s8(int32_t acc, uint32_t mh, uint32_t ml, int32_t s, int32_t zy, int32_t lo,
                                 int32_t hi)
{
    const int64_t v = (int64_t)kiln_fc_rq(acc, mh, ml, s) + zy;
    return v < lo ? lo : (v > hi ? hi : (int32_t)v);
}

/* ---- int8 ADD (TFLite reference: ops_elementwise._add_int8, DSP targets) ---------------------
 * gemmlowp's SaturatingRoundingDoublingHighMul(a, m) = (a * m + 2^30) >> 31 is SMMULR(2a, m) when
 * |2a| < 2^31; RoundingDivideByPOT(v, e) is (v + 2^(e-1) + (v >> 31)) >> e for e >= 1. Inputs
 * are (x - z) << 20 with |x - z| <= 255 (< 2^28), the rescaled sum < 2^29: both exact. All
 * shifts are right shifts (checked at compile time); arguments are constants at every call. */
static inline int32_t kiln_srdhm_small(int32_t a, int32_t m)
{
#if KILN_HAVE_DSP
    return kiln_smmulr(2 * a, m);
#else
    return (int32_t)(((int64_t)a * m + (1LL << 30)) >> 31);
#endif
}

static inline int32_t kiln_rdbpot(int32_t v, int32_t e)
{
    return e ? (v + (1 << (e - 1)) + (v >> 31)) >> e : v;
}

static inline int32_t kiln_add_s8(int32_t x1, int32_t x2, int32_t k1, int32_t m1, int32_t e1, int32_t k2,
                                  int32_t m2, int32_t e2, int32_t mo, int32_t eo, int32_t zo)
{
    const int32_t u1 = kiln_rdbpot(kiln_srdhm_small((x1 << 20) + k1, m1), e1);
    const int32_t u2 = kiln_rdbpot(kiln_srdhm_small((x2 << 20) + k2, m2), e2);
    return kiln_rdbpot(kiln_srdhm_small(u1 + u2, mo), eo) + zo;
}

/* ---- int8 softmax over the last axis (ops_misc._softmax_int8, every target) -----------------
 * TFLite's reference_ops::Softmax for int8 -> int8 (output scale 1/256, zero point -128), as
 * kiln.frontend.ops.reduce_shape.softmax_int8_rows: exp(d) of d = x - max from the table
 * tab[max(d, base) - base] (ops_misc.softmax_exp_table: base = lo - 1 onto a zero entry, or -255
 * for a full table), the sum of
 * RoundingDivideByPOT(exp, 12), gemmlowp's GetReciprocal(sum, 12) (CLZ, then three
 * Newton-Raphson steps of one_over_one_plus_x_for_x_in_0_1), and RoundingDivideByPOT of
 * SRDHM(scale, exp) by 12 - clz + 23. One small function instead of a TVM loop nest (~1 KB of
 * code with a 31-compare CLZ and int64 arithmetic inline). */
static inline int32_t kiln_srdhm64(int32_t a, int32_t b)
{
    return (int32_t)(((int64_t)a * b + (1LL << 30)) >> 31);   /* gemmlowp's SRDHM (no a = b = INT32_MIN here) */
}

static inline int32_t kiln_sat_shl(int32_t x, int32_t s)
{
    const int32_t lim = INT32_MAX >> s;
    return x > lim ? INT32_MAX : (x < -lim ? INT32_MIN : (int32_t)((uint32_t)x << s));
}

static __attribute__((noinline, unused, cold)) void kiln_softmax_s8(const int8_t *x, int32_t rows, int32_t D,
                                                              const int32_t *tab, int32_t base, int8_t *y)
{
    for (int32_t r = 0; r < rows; ++r, x += D, y += D) {
        int32_t mx = -128, sum = 0;
        for (int32_t i = 0; i < D; ++i) mx = x[i] > mx ? x[i] : mx;
        for (int32_t i = 0; i < D; ++i) {
            const int32_t d = x[i] - mx;
            const int32_t e = tab[(d > base ? d : base) - base];
            sum += (int32_t)(((uint32_t)e + 2048u) >> 12);
        }
        /* GetReciprocal(sum, 12): sum >= 2^19 (the max element's exp is INT32_MAX) */
        const int32_t clz = __builtin_clz((uint32_t)sum);
        /* x = (sum << clz) - 2^31 in [0, 2^31); RoundingHalfSum(x, INT32_MAX) = (x + 2^31) / 2
         * exactly (the sum is non-negative and odd + 1 is even), i.e. (sum << clz) >> 1 */
        const int32_t hd = (int32_t)(((uint32_t)sum << clz) >> 1);
        int32_t nr = kiln_srdhm64(hd, -1010580540) + 1515870810;
        for (int32_t it = 0; it < 3; ++it) {
            /* hd in [2^30, 2^31) and nr in Q2.29 near 1/hd: 2^29 - SRDHM(hd, nr) fits int32 */
            const int32_t sx = kiln_srdhm64(nr, 536870912 - kiln_srdhm64(hd, nr));
            nr = (int32_t)((uint32_t)nr + (uint32_t)kiln_sat_shl(sx, 2));
        }
        const int32_t scale = kiln_sat_shl(nr, 1), re = 12 - clz + 23;
        const int32_t mask = (int32_t)((1u << re) - 1u);
        for (int32_t i = 0; i < D; ++i) {
            const int32_t d = x[i] - mx;
            const int32_t rx = kiln_srdhm64(scale, tab[(d > base ? d : base) - base]);
            const int32_t v = (rx >> re) + ((rx & mask) > ((mask >> 1) + (rx < 0)) ? 1 : 0) - 128;
            y[i] = (int8_t)kiln_clamp_i32(v, -128, 127);
        }
    }
}

#include "kiln_dense.h" /* the batch-1 FULLY_CONNECTED kernel (uses kiln_fc_rq) */
#include "kiln_dw.h"    /* the 3x3 depthwise kernel (uses kiln_dw_requant) */

#endif /* KILN_INTRINSICS_H */
