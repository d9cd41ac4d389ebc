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
 * Requests mostly carry the session the fuzzer opened with HELLO, so they reach the handlers;
 * some streams pause mid-frame (the inter-byte timeout fires). One stream in four of the others
 * is a whole, unmutated transaction (HELLO, every input in random chunks, INVOKE with the input's
 * CRC, every output, the profile) whose replies are checked: no NAK, the invocation id echoed,
 * the outputs equal to the stub model's on the fuzzer's own copy of the input.
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
static size_t fw_gap_at = (size_t)-1;   /* stream position where the sender pauses once */

/* replies of the current stream, for the coherent transactions */
#define LOG_MAX 256
static struct {
    uint8_t type, seq;
    uint16_t len;
    uint8_t payload[KILN_MAX_PAYLOAD];
} reply_log[LOG_MAX];
static int n_log;

int kiln_uart_getc(void)
{
    if (fw_in_pos == fw_gap_at) {   /* a pause longer than the inter-byte timeout */
        fw_gap_at = (size_t)-1;
        fake_time += 100000000u;
        return -1;
    }
    if (fw_in_pos < fw_in_n)
        return fw_in[fw_in_pos++];
    fake_time += 100000000u;   /* the sender went quiet: let a pending frame expire */
    return -1;
}
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
        if (ev == KILN_RX_FRAME) {
            out_frames++;
            if (n_log < LOG_MAX) {
                reply_log[n_log].type = f.type;
                reply_log[n_log].seq = f.seq;
                reply_log[n_log].len = f.len;
                memcpy(reply_log[n_log].payload, f.payload, f.len);
                n_log++;
            }
        } else {
            out_bad++;
        }
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

static uint32_t fz_session = 0x5E55100Du;   /* the nonce of the fuzzer's HELLOs */
static uint32_t fz_last_id;                  /* the last invocation id a coherent run used */
static uint8_t fz_seq;

static size_t put_frame(size_t pos, uint8_t type, const uint8_t *payload, uint16_t len, int log)
{
    size_t need = KILN_HEADER_BYTES + len + KILN_TRAILER_BYTES;
    if (pos + need > STREAM_MAX)
        return pos;
    kiln_frame_encode(stream + pos, type, fz_seq++, payload, len);
    if (log && n_expect < 64) {
        expect_off[n_expect] = pos;
        expect_len[n_expect] = need;
        n_expect++;
    }
    return pos + need;
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
    if (type == KILN_T_HELLO && len >= 6 && (rnd() & 3))
        kiln_put_u32(payload + 2, fz_session);
    if (type != KILN_T_HELLO && len >= 4 && (rnd() & 7))
        kiln_put_u32(payload, fz_session);
    if (len >= 15 && (rnd() & 1)) {   /* plausible ids, indices, offsets near the edges */
        uint32_t edge = (rnd() & 1) ? 700 : 500;
        if (type == KILN_T_SET_INPUT) {
            payload[4] = (uint8_t)below(KILN_NUM_INPUTS + 1);
            kiln_put_u32(payload + 5, edge - below(600));
        } else {
            kiln_put_u32(payload + 4, (rnd() & 1) ? fz_last_id : rnd());
            payload[8] = (uint8_t)below(KILN_NUM_OUTPUTS + 1);
            kiln_put_u32(payload + 9, edge - below(600));
            kiln_put_u16(payload + 13, (uint16_t)below(600));
            if (type == KILN_T_GET_PROFILE || type == KILN_T_INVOKE)
                len = (rnd() & 1) ? (type == KILN_T_INVOKE ? 16 : 12) : len;
        }
    }
    if (type == KILN_T_EXIT || type == KILN_T_RESET)
        type = (rnd() & 7) ? KILN_T_INFO : type;   /* keep these rare: they end the loop */
    return put_frame(pos, type, payload, len, 1);
}

/* ---- a whole transaction, and the check of its replies ---- */
static uint8_t host_input[KILN_INPUT_BYTES];
static const uint32_t in_sizes[KILN_NUM_INPUTS] = {KILN_INPUT0_BYTES, KILN_INPUT1_BYTES};
static const uint32_t out_sizes[KILN_NUM_OUTPUTS] = {KILN_OUTPUT0_BYTES, KILN_OUTPUT1_BYTES};

