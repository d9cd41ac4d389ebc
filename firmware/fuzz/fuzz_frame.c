/* Host fuzzer for the frame parser and the firmware command loop.
 *
 *   gcc -fsanitize=address,undefined -fno-sanitize-recover=all -g -O1 -DKILN_PROFILE \
 *       -I firmware/fuzz -I firmware/runtime firmware/fuzz/fuzz_frame.c \
 *       firmware/runtime/kiln_frame.c firmware/runtime/main.c -o fuzz_frame
 *   ./fuzz_frame ITERATIONS SEED
 *
 * Each iteration builds a byte stream of random garbage and valid request frames (random types,
 * in- and out-of-range arguments), optionally mutates it (bit flips, byte insertions, deletions,
 * truncation, splices), then
 *   1. feeds it to a bare parser and checks its invariants (every frame returned re-encodes to
 *      the same bytes, the buffer never overflows), and, for unmutated streams whose garbage
 *      has no sync byte, that every frame is found, in order;
 *   2. runs it through the real firmware main loop (main.c) with a fake UART, and checks that
 *      everything the firmware sends back parses as valid frames with no byte skipped.
 * Any sanitizer report aborts the process. Prints a summary line; exit status 0 on success. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_frame.h"
#include "kiln_fw.h"
#include "model.h"

/* ---- fakes for the hardware the firmware touches ---- */
uint32_t __stack_start, __stack_top;
static jmp_buf fw_exit;
static const uint8_t *fw_in;
static size_t fw_in_n, fw_in_pos;
static kiln_parser_t host_rx;
static unsigned long out_frames, out_bad;
static uint64_t fake_time;

int kiln_uart_getc(void) { return fw_in_pos < fw_in_n ? fw_in[fw_in_pos++] : -1; }
void kiln_uart_idle(void) { longjmp(fw_exit, 1); }
void kiln_uart_init(void) {}
void kiln_uart_rx_irq(void) {}
void kiln_uart_putc(uint8_t c)
{
    kiln_frame_t f;
    kiln_rx_event_t ev;
    uint32_t before = host_rx.resyncs;
    kiln_parser_push(&host_rx, c);
    while ((ev = kiln_parser_next(&host_rx, &f)) != KILN_RX_NONE) {
        if (ev == KILN_RX_FRAME)
            out_frames++;
        else
            out_bad++;
    }
    if (host_rx.resyncs != before)
        out_bad++;
}
void kiln_uart_write(const uint8_t *d, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        kiln_uart_putc(d[i]);
}
void kiln_timer_init(void) {}
uint64_t kiln_timer_now(void) { return fake_time += 7; }
uint32_t kiln_timer_hz(void) { return 1000000u; }
uint8_t kiln_timer_kind(void) { return KILN_TIMER_SYSTICK; }
void kiln_marker_begin(void) {}
void kiln_marker_end(void) {}
void kiln_marker_mark(int i) { (void)i; }
uint32_t kiln_stack_used(void) { return 0; }
void kiln_stack_repaint(void) {}
void kiln_irq_enable(uint32_t irq) { (void)irq; }
void kiln_exit(int code) { (void)code; longjmp(fw_exit, 2); }
void kiln_reset(void) { longjmp(fw_exit, 3); }

/* ---- stub model: touches every byte it is given, calls the profile hook ---- */
const char *const kiln_command_names[KILN_NUM_COMMANDS] = {0};
const uint32_t kiln_command_macs[KILN_NUM_COMMANDS] = {0};
int kiln_model_run(uint8_t *arena, const void *input, void *output)
{
    const uint8_t *in = input;
    uint8_t *out = output;
    for (int i = 0; i <= KILN_NUM_COMMANDS; i++)
        kiln_profile_mark(i);
    for (int i = 0; i < KILN_ARENA_SIZE; i++)
        arena[i] = in[i];
    for (int i = 0; i < KILN_OUTPUT_BYTES; i++)
        out[i] = (uint8_t)(in[i % KILN_INPUT_BYTES] + arena[i % KILN_ARENA_SIZE]);
    return 0;
}
int kiln_fw_main(void);   /* main.c's main, renamed with -Dmain=kiln_fw_main */

/* ---- random stream generation ---- */
static uint64_t rng_state;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static uint32_t below(uint32_t n) { return n ? rnd() % n : 0; }

#define STREAM_MAX 8192
static uint8_t stream[STREAM_MAX + 64];
static size_t expect_off[64], expect_len[64];
static int n_expect;

static size_t add_garbage(size_t pos, int allow_sync)
{
    uint32_t n = below(40);
    for (uint32_t i = 0; i < n && pos < STREAM_MAX; i++) {
        uint8_t b = (uint8_t)rnd();
        if (!allow_sync && b == KILN_SYNC0)
            b = 0;
        stream[pos++] = b;
    }
    return pos;
}

