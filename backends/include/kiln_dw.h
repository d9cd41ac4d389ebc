/* Kiln's 3x3 int8 depthwise kernel (depth multiplier 1, dilation 1, column stride 1 or 2):
 * ops_dw.py lowers to it; kiln_intrinsics.h includes this file (it uses kiln_dw_requant).
 *
 * Per output row and block of 4 channels the 3 input rows of the window are widened into 3 row
 * slots, channel-major: slot s, channel c is a row of int16 (x - zx) values, one per padded
 * input column (the padding columns and rows hold 0, which is exactly a zero-point tap). Two
 * adjacent columns of one channel are then one word, so the 3 taps of a kernel row against two
 * output pixels are one LDRD and four dual-MAC instructions (SMLAD on two taps of one channel):
 *   stride 1: A = {x[p], x[p+1]}, B = {x[p+2], x[p+3]}, W01 = {w0, w1}, W12 = {w1, w2}:
 *     y[p]   += SMLAD(A, W01) + SMLABT(B, W12)        (x[p]w0 + x[p+1]w1, x[p+2]w2)
 *     y[p+1] += SMLATB(A, W01) + SMLAD(B, W12)        (x[p+1]w0, x[p+2]w1 + x[p+3]w2)
 *   stride 2: A = {x[2p], x[2p+1]}, B = {x[2p+2], x[2p+3]}, D = {x[2p+4], .}:
 *     y[p]   += SMLAD(A, W01) + SMLABT(B, W12),  y[p+1] += SMLAD(B, W01) + SMLABT(D, W12)
 * The requantisation constants of a channel stay in registers along an output row.
 * tab: per channel 10 int32 words {W01, W12} x 3 kernel rows (the weights doubled, as int16
 * pairs), 2 * bias, multiplier, half + (zy << shift), right shift; requantisation exactly as
 * kiln_dw_s8 (ops_dw.dw3_table; schedules.dw_dsp_ok checks its bounds at compile time).
 * buf: 24 * kiln_dw3_cols(ow, sw) + 8 + ow * C bytes of scratch (ops_dw.dw3_scratch_bytes). */
#ifndef KILN_DW_H
#define KILN_DW_H

/* padded columns per channel row of a slot: >= the last column a pixel pair reads, a multiple of 4
 * (8-byte rows, so every pair's LDRD is aligned) */
static inline int32_t kiln_dw3_cols(int32_t ow, int32_t sw)
{
    return sw == 1 ? (ow + 6) & ~3 : (2 * ow + 7) & ~3;
}

#if KILN_HAVE_DSP
static inline uint32_t kiln_pkhtb16(uint32_t hi, uint32_t lo)
{
    uint32_t r;
    __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(r) : "r"(hi), "r"(lo));
    return r;
}
#endif

/* n input pixels (4 channels each, C bytes apart, from xr) into columns u0.. of the 4 channel
 * rows of one slot (d: channel 0's row, rows Wb int16 apart), as int16 x - zx (off2: -zx in both
 * lanes) */
static inline void kiln_dw3_widen(int16_t *d, int32_t Wb, const int8_t *xr, int32_t C, int32_t n, int32_t u0,
                                  int32_t zx)
{
    int16_t *d0 = d + u0;
#if KILN_HAVE_DSP
    const uint32_t off2 = ((uint32_t)(-zx) & 0xFFFFu) * 0x00010001u;
    for (; n >= 2; n -= 2, xr += 2 * C, d0 += 2) {
        const uint32_t v0 = kiln_read_s8x4(xr), v1 = kiln_read_s8x4(xr + C);
        const uint32_t e0 = __sxtab16(off2, v0), o0 = kiln_sxtab16_ror8(off2, v0);
        const uint32_t e1 = __sxtab16(off2, v1), o1 = kiln_sxtab16_ror8(off2, v1);
        const uint32_t c0 = kiln_pkhbt16(e0, e1), c2 = kiln_pkhtb16(e1, e0);
        const uint32_t c1 = kiln_pkhbt16(o0, o1), c3 = kiln_pkhtb16(o1, o0);
        __builtin_memcpy(d0, &c0, 4);
        __builtin_memcpy(d0 + Wb, &c1, 4);
        __builtin_memcpy(d0 + 2 * Wb, &c2, 4);
        __builtin_memcpy(d0 + 3 * Wb, &c3, 4);
    }
#endif
    for (; n > 0; --n, xr += C, ++d0) {
        for (int32_t c = 0; c < 4; ++c) {
            d0[c * Wb] = (int16_t)(xr[c] - zx);
        }
    }
}

