/* Kiln firmware internals shared by the runtime files and the UART drivers. */
#ifndef KILN_FW_H
#define KILN_FW_H

#include <stdint.h>
#include "kiln_board.h"   /* generated from the board file: addresses, clocks, features */

#define KILN_REG(addr) (*(volatile uint32_t *)(uintptr_t)(addr))

/* UART driver: one of firmware/drivers/uart_*.c is linked, chosen by uart.kind. */
void kiln_uart_init(void);
void kiln_uart_putc(uint8_t c);
int kiln_uart_getc(void);       /* next received byte, or -1 if none is waiting */
void kiln_uart_idle(void);      /* sleep until a byte may have arrived (WFI), or return */
void kiln_uart_rx_irq(void);    /* RX interrupt handler (in the vector table) */
void kiln_uart_write(const uint8_t *data, uint32_t len);

/* Timer: DWT CYCCNT when it counts, SysTick (+ overflow count) otherwise. */
enum kiln_timer_kind { KILN_TIMER_NONE = 0, KILN_TIMER_DWT = 1, KILN_TIMER_SYSTICK = 2 };
void kiln_timer_init(void);
uint64_t kiln_timer_now(void);
uint32_t kiln_timer_hz(void);
uint8_t kiln_timer_kind(void);
void kiln_systick_irq(void);

/* Markers for the QEMU instruction-count plugin (firmware/qemu_plugin/icount.c). */
void kiln_marker_begin(void);
void kiln_marker_end(void);
void kiln_marker_mark(int index);

/* Stack painting (reset handler) and high-water measurement. */
#define KILN_STACK_PAINT 0xC5AC5AC5u
extern uint32_t __stack_start, __stack_top;
uint32_t kiln_stack_used(void);
void kiln_stack_repaint(void);

/* Exit: semihosting SYS_EXIT_EXTENDED under QEMU, else a system reset. */
void kiln_exit(int code) __attribute__((noreturn));
void kiln_reset(void) __attribute__((noreturn));
void kiln_irq_enable(uint32_t irq);

#if defined(__arm__)
static inline void kiln_irqs_on(void) { __asm volatile("cpsie i" ::: "memory"); }
#else
static inline void kiln_irqs_on(void) {}   /* host build (fuzzing) */
#endif

#endif