static size_t add_frame(size_t pos)
{
    static const uint8_t types[] = {KILN_T_HELLO, KILN_T_INFO, KILN_T_SET_INPUT, KILN_T_INVOKE,
                                    KILN_T_GET_OUTPUT, KILN_T_GET_PROFILE, KILN_T_GET_STACK,
                                    KILN_T_ECHO, KILN_T_EXIT, KILN_T_RESET, 0x55, 0xFF, 0x00};
    uint8_t payload[KILN_MAX_PAYLOAD];
    uint8_t type = types[below(sizeof types)];
    uint16_t len = (uint16_t)below((rnd() & 3) ? 48 : KILN_MAX_PAYLOAD + 1);
    for (uint16_t i = 0; i < len; i++)
        payload[i] = (uint8_t)rnd();
    if (len >= 6 && (rnd() & 1)) {   /* plausible offsets/lengths near the buffer edges */
        uint32_t edge = (rnd() & 1) ? KILN_INPUT_BYTES : KILN_OUTPUT_BYTES;
        kiln_put_u32(payload, edge - below(600));
        kiln_put_u16(payload + 4, (uint16_t)below(600));
    }
    if (type == KILN_T_EXIT || type == KILN_T_RESET)
        type = (rnd() & 7) ? KILN_T_INFO : type;   /* keep these rare: they end the loop */
    size_t need = KILN_HEADER_BYTES + len + KILN_TRAILER_BYTES;
    if (pos + need > STREAM_MAX)
        return pos;
    kiln_frame_encode(stream + pos, type, (uint8_t)rnd(), payload, len);
    if (n_expect < 64) {
        expect_off[n_expect] = pos;
        expect_len[n_expect] = need;
        n_expect++;
    }
    return pos + need;
}

static size_t mutate(size_t n)
{
    int k = 1 + (int)below(8);
    for (int m = 0; m < k && n > 0; m++) {
        size_t at = below((uint32_t)n);
        switch (below(5)) {
        case 0: stream[at] ^= (uint8_t)(1u << below(8)); break;
        case 1: stream[at] = (uint8_t)rnd(); break;
        case 2: /* insert */
            if (n < STREAM_MAX) {
                memmove(stream + at + 1, stream + at, n - at);
                stream[at] = (rnd() & 1) ? KILN_SYNC0 : (uint8_t)rnd();
                n++;
            }
            break;
        case 3: /* delete */
            memmove(stream + at, stream + at + 1, n - at - 1);
            n--;
            break;
        case 4: n = at; break;   /* truncate */
        }
    }
    return n;
}

static int check_parser(size_t n, int exact)
{
    static kiln_parser_t p;
    kiln_parser_init(&p);
    kiln_frame_t f;
    kiln_rx_event_t ev;
    uint8_t re[KILN_FRAME_MAX];
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        kiln_parser_push(&p, stream[i]);
        while ((ev = kiln_parser_next(&p, &f)) != KILN_RX_NONE) {
            if (p.n > KILN_FRAME_MAX) {
                fprintf(stderr, "parser buffer overflow: n=%u\n", p.n);
                return 0;
            }
            if (ev != KILN_RX_FRAME)
                continue;
            if (f.len > KILN_MAX_PAYLOAD) {
                fprintf(stderr, "frame longer than the maximum: %u\n", f.len);
                return 0;
            }
            size_t m = kiln_frame_encode(re, f.type, f.seq, f.payload, f.len);
            if (kiln_get_u32(re + m - 4) != f.crc) {
                fprintf(stderr, "accepted a frame whose CRC does not match\n");
                return 0;
            }
            if (exact) {
                if (found >= n_expect || memcmp(re, stream + expect_off[found], m) != 0 ||
                    m != expect_len[found]) {
                    fprintf(stderr, "frame %d: parser returned a frame that was not sent\n", found);
                    return 0;
                }
            }
            found++;
        }
    }
    if (exact && found != n_expect) {
        fprintf(stderr, "parser found %d of %d clean frames\n", found, n_expect);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    unsigned long iters = argc > 1 ? strtoul(argv[1], NULL, 0) : 100000ul;
    rng_state = argc > 2 ? strtoull(argv[2], NULL, 0) : 0x9E3779B97F4A7C15ull;
    if (!rng_state)
        rng_state = 1;
    unsigned long exact_runs = 0, fw_bytes = 0;
    for (unsigned long it = 0; it < iters; it++) {
        n_expect = 0;
        int exact = (it % 4) == 0;           /* clean frames + sync-free garbage */
        size_t n = 0;
        int segments = 1 + (int)below(6);
        for (int s = 0; s < segments; s++) {
            n = add_garbage(n, !exact);
            n = add_frame(n);
        }
        n = add_garbage(n, !exact);
        if (!exact)
            n = (rnd() & 3) ? mutate(n) : n;
        if (!check_parser(n, exact)) {
            fprintf(stderr, "FAIL at iteration %lu (seed %s)\n", it, argc > 2 ? argv[2] : "default");
            return 1;
        }
        exact_runs += exact;
        /* the whole firmware loop */
        fw_in = stream;
        fw_in_n = n;
        fw_in_pos = 0;
        kiln_parser_init(&host_rx);
        while (fw_in_pos < fw_in_n) {
            if (setjmp(fw_exit) == 0)
                kiln_fw_main();
        }
        fw_bytes += n;
        if (out_bad) {
            fprintf(stderr, "FAIL at iteration %lu: firmware sent %lu malformed bytes/frames\n", it, out_bad);
            return 1;
        }
    }
    printf("kiln-fuzz: iterations=%lu exact=%lu firmware_bytes=%lu reply_frames=%lu ok\n", iters,
           exact_runs, fw_bytes, out_frames);
    return 0;
}
