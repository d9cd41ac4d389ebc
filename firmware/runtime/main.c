/* Kiln device runtime: receives framed commands over the UART, runs the model package
 * (model.h, see docs/c_package.md) and replies. Stop-and-wait: one request, one reply; a
 * retransmitted request (same seq, type and CRC as the last one) gets the cached reply again
 * instead of running twice. */
#include <stdint.h>
#include <string.h>

#include "kiln_fw.h"
#include "kiln_frame.h"
#include "model.h"

#ifndef KILN_BUILD_ID
#define KILN_BUILD_ID "dev"
#endif

static uint8_t arena[KILN_ARENA_SIZE] __attribute__((aligned(16)));
static uint8_t input[KILN_INPUT_BYTES] __attribute__((aligned(16)));
static uint8_t output[KILN_OUTPUT_BYTES] __attribute__((aligned(16)));

static kiln_parser_t rx;
static uint8_t tx[KILN_FRAME_MAX] __attribute__((aligned(4)));
static uint16_t tx_len;           /* cached last reply (0: none) */
static uint8_t last_type, last_seq;
static uint32_t last_crc;

static uint64_t prof[KILN_NUM_COMMANDS + 1];
static uint16_t prof_marks;
static uint64_t prof_t0;

/* Survives a soft reset (not zeroed): counts boots so the host can notice a reset. */
static uint32_t boot_count __attribute__((section(".noinit")));
static uint32_t boot_magic __attribute__((section(".noinit")));

void kiln_profile_mark(int index)
{
    uint64_t t = kiln_timer_now();
    kiln_marker_mark(index);
    if (index >= 0 && index <= KILN_NUM_COMMANDS) {
        prof[index] = t - prof_t0;
        prof_marks++;
    }
}

static void send(uint8_t type, uint8_t seq, uint16_t len)
{
    tx_len = (uint16_t)kiln_frame_encode(tx, type, seq, tx + KILN_HEADER_BYTES, len);
    kiln_uart_write(tx, tx_len);
}

static void send_small(uint8_t type, uint8_t seq, const uint8_t *p, uint16_t len)
{
    uint8_t f[KILN_HEADER_BYTES + 2 + KILN_TRAILER_BYTES];
    size_t n = kiln_frame_encode(f, type, seq, p, len);
    kiln_uart_write(f, (uint32_t)n);
}

static void send_nak(uint8_t seq, uint8_t err, uint8_t type)
{
    uint8_t p[2] = {err, type};
    send_small(KILN_T_NAK, seq, p, 2);
}

static size_t put_str(uint8_t *p, size_t room, const char *s)
{
    size_t n = strlen(s) + 1;
    if (n > room)
        return 0;
    memcpy(p, s, n);
    return n;
}

/* Each handler writes its reply payload at r and returns its length, or -error for a NAK. */
static int do_hello(const kiln_frame_t *f, uint8_t *r)
{
    if (f->len < 6)
        return -KILN_E_ARGS;
    kiln_put_u16(r, KILN_PROTOCOL_VERSION);
    memcpy(r + 2, f->payload + 2, 4);   /* echo the nonce */
    kiln_put_u16(r + 6, KILN_MAX_PAYLOAD);
    kiln_put_u32(r + 8, boot_count);
    return 12;
}

static int do_info(uint8_t *r)
{
    kiln_put_u32(r + 0, KILN_ARENA_SIZE);
    kiln_put_u32(r + 4, KILN_INPUT_BYTES);
    kiln_put_u32(r + 8, KILN_OUTPUT_BYTES);
    kiln_put_u32(r + 12, KILN_NUM_COMMANDS);
    kiln_put_u32(r + 16, KILN_CLOCK_HZ);
    kiln_put_u32(r + 20, kiln_timer_hz());
    kiln_put_u32(r + 24, (uint32_t)((uintptr_t)&__stack_top - (uintptr_t)&__stack_start));
    kiln_put_u32(r + 28, (uint32_t)(uintptr_t)arena);
    r[32] = kiln_timer_kind();
    r[33] = KILN_HAS_FPU;
    r[34] = KILN_PROTOCOL_VERSION;
    r[35] = 0;
    size_t n = 36, k;
    const char *strs[3] = {KILN_BOARD_NAME, KILN_CORE, KILN_BUILD_ID};
    for (int i = 0; i < 3; i++) {
        k = put_str(r + n, KILN_MAX_PAYLOAD - n, strs[i]);
        if (!k)
            break;
        n += k;
    }
    return (int)n;
}

static int do_set_input(const kiln_frame_t *f, uint8_t *r)
{
    if (f->len < 4)
        return -KILN_E_ARGS;
    uint32_t off = kiln_get_u32(f->payload), n = f->len - 4u;
    if (off > KILN_INPUT_BYTES || n > KILN_INPUT_BYTES - off)
        return -KILN_E_ARGS;
    memcpy(input + off, f->payload + 4, n);
    kiln_put_u32(r, off + n);
    return 4;
}

