/* Single-producer (RX interrupt) / single-consumer (main loop) byte ring. */
#ifndef KILN_RING_H
#define KILN_RING_H
#include <stdint.h>

#define KILN_RING_SIZE 1024u   /* power of two, > one maximum frame */

typedef struct {
    volatile uint8_t buf[KILN_RING_SIZE];
    volatile uint32_t head;    /* written by the ISR */
    volatile uint32_t tail;    /* written by the main loop */
    volatile uint32_t dropped; /* bytes lost because the ring was full */
} kiln_ring_t;

static inline void kiln_ring_put(kiln_ring_t *r, uint8_t c)
{
    uint32_t h = r->head;
    if (h - r->tail >= KILN_RING_SIZE) {
        r->dropped++;
        return;
    }
    r->buf[h & (KILN_RING_SIZE - 1u)] = c;
    r->head = h + 1u;
}

static inline int kiln_ring_get(kiln_ring_t *r)
{
    uint32_t t = r->tail;
    if (t == r->head)
        return -1;
    uint8_t c = r->buf[t & (KILN_RING_SIZE - 1u)];
    r->tail = t + 1u;
    return c;
}

static inline int kiln_ring_empty(const kiln_ring_t *r) { return r->tail == r->head; }

/* Sleep until an interrupt, without losing one that arrives between the check and the WFI. */
static inline void kiln_ring_wait(const kiln_ring_t *r)
{
    __asm volatile("cpsid i" ::: "memory");
    if (kiln_ring_empty(r))
        __asm volatile("wfi" ::: "memory");
    __asm volatile("cpsie i" ::: "memory");
}
#endif
