/* Nordic nRF52 UARTE (EasyDMA). TX: one DMA transfer per byte from a RAM buffer. RX: a one-byte
 * DMA buffer restarted from the ENDRX interrupt (shortcut ENDRX->STARTRX would race the copy).
 * Compiled in CI; not yet run on hardware. */
#include "kiln_fw.h"
#include "kiln_ring.h"

#define U(off) KILN_REG(KILN_UART_BASE + (off))
#define TASKS_STARTRX U(0x000u)
#define TASKS_STARTTX U(0x008u)
#define EVENTS_ENDRX U(0x110u)
#define EVENTS_ENDTX U(0x120u)
#define INTENSET U(0x304u)
#define ENABLE U(0x500u)
#define PSEL_TXD U(0x50Cu)
#define PSEL_RXD U(0x514u)
#define BAUDRATE U(0x524u)
#define RXD_PTR U(0x534u)
#define RXD_MAXCNT U(0x538u)
#define TXD_PTR U(0x544u)
#define TXD_MAXCNT U(0x548u)

static kiln_ring_t ring;
static volatile uint8_t rx_byte, tx_byte;

static uint32_t baud_reg(uint32_t baud)
{
    /* BAUDRATE = round(baud * 2^32 / 16 MHz), as the nRF52 datasheet's table does */
    return (uint32_t)((((uint64_t)baud << 32) + 8000000u) / 16000000u) & 0xFFFFF000u;
}

void kiln_uart_init(void)
{
    kiln_board_init();
    ENABLE = 0;
    PSEL_TXD = KILN_UART_TX_PIN;
    PSEL_RXD = KILN_UART_RX_PIN;
    BAUDRATE = baud_reg(KILN_UART_BAUD);
    ENABLE = 8u;
    RXD_PTR = (uint32_t)(uintptr_t)&rx_byte;
    RXD_MAXCNT = 1u;
    EVENTS_ENDRX = 0;
    INTENSET = 1u << 4;   /* ENDRX */
    TASKS_STARTRX = 1u;
    kiln_irq_enable(KILN_UART_RX_IRQ);
}

void kiln_uart_putc(uint8_t c)
{
    tx_byte = c;
    TXD_PTR = (uint32_t)(uintptr_t)&tx_byte;
    TXD_MAXCNT = 1u;
    EVENTS_ENDTX = 0;
    TASKS_STARTTX = 1u;
    while (!EVENTS_ENDTX) {
    }
    EVENTS_ENDTX = 0;
}

void kiln_uart_rx_irq(void)
{
    if (EVENTS_ENDRX) {
        EVENTS_ENDRX = 0;
        kiln_ring_put(&ring, rx_byte);
        TASKS_STARTRX = 1u;
    }
}

int kiln_uart_getc(void) { return kiln_ring_get(&ring); }
void kiln_uart_idle(void) { kiln_ring_wait(&ring); }
