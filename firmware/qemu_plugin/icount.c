/* Kiln QEMU TCG plugin: exact executed-instruction counts between marker functions.
 *
 *   qemu-system-arm ... -plugin libicount.so,begin=0xADDR,end=0xADDR[,mark=0xADDR]
 *                                [,skip=0xSTART-0xEND ...][,out=FILE] -d plugin
 *
 * begin/end/mark are the addresses of kiln_marker_begin/_end/_mark (firmware/runtime/timer.c).
 * For each begin..end window the plugin prints one line
 *   kiln-icount: window=<k> insns=<n> marks=<m0>,<m1>,...
 * where n counts the instructions from the first instruction of kiln_marker_begin up to (not
 * including) the first instruction of kiln_marker_end, and m_i the same count up to the i-th
 * call of kiln_marker_mark (the firmware calls it from kiln_profile_mark(i), in order, so the
 * i-th hit is command i; QEMU 7.2's plugin API cannot read r0). At exit it prints the total.
 * Output goes through qemu_plugin_outs (visible with -d plugin [-D log]) or, with out=FILE, to
 * FILE, flushed after each line so a host can read it while QEMU runs.
 *
 * What counts: every executed instruction outside the skip= ranges (up to 64; the host passes
 * the exception handlers and kiln_timer_now: code whose instructions depend on when interrupts
 * arrive, docs/firmware.md). Blocks wholly inside them are not instrumented at all.
 *
 * Counting: every block is classified at translation time from its instruction bytes
 * (thumb_classes.c: ALU, multiply/MAC, divide, loads and stores single/dual/multiple, branches,
 * IT, FPU, Helium...) and one callback per executed block adds its class totals when it starts
 * (the instruction count is the sum of the class counts). An interrupt can cut a block short:
 * QEMU stops inside it and, after the handler, resumes in a new block at the next instruction.
 * The block's last instruction bumps tb_done inline, so when the next counted block starts the
 * plugin knows whether the previous one ran to its end; if not, it takes back the instructions
 * from where the new block starts (they had not run, and run again there). A block ending in a
 * conditional branch (B<c>, CBZ/CBNZ) that ran to its end is resolved as taken or not taken when
 * the next counted block starts (not taken: it starts at the fall-through address). Per window:
 *   kiln-mix: names=<class>,...,<event>,...                 (once, at start)
 *   kiln-mix: window=<k> mark=<i> <count>,<count>,...      (cumulative at the i-th mark)
 *   kiln-mix: window=<k> end <count>,<count>,...           (the whole window)
 * in the order of names=; the class counts of a window sum to its insns= (the events count
 * registers moved by LDM/STM-like instructions).
 *
 * QEMU 7.2 (plugin API version 1) and Debian ship no qemu-plugin.h, so the few API entry
 * points used here are declared below with their 7.2 signatures. */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the subset of QEMU 7.2's qemu-plugin.h that this plugin uses ---- */
#define QEMU_PLUGIN_EXPORT __attribute__((visibility("default")))
#define QEMU_PLUGIN_VERSION 1
typedef uint64_t qemu_plugin_id_t;
typedef struct {
    const char *target_name;
    struct {
        int min;
        int cur;
    } version;
    bool system_emulation;
    union {
        struct {
            int smp_vcpus;
            int max_vcpus;
        } system;
    };
} qemu_info_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_CB_R_REGS, QEMU_PLUGIN_CB_RW_REGS };
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn *insn, enum qemu_plugin_op op,
                                                void *ptr, uint64_t imm);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags, void *userdata);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *insn);
void qemu_plugin_outs(const char *string);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
/* ---- end of API declarations ---- */

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#include "thumb_classes.c"

#define MAX_MARKS 4096
#define MAX_SKIP 64
enum { M_BEGIN = 1, M_END = 2, M_MARK = 3 };
#define N_MIX (KC_N_CLASSES + KE_N_EVENTS)

/* Per-class instruction counts (and for the *_MULTI classes the registers they move); the
 * instruction count is the sum of the class counters. See on_tb_exec. */
static uint64_t mix[N_MIX];
static uint64_t tb_done;        /* bumped inline by the last instruction of every counted block */
static uint64_t addr[4];                       /* marker addresses by kind (0: unset) */
static uint64_t skip_lo[MAX_SKIP], skip_hi[MAX_SKIP];
static unsigned n_skip;
static FILE *out;

