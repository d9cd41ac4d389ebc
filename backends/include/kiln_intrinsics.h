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

static inline uint32_t kiln_ror8(uint32_t x)
{
    return (x >> 8) | (x << 24);
}

/* acc + sum_{i < n} (a[i] + a_offset) * b[i] */
static inline int32_t kiln_dot_s8(const int8_t *a, const int8_t *b, int32_t n, int32_t a_offset, int32_t acc)
{
    int32_t i = 0;
#if KILN_HAVE_DSP
    const uint32_t off2 = ((uint32_t)a_offset & 0xFFFFu) | ((uint32_t)a_offset << 16);
    for (; i + 4 <= n; i += 4) {
        const uint32_t av = kiln_read_s8x4(a + i);
        const uint32_t bv = kiln_read_s8x4(b + i);
        acc = (int32_t)__smlad(__sxtab16(off2, av), __sxtb16(bv), acc);
        acc = (int32_t)__smlad(__sxtab16(off2, kiln_ror8(av)), __sxtb16(kiln_ror8(bv)), acc);
    }
#endif
    for (; i < n; ++i) {
        acc += ((int32_t)a[i] + a_offset) * (int32_t)b[i];
    }
    return acc;
}

/* Two output channels sharing one input row: acc[0] += dot(a, b0), acc[1] += dot(a, b1),
 * b1 = b0 + b_stride. Each input word is sign-extended once for both channels. */
static inline void kiln_dot2_s8(const int8_t *a, const int8_t *b0, int32_t b_stride, int32_t n, int32_t a_offset,
                                int32_t *acc)
{
    const int8_t *b1 = b0 + b_stride;
    int32_t s0 = acc[0], s1 = acc[1];
    int32_t i = 0;
#if KILN_HAVE_DSP
    const uint32_t off2 = ((uint32_t)a_offset & 0xFFFFu) | ((uint32_t)a_offset << 16);
    for (; i + 4 <= n; i += 4) {
        const uint32_t av = kiln_read_s8x4(a + i);
        const uint32_t a02 = __sxtab16(off2, av);
        const uint32_t a13 = __sxtab16(off2, kiln_ror8(av));
        const uint32_t w0 = kiln_read_s8x4(b0 + i);
        const uint32_t w1 = kiln_read_s8x4(b1 + i);
        s0 = (int32_t)__smlad(a02, __sxtb16(w0), s0);
        s0 = (int32_t)__smlad(a13, __sxtb16(kiln_ror8(w0)), s0);
        s1 = (int32_t)__smlad(a02, __sxtb16(w1), s1);
        s1 = (int32_t)__smlad(a13, __sxtb16(kiln_ror8(w1)), s1);
    }
#endif
    for (; i < n; ++i) {
        const int32_t x = (int32_t)a[i] + a_offset;
        s0 += x * (int32_t)b0[i];
        s1 += x * (int32_t)b1[i];
    }
    acc[0] = s0;
    acc[1] = s1;
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
#define KILN_DEF_DOTW(NB, NAME, ZERO)                                                         \
    static __attribute__((noinline, unused)) void NAME(const int8_t *a, const int8_t *wp, int32_t n, \
                                                       int32_t a_offset, int32_t *acc)           \
    {                                                                                        \
        const int8_t *w = (const int8_t *)__builtin_assume_aligned(wp, 8);                   \
        const int zero_ = (ZERO);                                                            \
        int32_t i = 0;                                                                       \
        KILN_DOTW_ACC##NB(KILN_DOTW_LD)                                                      \
        KILN_DOTW_OFF2;                                                                      \
        (void)zero_;                                                                         \
        if (zero_) {                                                                         \
            a_offset = 0;                                                                    \
        }                                                                                    \
        for (; i + 4 <= n; i += 4, w += 8 * (NB)) {                                          \
            KILN_DOTW_PREP();                                                                \
            KILN_DOTW_ACC##NB(KILN_DOTW_MAC)                                                 \
        }                                                                                    \
        KILN_DOTW_ACC##NB(KILN_DOTW_TL)                                                      \
        KILN_DOTW_ACC##NB(KILN_DOTW_ST)                                                      \
    }
KILN_DEF_DOTW(4, kiln_dot4_w16_z, 1)
KILN_DEF_DOTW(4, kiln_dot4_w16_o, 0)
KILN_DEF_DOTW(2, kiln_dot2_w16_z, 1)
KILN_DEF_DOTW(2, kiln_dot2_w16_o, 0)
KILN_DEF_DOTW(1, kiln_dot1_w16_z, 1)
KILN_DEF_DOTW(1, kiln_dot1_w16_o, 0)

static inline void kiln_dot4_w16(const int8_t *a, const int8_t *w, int32_t n, int32_t a_offset, int32_t *acc)
{
    if (a_offset == 0) kiln_dot4_w16_z(a, w, n, 0, acc); else kiln_dot4_w16_o(a, w, n, a_offset, acc);
}

static inline void kiln_dot2_w16(const int8_t *a, const int8_t *w, int32_t n, int32_t a_offset, int32_t *acc)
{
    if (a_offset == 0) kiln_dot2_w16_z(a, w, n, 0, acc); else kiln_dot2_w16_o(a, w, n, a_offset, acc);
}

static inline void kiln_dot1_w16(const int8_t *a, const int8_t *w, int32_t n, int32_t a_offset, int32_t *acc)
{
    if (a_offset == 0) kiln_dot1_w16_z(a, w, n, 0, acc); else kiln_dot1_w16_o(a, w, n, a_offset, acc);
}

#endif /* KILN_INTRINSICS_H */