static inline void kiln_zero16(int16_t *d, int32_t n)
{
    const uint32_t z = 0;
    for (; n > 0; n -= 2, d += 2) {
        __builtin_memcpy(d, &z, 4);   /* n even */
    }
}

/* requantised output of one channel (kiln_dw_requant) clamped to [lo, hi] (FULL: [-128, 127]) */
static inline int32_t kiln_dw3_out(int32_t s, int32_t m, int32_t hz, int32_t e, int32_t lo, int32_t hi, int full)
{
    const int32_t v = kiln_dw_requant(s, m, hz, e);
#if KILN_HAVE_DSP
    if (full) {
        return __ssat(v, 8);
    }
#else
    (void)full;
#endif
    return kiln_clamp_i32(v, lo, hi);
}

#if KILN_HAVE_DSP
/* LDRD with post-increment: the pair's two words of one channel row (the "m" operand tells gcc
 * the asm reads the slots, which the widening wrote) */
#define KILN_DW3_LD(A, B, P, INC)                                                 \
    __asm__("ldrd %0, %1, [%2], %3" : "=&r"(A), "=&r"(B), "+r"(P) : "i"(INC), "m"(*(const uint64_t *)(P)))
#define KILN_DW3_ROW1(P, W01, W12)                                                \
    do {                                                                          \
        uint32_t a_, b_;                                                          \
        KILN_DW3_LD(a_, b_, P, 4);                                                \
        s0 = __smlad(a_, W01, s0);                                                \
        s0 = __smlabt((int32_t)b_, (int32_t)(W12), s0);                           \
        s1 = __smlatb((int32_t)a_, (int32_t)(W01), s1);                           \
        s1 = __smlad(b_, W12, s1);                                                \
    } while (0)
#define KILN_DW3_ROW2(P, W01, W12)                                                \
    do {                                                                          \
        uint32_t a_, b_, d_;                                                      \
        KILN_DW3_LD(a_, b_, P, 8);                                                \
        __builtin_memcpy(&d_, P, 4);                                              \
        s0 = __smlad(a_, W01, s0);                                                \
        s0 = __smlabt((int32_t)b_, (int32_t)(W12), s0);                           \
        s1 = __smlad(b_, W01, s1);                                                \
        s1 = __smlabt((int32_t)d_, (int32_t)(W12), s1);                           \
    } while (0)
#endif

/* One output row of one channel: the pixel pairs of ow outputs (an odd last pixel computed as a
 * pair, its phantom partner not stored), rows r0..r2 of the ring, t: the channel's 10 words */
static inline __attribute__((always_inline)) void kiln_dw3_row(const int16_t *r0, const int16_t *r1,
                                                           const int16_t *r2, const int32_t *t, int32_t ow,
                                                           int32_t sw, int32_t C, int32_t lo, int32_t hi, int full,
                                                           int8_t *y)
{
#if KILN_HAVE_DSP
    /* the channel's words are loaded where they are used (volatile: not hoisted out of the pixel
     * loop, where 10 more live registers would spill) */
#define KILN_DW3_T(A, B, OFF) __asm__ volatile("ldrd %0, %1, [%2, %3]" : "=r"(A), "=r"(B) : "r"(t), "i"(OFF))
    r0 = (const int16_t *)__builtin_assume_aligned(r0, 8);
    r1 = (const int16_t *)__builtin_assume_aligned(r1, 8);
    r2 = (const int16_t *)__builtin_assume_aligned(r2, 8);
    int32_t s0, s1, m, hz, e;
    uint32_t w01, w12;
#define KILN_DW3_PAIR()                                                           \
    do {                                                                          \
        KILN_DW3_T(s0, m, 24);                                                    \
        s1 = s0;                                                                  \
        KILN_DW3_T(w01, w12, 0);                                                  \
        if (sw == 1) KILN_DW3_ROW1(r0, w01, w12); else KILN_DW3_ROW2(r0, w01, w12); \
        KILN_DW3_T(w01, w12, 8);                                                  \
        if (sw == 1) KILN_DW3_ROW1(r1, w01, w12); else KILN_DW3_ROW2(r1, w01, w12); \
        KILN_DW3_T(w01, w12, 16);                                                 \
        if (sw == 1) KILN_DW3_ROW1(r2, w01, w12); else KILN_DW3_ROW2(r2, w01, w12); \
        KILN_DW3_T(hz, e, 32);                                                    \
    } while (0)
    /* whole pairs, then an odd last pixel (its phantom partner computed, not stored) */
    int8_t *const yend = y + (ow & ~1) * C;
    for (; y != yend; y += 2 * C) {
        KILN_DW3_PAIR();
        y[0] = (int8_t)kiln_dw3_out(s0, m, hz, e, lo, hi, full);
        y[C] = (int8_t)kiln_dw3_out(s1, m, hz, e, lo, hi, full);
    }
    if (ow & 1) {
        KILN_DW3_PAIR();
        y[0] = (int8_t)kiln_dw3_out(s0, m, hz, e, lo, hi, full);
    }
#undef KILN_DW3_PAIR
#undef KILN_DW3_T
#else
    const int32_t b2 = t[6], m = t[7], hz = t[8], e = t[9];
    for (int32_t p = 0; p < ow; p += 2, y += 2 * C) {
        int32_t s0 = b2, s1 = b2;
        const int16_t *rr[3] = {r0, r1, r2};
        for (int32_t k = 0; k < 3; ++k) {
            const int32_t w0 = (int16_t)(t[2 * k] & 0xFFFF), w1 = (int16_t)((uint32_t)t[2 * k] >> 16);
            const int32_t w2 = (int16_t)((uint32_t)t[2 * k + 1] >> 16);
            const int16_t *a = rr[k] + p * sw, *b = a + sw;
            s0 += a[0] * w0 + a[1] * w1 + a[2] * w2;
            s1 += b[0] * w0 + b[1] * w1 + b[2] * w2;
        }
        y[0] = (int8_t)kiln_dw3_out(s0, m, hz, e, lo, hi, full);
        if (p + 1 < ow) {
            y[C] = (int8_t)kiln_dw3_out(s1, m, hz, e, lo, hi, full);
        }
    }
#endif
}