static void emit(const char *line)
{
    if (out) {
        fputs(line, out);
        fflush(out);
    } else {
        qemu_plugin_outs(line);
    }
}

static uint64_t total_insns(void)
{
    uint64_t n = 0;
    for (unsigned c = 0; c < KC_N_CLASSES; c++)
        n += mix[c];
    return n;
}

static bool skipped(uint64_t pc)
{
    for (unsigned i = 0; i < n_skip; i++)
        if (pc >= skip_lo[i] && pc < skip_hi[i])
            return true;
    return false;
}

/* ---- windows: kiln-icount lines (instructions) and kiln-mix lines (the mix) ---- */
static uint64_t begin_at, marks[MAX_MARKS], mix_begin[N_MIX], (*mix_marks)[N_MIX];
static unsigned n_marks, window;
static bool in_window;
static unsigned last_kind;      /* the last marker seen, and the count then: a block started */
static uint64_t last_at = UINT64_MAX;   /* again without running anything is not a new marker */

static void emit_mix(const char *what, const uint64_t *v)
{
    char line[64 + N_MIX * 21];
    int n = snprintf(line, sizeof line, "kiln-mix: window=%u %s ", window, what);
    for (unsigned c = 0; c < N_MIX && n > 0 && (size_t)n < sizeof line; c++)
        n += snprintf(line + n, sizeof line - (size_t)n, c ? ",%" PRIu64 : "%" PRIu64, v[c]);
    if (n > 0 && (size_t)n < sizeof line - 1) {
        snprintf(line + n, sizeof line - (size_t)n, "\n");
        emit(line);
    }
}

static void end_window(uint64_t now)
{
    uint64_t d[N_MIX];
    size_t cap = 96 + (size_t)n_marks * 21;
    char *line = malloc(cap);
    if (line) {
        int n = snprintf(line, cap, "kiln-icount: window=%u insns=%" PRIu64 " marks=", window,
                         now - begin_at);
        for (unsigned i = 0; i < n_marks && n > 0 && (size_t)n < cap; i++)
            n += snprintf(line + n, cap - (size_t)n, i ? ",%" PRIu64 : "%" PRIu64, marks[i]);
        if (n > 0 && (size_t)n < cap - 1)
            snprintf(line + n, cap - (size_t)n, "\n");
        emit(line);
        free(line);
    }
    char what[32];
    for (unsigned i = 0; i < n_marks; i++) {
        snprintf(what, sizeof what, "mark=%u", i);
        emit_mix(what, mix_marks[i]);
    }
    for (unsigned c = 0; c < N_MIX; c++)
        d[c] = mix[c] - mix_begin[c];
    emit_mix("end", d);
    window++;
}

static void on_marker(unsigned kind)
{
    uint64_t now = total_insns();      /* instructions before the marker's first one */
    if (kind == last_kind && now == last_at)
        return;                        /* the same marker block started again (cut short) */
    last_kind = kind;
    last_at = now;
    if (kind == M_BEGIN) {
        begin_at = now;
        memcpy(mix_begin, mix, sizeof mix);
        n_marks = 0;
        in_window = true;
    } else if (kind == M_MARK && in_window) {
        if (n_marks < MAX_MARKS && mix_marks) {
            marks[n_marks] = now - begin_at;
            for (unsigned c = 0; c < N_MIX; c++)
                mix_marks[n_marks][c] = mix[c] - mix_begin[c];
            n_marks++;
        }
    } else if (kind == M_END && in_window) {
        in_window = false;
        end_window(now);
    }
}

/* ---- per-block bookkeeping (a callback when each counted block starts) ---- */
struct tb_info {                /* one translated block, kept for its lifetime */
    uint64_t pc, fallthrough;
    unsigned marker;            /* M_BEGIN / M_END / M_MARK, or 0 */
    int cond_branch;            /* its last instruction is B<c> / CBZ / CBNZ */
    unsigned n;                 /* instructions, all counted (0: a block with skipped ones) */
    unsigned n_nonzero;         /* class and event totals of the whole block */
    uint8_t idx[N_MIX];
    uint32_t count[N_MIX];
    int first_size;
    uint8_t first[4];           /* the first instruction's bytes, to classify it after a load */
    struct {
        uint16_t end;           /* offset of the instruction's end from pc */
        int8_t load_rt;         /* destination of a load single, or -1 */
        uint8_t cls;            /* its class (a conditional branch: not taken) */
        uint8_t regs;           /* registers / words moved by a *_MULTI class */
    } insn[];
};

