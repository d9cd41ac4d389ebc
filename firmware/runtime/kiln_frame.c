/* Frame codec and streaming parser; see kiln_frame.h for the layout.
 *
 * The parser keeps the bytes of the frame in progress. Whenever something is wrong (bad sync,
 * bad header CRC, length too large, bad CRC32) it drops the first buffered byte and re-scans
 * what is left, so a real frame that starts inside garbage or inside a corrupted frame is still
 * found without waiting for a retransmission. */
#include "kiln_frame.h"

static const uint32_t crc32_nibble[16] = {
    0x00000000u, 0x1DB71064u, 0x3B6E20C8u, 0x26D930ACu, 0x76DC4190u, 0x6B6B51F4u,
    0x4DB26158u, 0x5005713Cu, 0xEDB88320u, 0xF00F9344u, 0xD6D6A3E8u, 0xCB61B38Cu,
    0x9B64C2B0u, 0x86D3D2D4u, 0xA00AE278u, 0xBDBDF21Cu,
};

uint32_t kiln_crc32(uint32_t crc, const uint8_t *data, size_t len)
{
    crc = ~crc;
    for (size_t i = 0; i < len; i++) {
        crc ^= data[i];
        crc = (crc >> 4) ^ crc32_nibble[crc & 0xFu];
        crc = (crc >> 4) ^ crc32_nibble[crc & 0xFu];
    }
    return ~crc;
}

uint8_t kiln_crc8(const uint8_t *data, size_t len)
{
    uint8_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= data[i];
        for (int b = 0; b < 8; b++)
            crc = (uint8_t)((crc & 0x80u) ? (crc << 1) ^ 0x07u : (crc << 1));
    }
    return crc;
}

void kiln_parser_init(kiln_parser_t *p)
{
    p->n = 0;
    p->consumed = 0;
    p->resyncs = 0;
}

static void drop(kiln_parser_t *p, uint16_t k)
{
    if (k > p->n)
        k = p->n;
    for (uint16_t i = k; i < p->n; i++)
        p->buf[i - k] = p->buf[i];
    p->n = (uint16_t)(p->n - k);
}

void kiln_parser_push(kiln_parser_t *p, uint8_t byte)
{
    if (p->consumed) {
        drop(p, p->consumed);
        p->consumed = 0;
    }
    if (p->n >= KILN_FRAME_MAX) { /* caller skipped kiln_parser_next(): never overflow */
        drop(p, 1);
        p->resyncs++;
    }
    p->buf[p->n++] = byte;
}

kiln_rx_event_t kiln_parser_next(kiln_parser_t *p, kiln_frame_t *out)
{
    if (p->consumed) {
        drop(p, p->consumed);
        p->consumed = 0;
    }
    for (;;) {
        const uint8_t *b = p->buf;
        if (p->n == 0)
            return KILN_RX_NONE;
        if (b[0] != KILN_SYNC0 || (p->n >= 2 && b[1] != KILN_SYNC1)) {
            drop(p, 1);
            p->resyncs++;
            continue;
        }
        if (p->n < KILN_HEADER_BYTES)
            return KILN_RX_NONE;
        if (kiln_crc8(b + 2, 4) != b[6]) {
            drop(p, 1);
            p->resyncs++;
            continue;
        }
        uint16_t len = kiln_get_u16(b + 2);
        out->type = b[4];
        out->seq = b[5];
        out->len = len;
        out->payload = b + KILN_HEADER_BYTES;
        if (len > KILN_MAX_PAYLOAD) {
            drop(p, 1);
            p->resyncs++;
            return KILN_RX_TOO_LONG;
        }
        uint16_t total = (uint16_t)(KILN_HEADER_BYTES + len + KILN_TRAILER_BYTES);
        if (p->n < total)
            return KILN_RX_NONE;
        uint32_t crc = kiln_crc32(0, b + 2, (size_t)(KILN_HEADER_BYTES - 2 + len));
        if (crc != kiln_get_u32(b + KILN_HEADER_BYTES + len)) {
            drop(p, 1);
            p->resyncs++;
            return KILN_RX_BAD_CRC;
        }
        out->crc = crc;
        p->consumed = total;
        return KILN_RX_FRAME;
    }
}

size_t kiln_frame_encode(uint8_t *out, uint8_t type, uint8_t seq, const uint8_t *payload,
                         uint16_t len)
{
    if (len > KILN_MAX_PAYLOAD)
        return 0;
    if (payload && payload != out + KILN_HEADER_BYTES) {
        for (uint16_t i = 0; i < len; i++)
            out[KILN_HEADER_BYTES + i] = payload[i];
    }
    out[0] = KILN_SYNC0;
    out[1] = KILN_SYNC1;
    kiln_put_u16(out + 2, len);
    out[4] = type;
    out[5] = seq;
    out[6] = kiln_crc8(out + 2, 4);
    kiln_put_u32(out + KILN_HEADER_BYTES + len,
                 kiln_crc32(0, out + 2, (size_t)(KILN_HEADER_BYTES - 2 + len)));
    return (size_t)(KILN_HEADER_BYTES + len + KILN_TRAILER_BYTES);
}

uint16_t kiln_parser_pending(const kiln_parser_t *p)
{
    return (uint16_t)(p->n - p->consumed);
}

kiln_rx_event_t kiln_parser_expire(kiln_parser_t *p, kiln_frame_t *out)
{
    if (p->consumed) {
        drop(p, p->consumed);
        p->consumed = 0;
    }
    kiln_rx_event_t ev = KILN_RX_NONE;
    const uint8_t *b = p->buf;
    if (p->n >= KILN_HEADER_BYTES && b[0] == KILN_SYNC0 && b[1] == KILN_SYNC1 &&
        kiln_crc8(b + 2, 4) == b[6]) {
        out->type = b[4];
        out->seq = b[5];
        out->len = kiln_get_u16(b + 2);
        out->payload = b + KILN_HEADER_BYTES;
        ev = KILN_RX_GAP;
    }
    p->resyncs += p->n;
    p->n = 0;
    return ev;
}