/* One image: x (H x W x C, C % 4 == 0), oh x ow outputs at y; the window of output (i, j)
 * starts at input (i * sh - pt, j * sw - pl). Output row by output row (the order the in-place
 * planner assumes, backends/inplace.py): per block of 4 channels its 3 input rows are widened
 * into the 3 slots of buf, the row's outputs go to yrow (ow * C bytes after the slots) and are
 * copied out once every block has read its input. */
static __attribute__((noinline, unused)) void kiln_dw3_s8(const int8_t *x, int32_t H, int32_t W, int32_t C,
                                                          int32_t sh, int32_t sw, int32_t pt, int32_t pl, int32_t oh,
                                                          int32_t ow, int32_t zx, const int32_t *tab, int32_t lo,
                                                          int32_t hi, int16_t *buf, int8_t *y)
{
    const int32_t Wb = kiln_dw3_cols(ow, sw);
    const int32_t wn = W < Wb - pl ? W : Wb - pl;   /* input columns that land in a slot */
    const int full = lo == -128 && hi == 127;
    buf = (int16_t *)(((uintptr_t)buf + 7u) & ~(uintptr_t)7u);   /* 8 spare bytes: 8-byte aligned rows */
    int8_t *yrow = (int8_t *)(buf + 12 * Wb);
    kiln_zero16(buf, 12 * Wb);                      /* the padding columns stay 0 */
    for (int32_t i = 0; i < oh; ++i, y += ow * C) {
        const int32_t t0 = i * sh - pt;
        const int32_t *t = tab;
        for (int32_t cb = 0; cb < C; cb += 4, t += 40) {
            for (int32_t k = 0; k < 3; ++k) {
                int16_t *s = buf + k * 4 * Wb;
                const int32_t h = t0 + k;
                if (h >= 0 && h < H) {
                    kiln_dw3_widen(s, Wb, x + (h * W) * C + cb, C, wn, pl, zx);
                } else if (cb == 0) {
                    kiln_zero16(s, 4 * Wb);         /* a padding row (slot k is one for every block) */
                }
            }
            const int16_t *r0 = buf, *r1 = buf + 4 * Wb, *r2 = buf + 8 * Wb;
            for (int32_t c = 0; c < 4; ++c, r0 += Wb, r1 += Wb, r2 += Wb) {
                /* constant stride and clamp in each copy: no test in the pixel loop */
                int8_t *yc = yrow + cb + c;
                if (sw == 1) {
                    if (full) {
                        kiln_dw3_row(r0, r1, r2, t + 10 * c, ow, 1, C, lo, hi, 1, yc);
                    } else {
                        kiln_dw3_row(r0, r1, r2, t + 10 * c, ow, 1, C, lo, hi, 0, yc);
                    }
                } else if (full) {
                    kiln_dw3_row(r0, r1, r2, t + 10 * c, ow, 2, C, lo, hi, 1, yc);
                } else {
                    kiln_dw3_row(r0, r1, r2, t + 10 * c, ow, 2, C, lo, hi, 0, yc);
                }
            }
        }
        kiln_copy_s8(y, yrow, ow * C);
    }
}

#endif /* KILN_DW_H */
