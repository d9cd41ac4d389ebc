/* Helpers shared by every UART driver. */
#include "kiln_fw.h"

void kiln_uart_write(const uint8_t *data, uint32_t len)
{
    for (uint32_t i = 0; i < len; i++)
        kiln_uart_putc(data[i]);
}
