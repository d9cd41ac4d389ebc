/* Kiln's RP2040 second-stage bootloader ("boot2"), generic 03h variant.
 *
 * The RP2040 bootrom copies the first 256 bytes of flash to SRAM (0x20041f00), checks the
 * CRC-32 (polynomial 0x04c11db7, initial value 0xffffffff, no reflection, no final XOR) of the
 * first 252 bytes against the last 4, and calls it with lr = 0. This code sets the flash
 * interface (SSI, base 0x18000000) to turn every access to the XIP window (0x10000000) into a
 * standard serial 03h read (8 command clocks, 24 address clocks, 32 data clocks), which every
 * SPI NOR flash answers; then it points VTOR at the application's vector table at
 * 0x10000100 and enters its reset handler with its initial stack pointer.
 * Register values from the RP2040 datasheet (SSI chapter): CTRLR0 = SPI_FRF standard (bits
 * 22:21 = 0) | DFS_32 = 31 (bits 20:16) | TMOD = EEPROM read (bits 9:8 = 3); SPI_CTRLR0 =
 * XIP_CMD 0x03 (bits 31:24) | INST_L 8 bits (bits 9:8 = 2) | ADDR_L 24 bits (bits 5:2 = 6) |
 * TRANS_TYPE 1C1A (bits 1:0 = 0). Flash clock = clk_sys / 4 (BAUDR, must be even): within the
 * 03h command's limit at any RP2040 clock up to 133 MHz.
 * Position independent (literal pool PC-relative), stack only, <= 252 bytes: firmware/boot2.py
 * assembles it, pads it and appends the checksum. */
    .syntax unified
    .cpu cortex-m0plus
    .thumb
    .section .text
    .global kiln_boot2_entry
    .type kiln_boot2_entry, %function
    .thumb_func
kiln_boot2_entry:
    push {lr}
    ldr r3, =0x18000000         /* XIP_SSI_BASE */
    movs r1, #0
    str r1, [r3, #0x08]         /* SSIENR = 0: disable the SSI to configure it */
    movs r1, #4
    str r1, [r3, #0x14]         /* BAUDR = 4 */
    ldr r1, =0x001f0300
    str r1, [r3, #0x00]         /* CTRLR0 */
    ldr r1, =0x03000218
    ldr r0, =0x180000f4
    str r1, [r0]                /* SPI_CTRLR0 */
    movs r1, #0
    str r1, [r3, #0x04]         /* CTRLR1: NDF = 0, one 32-bit frame per read */
    movs r1, #1
    str r1, [r3, #0x08]         /* SSIENR = 1: XIP reads now work */
    pop {r0}
    cmp r0, #0
    beq 1f
    bx r0                       /* called as a function: return */
1:  ldr r0, =0x10000100         /* the application's vector table */
    ldr r1, =0xe000ed08         /* VTOR */
    str r0, [r1]
    ldmia r0, {r0, r1}          /* initial SP, reset handler */
    msr msp, r0
    bx r1
    .ltorg
