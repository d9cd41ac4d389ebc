/* ARM PL011 UART as found in the RP2040 (UART0). Resets, pin functions and clk_peri come from
 * kiln_board_init() (the board file's uart.init list). RX by interrupt.
 * Compiled in CI; not yet run on hardware. */
#include "kiln_fw.h"
#include "kiln_ring.h"

#define U_DR KILN_REG(KILN_UART_BASE + 0x000u)
#define U_FR KILN_REG(KILN_UART_BASE + 0x018u)    /* bit4 RXFE, bit5 TXFF */
#define U_IBRD KILN_REG(KILN_UART_BASE + 0x024u)
#define U_FBRD KILN_REG(KILN_UART_BASE + 0x028u)
#define U_LCRH KILN_REG(KILN_UART_BASE + 0x02Cu)
#define U_CR KILN_REG(KILN_UART_BASE + 0x030u)
#define U_IMSC KILN_REG(KILN_UART_BASE + 0x038u)
#define U_ICR KILN_REG(KILN_UART_BASE + 0x044u)

static kiln_ring_t ring;

void kiln_uart_init(void)
{
    kiln_board_init();
    U_CR = 0;
    /* divisor = clk / (16 * baud) in 16.6 fixed point */
    uint32_t div = (8u * KILN_UART_CLOCK_HZ / KILN_UART_BAUD + 1u) / 2u;
    U_IBRD = div >> 6;
    U_FBRD = div & 0x3Fu;
    U_LCRH = (3u << 5) | (1u << 4);   /* 8 bits, FIFOs on (LCRH write latches the divisor) */
    U_IMSC = (1u << 4) | (1u << 6);   /* RX and RX-timeout interrupts */
    U_ICR = 0x7FFu;
    U_CR = (1u << 0) | (1u << 8) | (1u << 9);   /* UARTEN, TXE, RXE */
    (void)U_DR;
    kiln_irq_enable(KILN_UART_RX_IRQ);
}

void kiln_uart_putc(uint8_t c)
{
    while (U_FR & (1u << 5)) {
    }
    U_DR = c;
}

void kiln_uart_rx_irq(void)
{
    while (!(U_FR & (1u << 4)))
        kiln_ring_put(&ring, (uint8_t)U_DR);
    U_ICR = (1u << 4) | (1u << 6);
}

int kiln_uart_getc(void) { return kiln_ring_get(&ring); }
void kiln_uart_idle(void) { kiln_ring_wait(&ring); }
