/* ARM CMSDK APB UART (MPS2/MPS3 FPGA images; the UART QEMU emulates). RX by interrupt into a
 * ring, TX by polling. */
#include "kiln_fw.h"
#include "kiln_ring.h"

#define U_DATA KILN_REG(KILN_UART_BASE + 0x00u)
#define U_STATE KILN_REG(KILN_UART_BASE + 0x04u)   /* bit0 TX full, bit1 RX full */
#define U_CTRL KILN_REG(KILN_UART_BASE + 0x08u)    /* bit0 TX en, bit1 RX en, bit3 RX irq en */
#define U_INT KILN_REG(KILN_UART_BASE + 0x0Cu)     /* status / write-1-to-clear */
#define U_BAUDDIV KILN_REG(KILN_UART_BASE + 0x10u)

static kiln_ring_t ring;

void kiln_uart_init(void)
{
    kiln_board_init();
    U_CTRL = 0;
    uint32_t div = KILN_UART_CLOCK_HZ / KILN_UART_BAUD;
    U_BAUDDIV = div < 16u ? 16u : div;
    U_CTRL = 0x1u | 0x2u | 0x8u;
    U_INT = 0xFu;
    (void)U_DATA;   /* dummy read: otherwise QEMU may stall the first RX byte ~1 s */
    kiln_irq_enable(KILN_UART_RX_IRQ);
}

void kiln_uart_putc(uint8_t c)
{
    while (U_STATE & 1u) {
    }
    U_DATA = c;
}

void kiln_uart_rx_irq(void)
{
    /* Clear first, then drain: a byte landing after the last STATE check re-raises the
     * interrupt instead of being stranded with RXFULL set (which stops all further RX). */
    U_INT = 0x2u;
    while (U_STATE & 2u)
        kiln_ring_put(&ring, (uint8_t)U_DATA);
}

int kiln_uart_getc(void) { return kiln_ring_get(&ring); }
void kiln_uart_idle(void) { kiln_ring_wait(&ring); }