static size_t add_transaction(size_t pos, uint32_t id)
{
    uint8_t p[KILN_MAX_PAYLOAD];
    kiln_put_u16(p, KILN_PROTOCOL_VERSION);
    kiln_put_u32(p + 2, fz_session);
    pos = put_frame(pos, KILN_T_HELLO, p, 6, 0);
    kiln_put_u32(p, fz_session);
    for (uint32_t i = 0, base = 0; i < KILN_NUM_INPUTS; base += in_sizes[i], i++) {
        for (uint32_t off = 0; off < in_sizes[i];) {
            uint32_t n = 1 + below(in_sizes[i] - off < 200 ? in_sizes[i] - off : 200);
            p[4] = (uint8_t)i;
            kiln_put_u32(p + 5, off);
            for (uint32_t k = 0; k < n; k++)
                p[9 + k] = host_input[base + off + k] = (uint8_t)rnd();
            pos = put_frame(pos, KILN_T_SET_INPUT, p, (uint16_t)(9 + n), 0);
            off += n;
        }
    }
    kiln_put_u32(p + 4, id);
    kiln_put_u32(p + 8, KILN_INPUT_BYTES);
    kiln_put_u32(p + 12, kiln_crc32(0, host_input, KILN_INPUT_BYTES));
    pos = put_frame(pos, KILN_T_INVOKE, p, 16, 0);
    for (uint32_t k = 0; k < KILN_NUM_OUTPUTS; k++) {
        for (uint32_t off = 0; off < out_sizes[k];) {
            uint32_t n = 1 + below(out_sizes[k] - off < 300 ? out_sizes[k] - off : 300);
            p[8] = (uint8_t)k;
            kiln_put_u32(p + 9, off);
            kiln_put_u16(p + 13, (uint16_t)n);
            pos = put_frame(pos, KILN_T_GET_OUTPUT, p, 15, 0);
            off += n;
        }
    }
    kiln_put_u16(p + 8, 0);
    kiln_put_u16(p + 10, 0xFFFF);
    return put_frame(pos, KILN_T_GET_PROFILE, p, 12, 0);
}

static int check_transaction(uint32_t id)
{
    uint8_t out[KILN_OUTPUT_BYTES];
    size_t got = 0;
    int invoked = 0, profiled = 0;
    for (int i = 0; i < n_log; i++) {
        const uint8_t *q = reply_log[i].payload;
        uint8_t t = reply_log[i].type;
        if (t == KILN_T_BOOT || t == KILN_T_ACK || t == (KILN_T_HELLO | KILN_REPLY))
            continue;
        if (t == KILN_T_NAK) {
            fprintf(stderr, "transaction: NAK error %u for type 0x%02x\n", q[4], q[5]);
            return 0;
        }
        if (kiln_get_u32(q) != fz_session) {
            fprintf(stderr, "transaction: reply of type 0x%02x carries another session\n", t);
            return 0;
        }
        if (t == (KILN_T_INVOKE | KILN_REPLY))
            invoked = kiln_get_u32(q + 4) == id && kiln_get_u32(q + 8) == 0;
        if (t == (KILN_T_GET_PROFILE | KILN_REPLY))
            profiled = kiln_get_u32(q + 4) == id && kiln_get_u16(q + 12) == KILN_NUM_COMMANDS + 1;
        if (t == (KILN_T_GET_OUTPUT | KILN_REPLY)) {
            if (kiln_get_u32(q + 4) != id || got + reply_log[i].len - 8u > sizeof out) {
                fprintf(stderr, "transaction: GET_OUTPUT reply with another id or too long\n");
                return 0;
            }
            memcpy(out + got, q + 8, reply_log[i].len - 8u);
            got += reply_log[i].len - 8u;
        }
    }
    if (!invoked || !profiled || got != KILN_OUTPUT_BYTES) {
        fprintf(stderr, "transaction: invoked=%d profiled=%d output bytes=%zu\n", invoked, profiled, got);
        return 0;
    }
    for (int i = 0; i < KILN_OUTPUT_BYTES; i++) {
        uint8_t want = (uint8_t)(host_input[i % KILN_INPUT_BYTES] + host_input[i % KILN_ARENA_SIZE]);
        if (out[i] != want) {
            fprintf(stderr, "transaction: output byte %d is %u, the stub model gives %u\n", i, out[i], want);
            return 0;
        }
    }
    return 1;
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
    /* static: nothing that longjmp could clobber */
    static unsigned long exact_runs, fw_bytes, transactions, it;
    for (it = 0; it < iters; it++) {
        n_expect = 0;
        int exact = (it % 4) == 0;           /* clean frames + sync-free garbage */
        int coherent = (it % 4) == 2;        /* one whole transaction, replies checked */
        uint32_t id = rnd() | 1u;
        size_t n = 0;
        if (coherent) {
            n = add_transaction(0, id);
        } else {
            int segments = 1 + (int)below(6);
            for (int s = 0; s < segments; s++) {
                n = add_garbage(n, !exact);
                n = add_frame(n);
            }
            n = add_garbage(n, !exact);
            if (!exact)
                n = (rnd() & 3) ? mutate(n) : n;
        }
        if (!coherent && !check_parser(n, exact)) {
            fprintf(stderr, "FAIL at iteration %lu (seed %s)\n", it, argc > 2 ? argv[2] : "default");
            return 1;
        }
        exact_runs += exact;
        /* the whole firmware loop */
        fw_in = stream;
        fw_in_n = n;
        fw_in_pos = 0;
        fw_gap_at = (!coherent && n && (rnd() & 3) == 0) ? below((uint32_t)n) : (size_t)-1;
        n_log = 0;
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
        if (coherent) {
            if (!check_transaction(id)) {
                fprintf(stderr, "FAIL at iteration %lu: transaction (seed %s)\n", it,
                        argc > 2 ? argv[2] : "default");
                return 1;
            }
            fz_last_id = id;
            transactions++;
        }
    }
    printf("kiln-fuzz: iterations=%lu exact=%lu transactions=%lu firmware_bytes=%lu reply_frames=%lu ok\n",
           iters, exact_runs, transactions, fw_bytes, out_frames);
    return 0;
}
