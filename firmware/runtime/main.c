/* Kiln device runtime: receives framed commands over the UART, runs the model package
 * (model.h, see docs/c_package.md) and replies. Stop-and-wait: one request, one reply; a
 * retransmitted request (same seq, type and CRC as the last one) gets the cached reply again
 * instead of running twice.
 *
 * Nothing survives a reset but the boot counter, and nothing stale is ever handed out:
 *  - every request but HELLO must carry the session the host opened with HELLO (0 after boot:
 *    a board that rebooted refuses everything with NAK SESSION until the host says HELLO);
 *  - INVOKE names the length and CRC-32 of the whole input and runs only if the input buffer
 *    has exactly that (else NAK INPUT);
 *  - INVOKE names an invocation id; GET_OUTPUT / GET_PROFILE must name the same one (else NAK
 *    STALE), and the reply echoes it.
 * A frame that stops arriving mid-way is dropped after KILN_RX_GAP_MS without bytes (NAK GAP
 * when its header was intact), so the retransmission parses cleanly at once. */
#include <stdint.h>
#include <string.h>

#include "kiln_fw.h"
#include "kiln_frame.h"
#include "kiln_io.h"
#include "model.h"

#ifndef KILN_BUILD_ID
#define KILN_BUILD_ID "dev"
#endif
/* Inter-byte timeout: a frame with no byte for this long is dropped (NAK GAP). 20 ms is 230
 * byte times at 115200 baud. Emulated images (semihosting on: QEMU) measure it in virtual time,
 * which advances only while the firmware polls: QEMU delivers serial bytes from another thread,
 * which a loaded host can hold up for many milliseconds, so they wait 200 ms of it. */
#ifndef KILN_RX_GAP_MS
#if KILN_SEMIHOSTING
#define KILN_RX_GAP_MS 200u
#else
#define KILN_RX_GAP_MS 20u
#endif
#endif

static uint8_t arena[KILN_ARENA_SIZE] __attribute__((aligned(16)));
static uint8_t input[KILN_INPUT_BYTES] __attribute__((aligned(16)));
static uint8_t output[KILN_OUTPUT_BYTES] __attribute__((aligned(16)));

static kiln_parser_t rx;
static uint8_t tx[KILN_FRAME_MAX] __attribute__((aligned(4)));
static uint16_t tx_len;           /* cached last reply (0: none) */
static uint8_t last_type, last_seq;
static uint32_t last_crc;

static uint32_t session;          /* the host's HELLO nonce; 0 until the first HELLO */
static uint32_t out_id;           /* invocation whose output `output` holds (0: none) */
static uint32_t prof_id;          /* invocation whose profile `prof` holds (0: none) */

static uint64_t prof[KILN_NUM_COMMANDS + 1];
static uint16_t prof_marks;
static uint64_t prof_t0;

/* Survives a soft reset (not zeroed): counts boots so the host can notice a reset. */
static uint32_t boot_count __attribute__((section(".noinit")));
static uint32_t boot_magic __attribute__((section(".noinit")));

#define S KILN_SESSION_BYTES
#define INFO_FIXED 40u
_Static_assert(S + INFO_FIXED + 4u * (KILN_NUM_INPUTS + KILN_NUM_OUTPUTS) + 8u <= KILN_MAX_PAYLOAD,
               "INFO does not fit KILN_MAX_PAYLOAD");
_Static_assert(KILN_NUM_COMMANDS + 1 <= 0xFFFF, "too many commands for GET_PROFILE");

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

/* ACK / NAK: s, then up to two bytes */
static void send_small(uint8_t type, uint8_t seq, uint8_t a, uint8_t b, uint16_t extra)
{
    uint8_t f[KILN_HEADER_BYTES + S + 2 + KILN_TRAILER_BYTES];
    uint8_t *p = f + KILN_HEADER_BYTES;
    kiln_put_u32(p, session);
    p[S] = a;
    p[S + 1] = b;
    size_t n = kiln_frame_encode(f, type, seq, p, (uint16_t)(S + extra));
    kiln_uart_write(f, (uint32_t)n);
}

static void send_nak(uint8_t seq, uint8_t err, uint8_t type) { send_small(KILN_T_NAK, seq, err, type, 2); }

static size_t put_str(uint8_t *p, size_t room, const char *s)
{
    size_t n = strlen(s) + 1;
    if (n > room)
        return 0;
    memcpy(p, s, n);
    return n;
}

static uint32_t input_offset(uint32_t index)
{
    uint32_t off = 0;
    for (uint32_t i = 0; i < index; i++)
        off += kiln_input_sizes[i];
    return off;
}

static uint32_t output_offset(uint32_t index)
{
    uint32_t off = 0;
    for (uint32_t i = 0; i < index; i++)
        off += kiln_output_sizes[i];
    return off;
}

/* Each handler gets the request's arguments (after the session: a, n bytes), writes its reply
 * payload after the session at r and returns its length, or -error for a NAK. */