static int do_invoke(uint8_t *r)
{
    memset(prof, 0, sizeof prof);
    prof_marks = 0;
    uint64_t t0 = kiln_timer_now();
    prof_t0 = t0;
    kiln_marker_begin();
    int rc = kiln_model_run(arena, input, output);
    kiln_marker_end();
    uint64_t t1 = kiln_timer_now();
    kiln_put_u32(r, (uint32_t)rc);
    kiln_put_u64(r + 4, t1 - t0);
    kiln_put_u32(r + 12, kiln_timer_hz());
    r[16] = kiln_timer_kind();
    r[17] = (uint8_t)(prof_marks > 255 ? 255 : prof_marks);
    return 18;
}

static int do_get_output(const kiln_frame_t *f, uint8_t *r)
{
    if (f->len < 6)
        return -KILN_E_ARGS;
    uint32_t off = kiln_get_u32(f->payload), n = kiln_get_u16(f->payload + 4);
    if (n > KILN_MAX_PAYLOAD || off > KILN_OUTPUT_BYTES || n > KILN_OUTPUT_BYTES - off)
        return -KILN_E_ARGS;
    memcpy(r, output + off, n);
    return (int)n;
}

static int do_get_profile(const kiln_frame_t *f, uint8_t *r)
{
    if (f->len < 2)
        return -KILN_E_ARGS;
    uint32_t first = kiln_get_u16(f->payload), total = KILN_NUM_COMMANDS + 1u;
    if (first > total)
        return -KILN_E_ARGS;
    uint32_t count = total - first, room = (KILN_MAX_PAYLOAD - 8u) / 8u;
    if (count > room)
        count = room;
    kiln_put_u16(r, (uint16_t)first);
    kiln_put_u16(r + 2, (uint16_t)count);
    kiln_put_u16(r + 4, (uint16_t)total);
    kiln_put_u16(r + 6, prof_marks);
    for (uint32_t i = 0; i < count; i++)
        kiln_put_u64(r + 8 + 8 * i, prof[first + i]);
    return (int)(8 + 8 * count);
}

static int do_get_stack(const kiln_frame_t *f, uint8_t *r)
{
    uint32_t size = (uint32_t)((uintptr_t)&__stack_top - (uintptr_t)&__stack_start);
    kiln_put_u32(r, size);
    kiln_put_u32(r + 4, kiln_stack_used());
    kiln_put_u32(r + 8, (uint32_t)(uintptr_t)&__stack_start);
    if (f->len >= 1 && (f->payload[0] & 1u))
        kiln_stack_repaint();
    return 12;
}

static void handle(const kiln_frame_t *f)
{
    if (f->type != KILN_T_HELLO && tx_len && f->seq == last_seq && f->type == last_type &&
        f->crc == last_crc) {
        kiln_uart_write(tx, tx_len);    /* our reply was lost: send it again */
        return;
    }
    uint8_t *r = tx + KILN_HEADER_BYTES;
    int n;
    if (f->type == KILN_T_INVOKE)   /* long-running: tell the host we have it */
        send_small(KILN_T_ACK, f->seq, &f->type, 1);
    switch (f->type) {
    case KILN_T_HELLO: n = do_hello(f, r); break;
    case KILN_T_INFO: n = do_info(r); break;
    case KILN_T_SET_INPUT: n = do_set_input(f, r); break;
    case KILN_T_INVOKE: n = do_invoke(r); break;
    case KILN_T_GET_OUTPUT: n = do_get_output(f, r); break;
    case KILN_T_GET_PROFILE: n = do_get_profile(f, r); break;
    case KILN_T_GET_STACK: n = do_get_stack(f, r); break;
    case KILN_T_ECHO: memmove(r, f->payload, f->len); n = f->len; break;
    case KILN_T_EXIT:
        send(KILN_T_EXIT | KILN_REPLY, f->seq, 0);
        kiln_exit(f->len >= 4 ? (int)kiln_get_u32(f->payload) : 0);
    case KILN_T_RESET:
        send(KILN_T_RESET | KILN_REPLY, f->seq, 0);
        kiln_reset();
    default: n = -KILN_E_TYPE; break;
    }
    if (n < 0) {
        tx_len = 0;
        send_nak(f->seq, (uint8_t)-n, f->type);
        return;
    }
    last_seq = f->seq;
    last_type = f->type;
    last_crc = f->crc;
    send((uint8_t)(f->type | KILN_REPLY), f->seq, (uint16_t)n);
}

int main(void)
{
    if (boot_magic != 0x4B494C4Eu) {   /* "KILN": first power-up */
        boot_magic = 0x4B494C4Eu;
        boot_count = 0;
    }
    boot_count++;
    kiln_timer_init();
    kiln_parser_init(&rx);
    kiln_uart_init();
    kiln_irqs_on();

    uint8_t *r = tx + KILN_HEADER_BYTES;
    kiln_put_u16(r, KILN_PROTOCOL_VERSION);
    kiln_put_u32(r + 2, boot_count);
    send(KILN_T_BOOT, 0, 6);
    tx_len = 0;

    for (;;) {
        int c = kiln_uart_getc();
        if (c < 0) {
            kiln_uart_idle();
            continue;
        }
        kiln_parser_push(&rx, (uint8_t)c);
        kiln_frame_t f;
        kiln_rx_event_t ev;
        while ((ev = kiln_parser_next(&rx, &f)) != KILN_RX_NONE) {
            if (ev == KILN_RX_FRAME)
                handle(&f);
            else
                send_nak(f.seq, ev == KILN_RX_BAD_CRC ? KILN_E_CRC : KILN_E_LENGTH, f.type);
        }
    }
}
