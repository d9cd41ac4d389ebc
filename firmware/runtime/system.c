/* Reset-time C setup, stack measurement, fault reporting and exit. */
#include "kiln_fw.h"
#include "kiln_frame.h"

extern uint32_t __data_start, __data_end, __data_load, __bss_start, __bss_end;
extern const void *const kiln_vectors[];
int main(void);

#define VTOR KILN_REG(0xE000ED08u)
#define AIRCR KILN_REG(0xE000ED0Cu)
#define CFSR KILN_REG(0xE000ED28u)
#define HFSR KILN_REG(0xE000ED2Cu)
#define NVIC_ISER(n) KILN_REG(0xE000E100u + 4u * (n))

static inline uint32_t current_sp(void)
{
    uint32_t sp;
    __asm volatile("mov %0, sp" : "=r"(sp));
    return sp;
}

/* Called by Reset_Handler (startup.c) once the FPU is enabled and SP is set. */
__attribute__((noreturn, used)) void kiln_reset_c(void)
{
    uint32_t *src = &__data_load, *dst = &__data_start;
    while (dst < &__data_end)
        *dst++ = *src++;
    for (dst = &__bss_start; dst < &__bss_end;)
        *dst++ = 0;
    kiln_stack_repaint();
#if !KILN_ARCH_V6M
    VTOR = (uint32_t)(uintptr_t)kiln_vectors;
#endif
    __asm volatile("dsb\n isb" ::: "memory");
    main();
    kiln_exit(0);
}

/* Paint everything below the current stack pointer (minus a margin for this frame). */
__attribute__((noinline)) void kiln_stack_repaint(void)
{
    uint32_t limit = (current_sp() - 64u) & ~3u;
    for (volatile uint32_t *p = &__stack_start; (uint32_t)(uintptr_t)p < limit; p++)
        *p = KILN_STACK_PAINT;
}

uint32_t kiln_stack_used(void)
{
    const uint32_t *p = &__stack_start;
    while (p < &__stack_top && *p == KILN_STACK_PAINT)
        p++;
    return (uint32_t)((uintptr_t)&__stack_top - (uintptr_t)p);
}

void kiln_irq_enable(uint32_t irq) { NVIC_ISER(irq >> 5) = 1u << (irq & 31u); }

void kiln_exit(int code)
{
#if KILN_SEMIHOSTING
    /* SYS_EXIT_EXTENDED(ADP_Stopped_ApplicationExit, code): needs
     * -semihosting-config enable=on,target=native in QEMU, a debugger on hardware. */
    volatile uint32_t block[2] = {0x20026u, (uint32_t)code};
    register uint32_t r0 __asm("r0") = 0x20u;
    register volatile uint32_t *r1 __asm("r1") = block;
    __asm volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
#else
    (void)code;
#endif
    kiln_reset();   /* QEMU -no-reboot exits here */
}

void kiln_reset(void)
{
    __asm volatile("dsb" ::: "memory");
    AIRCR = (0x05FAu << 16) | (1u << 2);   /* SYSRESETREQ */
    __asm volatile("dsb" ::: "memory");
    for (;;) {
    }
}

/* Fault report: re-initialise the UART (it may be the reason we are here), send one FAULT
 * frame with the stacked registers, then exit with code 3. frame = the exception stack frame. */
__attribute__((used)) void kiln_fault_c(uint32_t *frame, uint32_t exc_return)
{
    static uint8_t out[KILN_HEADER_BYTES + 48 + KILN_TRAILER_BYTES];
    uint32_t ipsr;
    __asm volatile("mrs %0, ipsr" : "=r"(ipsr));
    uint32_t v[12] = {ipsr, 0, 0, frame[0], frame[1], frame[2], frame[3], frame[4], frame[5],
                      frame[6], frame[7], (uint32_t)(uintptr_t)frame};
#if !KILN_ARCH_V6M
    v[1] = CFSR;
    v[2] = HFSR;
#endif
    (void)exc_return;
    for (int i = 0; i < 12; i++)
        kiln_put_u32(out + KILN_HEADER_BYTES + 4 * i, v[i]);
    kiln_uart_init();
    size_t n = kiln_frame_encode(out, KILN_T_FAULT, 0, out + KILN_HEADER_BYTES, 48);
    kiln_uart_write(out, (uint32_t)n);
    kiln_exit(3);
}