static const struct tb_info *prev;  /* the last counted block that started... */
static uint64_t prev_done;          /* ...tb_done then... */
static unsigned prev_first;         /* ...and the class its first instruction counted in */

static unsigned event_of(unsigned cls)
{
    return KC_N_CLASSES + (cls == KC_STORE_MULTI ? KE_REGS_STORE_MULTI
                           : cls == KC_FP_MULTI  ? KE_REGS_FP_MULTI
                                                 : KE_REGS_LOAD_MULTI);
}

/* Take back the counts of b's instructions from index j on: they had not run when b was cut. */
static void uncount(const struct tb_info *b, unsigned j, unsigned first)
{
    for (unsigned i = j; i < b->n; i++) {
        unsigned cls = i ? b->insn[i].cls : first;
        mix[cls]--;
        if (b->insn[i].regs)
            mix[event_of(cls)] -= b->insn[i].regs;
    }
}

/* Where the previous block stopped: when its last instruction did not run (an interrupt cut it
 * short, and after the handler QEMU resumes at t's pc in a new block), take back what it had
 * not run; a conditional branch that ended it is resolved. Returns the destination register of
 * the load single that ran just before t's first instruction (-1: none): t continues that
 * instruction stream, so its first load or store pipelines as it would without the cut. */
static int settle_prev(const struct tb_info *t)
{
    if (!prev)
        return -1;
    if (tb_done != prev_done) {         /* it ran to its end */
        if (prev->cond_branch && t->pc != prev->fallthrough) {
            mix[KC_BRANCH_NOT_TAKEN]--;
            mix[KC_BRANCH_TAKEN]++;
        }
        return prev->n && t->pc == prev->fallthrough ? prev->insn[prev->n - 1].load_rt : -1;
    }
    if (!prev->n || t->pc < prev->pc || t->pc >= prev->fallthrough)
        return -1;                      /* resumed elsewhere (a fault): nothing to learn */
    uint64_t off = t->pc - prev->pc;
    unsigned j = 0;
    while (j < prev->n && (j ? prev->insn[j - 1].end : 0) != off)
        j++;
    if (j == prev->n)
        return -1;
    uncount(prev, j, prev_first);
    return j ? prev->insn[j - 1].load_rt : -1;
}

/* Every counted block, when it starts: settle the previous one, count this one whole (class
 * totals added now), then the markers. */
static void on_tb_exec(unsigned int vcpu, void *udata)
{
    (void)vcpu;
    const struct tb_info *t = udata;
    int rt = settle_prev(t);
    if (t->marker)
        on_marker(t->marker);
    for (unsigned i = 0; i < t->n_nonzero; i++)
        mix[t->idx[i]] += t->count[i];
    unsigned first = t->n ? t->insn[0].cls : 0;
    if (rt >= 0 && t->n && first != KC_BRANCH_NOT_TAKEN) {
        struct kiln_insn d;
        kiln_classify(t->first, t->first_size, rt, &d);
        if ((unsigned)d.cls != first && !d.cond_branch) {
            mix[first]--;
            mix[d.cls]++;
            first = (unsigned)d.cls;
        }
    }
    prev = t;
    prev_done = tb_done;
    prev_first = first;
}

/* Classify a block's instructions (a conditional branch counts as not taken until the next
 * block shows where it went); the last one bumps tb_done when it runs. */
