/* Cycle/tick source. DWT CYCCNT counts core cycles on M3/M4/M7/M33/M55 silicon but reads 0
 * under QEMU, so it is probed at boot; the fallback is SysTick at the core clock, extended to
 * 64 bits by counting wraps in its interrupt. Under QEMU -icount SysTick is deterministic. */
#include "kiln_fw.h"

#define DEMCR KILN_REG(0xE000EDFCu)
#define DWT_CTRL KILN_REG(0xE0001000u)
#define DWT_CYCCNT KILN_REG(0xE0001004u)
#define DWT_LAR KILN_REG(0xE0001FB0u)
#define SYST_CSR KILN_REG(0xE000E010u)
#define SYST_RVR KILN_REG(0xE000E014u)
#define SYST_CVR KILN_REG(0xE000E018u)
#define ICSR KILN_REG(0xE000ED04u)
#define SYST_MAX 0x00FFFFFFu
/* The SysTick period in core clocks, minus one. Test builds may shorten it
 * (-DKILN_SYSTICK_RELOAD=N: an interrupt every N+1 clocks) so that interrupts land inside every
 * inference: the QEMU plugin's instruction counts must not depend on them (docs/firmware.md). */
#ifndef KILN_SYSTICK_RELOAD
#define KILN_SYSTICK_RELOAD SYST_MAX
#endif
#define SYST_RELOAD ((uint32_t)(KILN_SYSTICK_RELOAD))
_Static_assert(SYST_RELOAD >= 255u && SYST_RELOAD <= SYST_MAX,
               "KILN_SYSTICK_RELOAD must be 255..0xFFFFFF (shorter periods leave no time between interrupts)");

static uint8_t kind = KILN_TIMER_NONE;
static volatile uint32_t systick_wraps;

void kiln_systick_irq(void) { systick_wraps++; }

void kiln_timer_init(void)
{
#if KILN_HAS_CYCCNT
    DEMCR |= 1u << 24;          /* TRCENA */
    DWT_LAR = 0xC5ACCE55u;      /* unlock (needed on Cortex-M7) */
    DWT_CYCCNT = 0;
    DWT_CTRL |= 1u;             /* CYCCNTENA */
    for (volatile int i = 0; i < 64; i++) {
    }
    if (DWT_CYCCNT != 0) {
        kind = KILN_TIMER_DWT;
        return;
    }
#endif
    SYST_CSR = 0;
    SYST_RVR = SYST_RELOAD;
    SYST_CVR = 0;
    SYST_CSR = 7u;              /* processor clock, interrupt on wrap, enable */
    kind = KILN_TIMER_SYSTICK;
}

uint64_t kiln_timer_now(void)
{
    if (kind == KILN_TIMER_DWT)
        return DWT_CYCCNT;
    uint32_t hi, lo, pending;
    do {
        hi = systick_wraps;
        lo = SYST_CVR;
        pending = ICSR & (1u << 26);   /* PENDSTSET: wrapped, handler not run yet */
    } while (hi != systick_wraps);
    if (pending && lo > SYST_RELOAD / 2)
        hi++;
#if KILN_SYSTICK_RELOAD == SYST_MAX    /* the default: the same code as a shift */
    return ((uint64_t)hi << 24) + (SYST_MAX - lo);
#else
    return (uint64_t)hi * (SYST_RELOAD + 1u) + (SYST_RELOAD - lo);
#endif
}

uint32_t kiln_timer_hz(void) { return KILN_CLOCK_HZ; }
uint8_t kiln_timer_kind(void) { return kind; }

/* Distinct bodies so that GCC cannot merge them; noipa keeps every call a real call. */
volatile uint32_t kiln_marker_state;
__attribute__((noipa, used)) void kiln_marker_begin(void) { kiln_marker_state = 0xB0u; }
__attribute__((noipa, used)) void kiln_marker_end(void) { kiln_marker_state = 0xE0u; }
__attribute__((noipa, used)) void kiln_marker_mark(int index)
{
    kiln_marker_state = 0x10000u | (uint32_t)index;
}
