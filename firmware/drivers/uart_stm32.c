/* STM32 USART/LPUART (register layout of STM32F7/L4/G4/H7 "v2" USARTs). RX by interrupt.
 * Pins and clocks are enabled by kiln_board_init() from the board file's uart.init list.
 * Compiled in CI; not yet run on hardware. */
#include "kiln_fw.h"
#include "kiln_ring.h"

#define U_CR1 KILN_REG(KILN_UART_BASE + 0x00u)
#define U_BRR KILN_REG(KILN_UART_BASE + 0x0Cu)
#define U_ISR KILN_REG(KILN_UART_BASE + 0x1Cu)
#define U_ICR KILN_REG(KILN_UART_BASE + 0x20u)
#define U_RDR KILN_REG(KILN_UART_BASE + 0x24u)
#define U_TDR KILN_REG(KILN_UART_BASE + 0x28u)
#define ISR_ORE (1u << 3)
#define ISR_RXNE (1u << 5)
#define ISR_TXE (1u << 7)
#define CR1_UE (1u << 0)
#define CR1_RE (1u << 2)
#define CR1_TE (1u << 3)
#define CR1_RXNEIE (1u << 5)

static kiln_ring_t ring;

void kiln_uart_init(void)
{
    kiln_board_init();
    U_CR1 = 0;
    U_BRR = (uint32_t)(((uint64_t)KILN_UART_CLOCK_HZ * KILN_UART_BRR_MULT + KILN_UART_BAUD / 2u) /
                       KILN_UART_BAUD);
    U_CR1 = CR1_TE | CR1_RE | CR1_RXNEIE | CR1_UE;
    (void)U_RDR;
    U_ICR = ISR_ORE;
    kiln_irq_enable(KILN_UART_RX_IRQ);
}

void kiln_uart_putc(uint8_t c)
{
    while (!(U_ISR & ISR_TXE)) {
    }
    U_TDR = c;
}

void kiln_uart_rx_irq(void)
{
    uint32_t isr = U_ISR;
    if (isr & ISR_ORE)
        U_ICR = ISR_ORE;           /* overrun: the frame CRC catches the lost byte */
    while (U_ISR & ISR_RXNE)
        kiln_ring_put(&ring, (uint8_t)U_RDR);
}

int kiln_uart_getc(void) { return kiln_ring_get(&ring); }
void kiln_uart_idle(void) { kiln_ring_wait(&ring); }