static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    struct tb_info *t = calloc(1, sizeof *t + n * sizeof t->insn[0]);
    if (!t)
        return;         /* blocks are translated again after a flush: a few bytes each, kept */
    uint32_t per[N_MIX] = {0};
    bool counted = false, all = true;
    int prev_load_rt = -1;
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint64_t pc = qemu_plugin_insn_vaddr(insn);
        size_t size = qemu_plugin_insn_size(insn);
        struct kiln_insn d;
        kiln_classify(qemu_plugin_insn_data(insn), (int)size, prev_load_rt, &d);
        prev_load_rt = d.load_rt;
        if (i == 0) {
            t->pc = pc;
            for (unsigned kind = M_BEGIN; kind <= M_MARK; kind++)
                if (addr[kind] && pc == addr[kind])
                    t->marker = kind;
            t->first_size = size <= sizeof t->first ? (int)size : 0;
            memcpy(t->first, qemu_plugin_insn_data(insn), (size_t)t->first_size);
        }
        t->fallthrough = pc + size;
        unsigned cls = d.cond_branch ? KC_BRANCH_NOT_TAKEN : (unsigned)d.cls;
        bool multi = cls == KC_LOAD_MULTI || cls == KC_POP_PC || cls == KC_STORE_MULTI ||
                     cls == KC_FP_MULTI;
        t->insn[i].end = (uint16_t)(t->fallthrough - t->pc);
        t->insn[i].load_rt = (int8_t)d.load_rt;
        t->insn[i].cls = (uint8_t)cls;
        t->insn[i].regs = multi ? (uint8_t)d.regs : 0;
        if (skipped(pc)) {
            all = false;
            continue;
        }
        counted = true;
        per[cls]++;
        if (multi)
            per[event_of(cls)] += (uint32_t)d.regs;
        if (d.cond_branch && i + 1 == n)
            t->cond_branch = 1;
    }
    if (!counted && !t->marker) {
        free(t);        /* skipped code (an exception handler): invisible to the windows */
        return;
    }
    t->n = all && t->first_size ? (unsigned)n : 0;
    for (unsigned c = 0; c < N_MIX; c++)
        if (per[c]) {
            t->idx[t->n_nonzero] = (uint8_t)c;
            t->count[t->n_nonzero++] = per[c];
        }
    qemu_plugin_register_vcpu_insn_exec_inline(qemu_plugin_tb_get_insn(tb, n - 1),
                                               QEMU_PLUGIN_INLINE_ADD_U64, &tb_done, 1);
    qemu_plugin_register_vcpu_tb_exec_cb(tb, on_tb_exec, QEMU_PLUGIN_CB_NO_REGS, t);
}

static void on_plugin_exit(qemu_plugin_id_t id, void *udata)
{
    (void)id;
    (void)udata;
    char line[96];
    snprintf(line, sizeof line, "kiln-icount: total insns=%" PRIu64 "\n", total_insns());
    emit(line);
    if (out)
        fclose(out);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv)
{
    (void)info;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "begin=", 6))
            addr[M_BEGIN] = strtoull(a + 6, NULL, 0) & ~1ull;
        else if (!strncmp(a, "end=", 4))
            addr[M_END] = strtoull(a + 4, NULL, 0) & ~1ull;
        else if (!strncmp(a, "mark=", 5))
            addr[M_MARK] = strtoull(a + 5, NULL, 0) & ~1ull;
        else if (!strncmp(a, "skip=", 5)) {
            char *dash;
            uint64_t lo = strtoull(a + 5, &dash, 0), hi = *dash == '-' ? strtoull(dash + 1, NULL, 0) : 0;
            if (n_skip == MAX_SKIP || hi <= lo) {
                fprintf(stderr, "kiln icount plugin: bad or too many skip ranges at '%s' "
                                "(expected at most %d of skip=0xSTART-0xEND)\n", a, MAX_SKIP);
                return -1;
            }
            skip_lo[n_skip] = lo & ~1ull;
            skip_hi[n_skip++] = hi & ~1ull;
        } else if (!strncmp(a, "out=", 4)) {
            out = fopen(a + 4, "w");
            if (!out) {
                fprintf(stderr, "kiln icount plugin: cannot open %s\n", a + 4);
                return -1;
            }
        } else {
            fprintf(stderr, "kiln icount plugin: unknown argument '%s' "
                            "(expected begin=, end=, mark=, skip=, out=)\n", a);
            return -1;
        }
    }
    mix_marks = calloc(MAX_MARKS, sizeof *mix_marks);
    char names[N_MIX * 32] = "kiln-mix: names=";
    for (unsigned c = 0; c < N_MIX; c++) {
        if (c)
            strcat(names, ",");
        strcat(names, c < KC_N_CLASSES ? kiln_class_names[c] : kiln_event_names[c - KC_N_CLASSES]);
    }
    strcat(names, "\n");
    emit(names);
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_atexit_cb(id, on_plugin_exit, NULL);
    return 0;
}