static int do_hello(const kiln_frame_t *f, uint8_t *r)
{
    if (f->len < 6 || kiln_get_u32(f->payload + 2) == 0)
        return -KILN_E_ARGS;
    session = kiln_get_u32(f->payload + 2);
    kiln_put_u16(r, KILN_PROTOCOL_VERSION);
    kiln_put_u32(r + 2, session);     /* echo the nonce */
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
    kiln_put_u16(r + 36, KILN_NUM_INPUTS);
    kiln_put_u16(r + 38, KILN_NUM_OUTPUTS);
    size_t n = INFO_FIXED, k;
    for (uint32_t i = 0; i < KILN_NUM_INPUTS; i++, n += 4)
        kiln_put_u32(r + n, kiln_input_sizes[i]);
    for (uint32_t i = 0; i < KILN_NUM_OUTPUTS; i++, n += 4)
        kiln_put_u32(r + n, kiln_output_sizes[i]);
    const char *strs[3] = {KILN_BOARD_NAME, KILN_CORE, KILN_BUILD_ID};
    for (int i = 0; i < 3; i++) {
        k = put_str(r + n, KILN_MAX_PAYLOAD - S - n, strs[i]);
        if (!k)
            break;
        n += k;
    }
    return (int)n;
}

static int do_set_input(const uint8_t *a, uint32_t len, uint8_t *r)
{
    if (len < 5 || a[0] >= KILN_NUM_INPUTS)
        return -KILN_E_ARGS;
    uint32_t size = kiln_input_sizes[a[0]], off = kiln_get_u32(a + 1), n = len - 5u;
    if (off > size || n > size - off)
        return -KILN_E_ARGS;
    memcpy(input + input_offset(a[0]) + off, a + 5, n);
    kiln_put_u32(r, off + n);
    return 4;
}

static int do_invoke(const kiln_frame_t *f, const uint8_t *a, uint32_t len, uint8_t *r)
{
    if (len != 12 || kiln_get_u32(a) == 0)
        return -KILN_E_ARGS;
    uint32_t id = kiln_get_u32(a);
    send_small(KILN_T_ACK, f->seq, f->type, 0, 1);   /* long-running: tell the host we have it */
    if (kiln_get_u32(a + 4) != KILN_INPUT_BYTES ||
        kiln_get_u32(a + 8) != kiln_crc32(0, input, KILN_INPUT_BYTES))
        return -KILN_E_INPUT;
    out_id = prof_id = 0;
    memset(prof, 0, sizeof prof);
    prof_marks = 0;
    uint64_t t0 = kiln_timer_now();
    prof_t0 = t0;
    kiln_marker_begin();
    int rc = kiln_model_run(arena, input, output);
    kiln_marker_end();
    uint64_t t1 = kiln_timer_now();
    out_id = rc == 0 ? id : 0;
    prof_id = id;
    kiln_put_u32(r, id);
    kiln_put_u32(r + 4, (uint32_t)rc);
    kiln_put_u64(r + 8, t1 - t0);
    kiln_put_u32(r + 16, kiln_timer_hz());
    r[20] = kiln_timer_kind();
    r[21] = (uint8_t)(prof_marks > 255 ? 255 : prof_marks);
    return 22;
}

static int do_get_output(const uint8_t *a, uint32_t len, uint8_t *r)
{
    if (len != 11 || a[4] >= KILN_NUM_OUTPUTS)
        return -KILN_E_ARGS;
    uint32_t id = kiln_get_u32(a), size = kiln_output_sizes[a[4]];
    uint32_t off = kiln_get_u32(a + 5), n = kiln_get_u16(a + 9);
    if (n > KILN_MAX_PAYLOAD - S - 4u || off > size || n > size - off)
        return -KILN_E_ARGS;
    if (id == 0 || id != out_id)
        return -KILN_E_STALE;
    kiln_put_u32(r, id);
    memcpy(r + 4, output + output_offset(a[4]) + off, n);
    return (int)(4 + n);
}

static int do_get_profile(const uint8_t *a, uint32_t len, uint8_t *r)
{
    if (len != 8)
        return -KILN_E_ARGS;
    uint32_t id = kiln_get_u32(a), first = kiln_get_u16(a + 4), want = kiln_get_u16(a + 6);
    uint32_t total = KILN_NUM_COMMANDS + 1u, room = (KILN_MAX_PAYLOAD - S - 12u) / 8u;
    if (first > total)
        return -KILN_E_ARGS;
    if (id == 0 || id != prof_id)
        return -KILN_E_STALE;
    uint32_t count = total - first;
    if (count > room)
        count = room;
    if (count > want)
        count = want;
    kiln_put_u32(r, id);
    kiln_put_u16(r + 4, (uint16_t)first);
    kiln_put_u16(r + 6, (uint16_t)count);
    kiln_put_u16(r + 8, (uint16_t)total);
    kiln_put_u16(r + 10, prof_marks);
    for (uint32_t i = 0; i < count; i++)
        kiln_put_u64(r + 12 + 8 * i, prof[first + i]);
    return (int)(12 + 8 * count);
}

