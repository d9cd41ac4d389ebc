/* Kiln serial protocol: frame layout, frame types and the streaming frame parser.
 *
 * Frame (little-endian):
 *   0  SYNC0 0xA5
 *   1  SYNC1 0x5A
 *   2  LEN   u16  payload length, <= KILN_MAX_PAYLOAD
 *   4  TYPE  u8
 *   5  SEQ   u8
 *   6  HCRC  u8   CRC-8 (poly 0x07, init 0) of bytes 2..5: rejects a corrupted length early
 *   7  PAYLOAD[LEN]
 *   7+LEN CRC32 u32  IEEE CRC-32 (zlib's) of bytes 2 .. 6+LEN
 *
 * This file is plain C99 with no target dependencies: the firmware and the host fuzzer
 * (firmware/fuzz/fuzz_frame.c) compile the same code. Keep docs/firmware.md and
 * boards/protocol.py in step with it.
 */
#ifndef KILN_FRAME_H
#define KILN_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define KILN_PROTOCOL_VERSION 2u
#define KILN_SYNC0 0xA5u
#define KILN_SYNC1 0x5Au
#define KILN_HEADER_BYTES 7u
#define KILN_TRAILER_BYTES 4u
#ifndef KILN_MAX_PAYLOAD
#define KILN_MAX_PAYLOAD 512u
#endif
#if KILN_MAX_PAYLOAD < 64 || KILN_MAX_PAYLOAD > 512
#error "KILN_MAX_PAYLOAD must be 64..512 (the host refuses anything else)"
#endif
#define KILN_FRAME_MAX (KILN_HEADER_BYTES + KILN_MAX_PAYLOAD + KILN_TRAILER_BYTES)
#define KILN_SESSION_BYTES 4u

/* Requests (host -> device). The reply to a request of type T has type T | KILN_REPLY.
 * Protocol v2: every request but HELLO starts with the u32 session the host opened with HELLO
 * (anything else is refused with NAK SESSION and not run); every reply but HELLO's starts with
 * the board's u32 session. Below, "s" stands for that session word. HELLO's and BOOT's layouts
 * never change, so any host can read the version of any firmware. */
enum kiln_frame_type {
    KILN_T_HELLO = 0x01,      /* u16 version, u32 nonce (!= 0, becomes the session) -> u16 version, u32 nonce, u16 max payload, u32 boot count */
    KILN_T_INFO = 0x02,       /* s -> s, u32 x 8, u8 x 4, u16 inputs, u16 outputs, u32 bytes of each input then output, "board\0core\0build\0" */
    KILN_T_SET_INPUT = 0x03,  /* s, u8 input, u32 offset, bytes -> s, u32 end offset */
    KILN_T_INVOKE = 0x04,     /* s, u32 invocation id, u32 input length, u32 input CRC-32 -> ACK, then s, u32 id, i32 rc, u64 ticks, u32 timer hz, u8 timer kind, u8 marks */
    KILN_T_GET_OUTPUT = 0x05, /* s, u32 invocation id, u8 output, u32 offset, u16 length -> s, u32 id, bytes */
    KILN_T_GET_PROFILE = 0x06,/* s, u32 invocation id, u16 first, u16 max count -> s, u32 id, u16 first, u16 count, u16 total, u16 marks, count x u64 ticks */
    KILN_T_GET_STACK = 0x07,  /* s, u8 flags (bit0: repaint) -> s, u32 size, u32 used, u32 base */
    KILN_T_EXIT = 0x08,       /* s, i32 code -> s, then semihosting exit or reset */
    KILN_T_ECHO = 0x09,       /* s, bytes -> s, same bytes */
    KILN_T_RESET = 0x0A,      /* s -> s, then a system reset (the device reboots, sends BOOT) */
    KILN_REPLY = 0x80,
    /* Unsolicited (device -> host) */
    KILN_T_BOOT = 0x70,       /* u16 version, u32 boot count */
    KILN_T_FAULT = 0x71,      /* u32 ipsr, cfsr, hfsr, r0, r1, r2, r3, r12, lr, pc, xpsr, sp */
    KILN_T_ACK = 0x7E,        /* s, u8 request type: received, working (sent before long commands) */
    KILN_T_NAK = 0x7F         /* s, u8 error, u8 offending type */
};

