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

#endif /* KILN_INTRINSICS_H */