static int do_get_stack(const uint8_t *a, uint32_t len, uint8_t *r)
{
    uint32_t size = (uint32_t)((uintptr_t)&__stack_top - (uintptr_t)&__stack_start);
    kiln_put_u32(r, size);
    kiln_put_u32(r + 4, kiln_stack_used());
    kiln_put_u32(r + 8, (uint32_t)(uintptr_t)&__stack_start);
    if (len >= 1 && (a[0] & 1u))
        kiln_stack_repaint();
    return 12;
}

static int dispatch(const kiln_frame_t *f, uint8_t *r)
{
    const uint8_t *a = f->payload + S;
    uint32_t len = f->len - S;
    switch (f->type) {
    case KILN_T_INFO: return do_info(r);
    case KILN_T_SET_INPUT: return do_set_input(a, len, r);
    case KILN_T_INVOKE: return do_invoke(f, a, len, r);
    case KILN_T_GET_OUTPUT: return do_get_output(a, len, r);
    case KILN_T_GET_PROFILE: return do_get_profile(a, len, r);
    case KILN_T_GET_STACK: return do_get_stack(a, len, r);
    case KILN_T_ECHO: memmove(r, a, len); return (int)len;
    case KILN_T_EXIT:
        kiln_put_u32(tx + KILN_HEADER_BYTES, session);
        send(KILN_T_EXIT | KILN_REPLY, f->seq, S);
        kiln_exit(len >= 4 ? (int)kiln_get_u32(a) : 0);
    case KILN_T_RESET:
        kiln_put_u32(tx + KILN_HEADER_BYTES, session);
        send(KILN_T_RESET | KILN_REPLY, f->seq, S);
        kiln_reset();
    default: return -KILN_E_TYPE;
    }
}

static void handle(const kiln_frame_t *f)
{
    uint8_t *r = tx + KILN_HEADER_BYTES;
    int n;
    if (f->type == KILN_T_HELLO) {
        tx_len = 0;                         /* a new session: forget the cached reply */
        n = do_hello(f, r);
        if (n < 0) {
            send_nak(f->seq, (uint8_t)-n, f->type);
            return;
        }
        send((uint8_t)(f->type | KILN_REPLY), f->seq, (uint16_t)n);
        tx_len = 0;
        return;
    }
    if (f->len < S || session == 0 || kiln_get_u32(f->payload) != session) {
        send_nak(f->seq, KILN_E_SESSION, f->type);   /* run nothing for a stale session */
        return;
    }
    if (tx_len && f->seq == last_seq && f->type == last_type && f->crc == last_crc) {
        kiln_uart_write(tx, tx_len);    /* our reply was lost: send it again */
        return;
    }
    n = dispatch(f, r + S);
    if (n < 0) {
        tx_len = 0;
        send_nak(f->seq, (uint8_t)-n, f->type);
        return;
    }
    last_seq = f->seq;
    last_type = f->type;
    last_crc = f->crc;
    kiln_put_u32(r, session);
    send((uint8_t)(f->type | KILN_REPLY), f->seq, (uint16_t)(S + n));
}

static void receive(kiln_rx_event_t ev, const kiln_frame_t *f)
{
    if (ev == KILN_RX_FRAME)
        handle(f);
    else if (ev != KILN_RX_NONE)
        send_nak(f->seq, ev == KILN_RX_BAD_CRC ? KILN_E_CRC : ev == KILN_RX_GAP ? KILN_E_GAP
                                                                                : KILN_E_LENGTH,
                 f->type);
}

int main(void)
{
    if (boot_magic != 0x4B494C4Eu) {   /* "KILN": first power-up */
        boot_magic = 0x4B494C4Eu;
        boot_count = 0;
    }
    boot_count++;
    session = out_id = prof_id = 0;
    tx_len = 0;
    kiln_timer_init();
    kiln_parser_init(&rx);
    kiln_uart_init();
    kiln_irqs_on();

    uint8_t *r = tx + KILN_HEADER_BYTES;
    kiln_put_u16(r, KILN_PROTOCOL_VERSION);
    kiln_put_u32(r + 2, boot_count);
    send(KILN_T_BOOT, 0, 6);
    tx_len = 0;

    const uint32_t gap = kiln_timer_hz() / 1000u * KILN_RX_GAP_MS;
    uint32_t last_rx = 0;
    kiln_frame_t f;
    for (;;) {
        int c = kiln_uart_getc();
        if (c < 0) {
            /* Sleep only between frames; while one is unfinished, poll its inter-byte timeout
             * (no timer interrupt is needed, and a virtual clock cannot jump meanwhile). */
            if (kiln_parser_pending(&rx) == 0)
                kiln_uart_idle();
            else if ((uint32_t)kiln_timer_now() - last_rx > gap)
                receive(kiln_parser_expire(&rx, &f), &f);
            continue;
        }
        last_rx = (uint32_t)kiln_timer_now();
        kiln_parser_push(&rx, (uint8_t)c);
        kiln_rx_event_t ev;
        while ((ev = kiln_parser_next(&rx, &f)) != KILN_RX_NONE)
            receive(ev, &f);
    }
}