enum kiln_nak_error {
    KILN_E_CRC = 1,        /* frame CRC mismatch: retransmit */
    KILN_E_LENGTH = 2,     /* declared length above KILN_MAX_PAYLOAD */
    KILN_E_TYPE = 3,       /* unknown request type */
    KILN_E_ARGS = 4,       /* payload malformed or out of range */
    KILN_E_MODEL = 5,      /* reserved (kiln_model_run's rc travels in the INVOKE reply) */
    KILN_E_SESSION = 6,    /* the request's session is not ours (we rebooted, or no HELLO yet) */
    KILN_E_INPUT = 7,      /* INVOKE: our input does not have the length/CRC-32 the host named */
    KILN_E_STALE = 8,      /* GET_OUTPUT/GET_PROFILE: we hold no result of that invocation */
    KILN_E_GAP = 9         /* a frame stopped arriving mid-way (inter-byte timeout): retransmit */
};

typedef struct {
    uint8_t type;
    uint8_t seq;
    uint16_t len;
    uint32_t crc;            /* the frame's CRC32, used to recognise retransmissions */
    const uint8_t *payload;  /* points into the parser buffer: valid until the next call */
} kiln_frame_t;

typedef enum {
    KILN_RX_NONE = 0,     /* need more bytes */
    KILN_RX_FRAME = 1,    /* *out holds a valid frame */
    KILN_RX_BAD_CRC = 2,  /* header valid, CRC32 wrong: out->type/seq hold the header's values */
    KILN_RX_TOO_LONG = 3, /* header valid, length too large: out->type/seq as above */
    KILN_RX_GAP = 4       /* kiln_parser_expire: a frame with a valid header was cut short */
} kiln_rx_event_t;

typedef struct {
    uint8_t buf[KILN_FRAME_MAX];
    uint16_t n;          /* bytes buffered */
    uint16_t consumed;   /* bytes of the frame returned last time, dropped on the next call */
    uint32_t resyncs;    /* bytes discarded while hunting for a frame (statistics) */
} kiln_parser_t;

uint32_t kiln_crc32(uint32_t crc, const uint8_t *data, size_t len); /* start with crc = 0 */
uint8_t kiln_crc8(const uint8_t *data, size_t len);

void kiln_parser_init(kiln_parser_t *p);
/* Append one received byte. Call kiln_parser_next() until it returns KILN_RX_NONE after each. */
void kiln_parser_push(kiln_parser_t *p, uint8_t byte);
kiln_rx_event_t kiln_parser_next(kiln_parser_t *p, kiln_frame_t *out);
/* Bytes of an unfinished frame waiting for the rest (0: nothing pending). */
uint16_t kiln_parser_pending(const kiln_parser_t *p);
/* Inter-byte timeout: drop everything pending. Returns KILN_RX_GAP with out->type/seq set when
 * the dropped bytes began with a valid header (the sender can be told to retransmit), else
 * KILN_RX_NONE. */
kiln_rx_event_t kiln_parser_expire(kiln_parser_t *p, kiln_frame_t *out);

/* Write a complete frame into out (capacity >= KILN_HEADER_BYTES + len + 4). Returns its size,
 * or 0 when len > KILN_MAX_PAYLOAD. payload may already sit at out + KILN_HEADER_BYTES. */
size_t kiln_frame_encode(uint8_t *out, uint8_t type, uint8_t seq, const uint8_t *payload,
                         uint16_t len);

static inline uint16_t kiln_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t kiln_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline void kiln_put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void kiln_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline void kiln_put_u64(uint8_t *p, uint64_t v)
{
    kiln_put_u32(p, (uint32_t)v); kiln_put_u32(p + 4, (uint32_t)(v >> 32));
}

#endif
