/* Kiln QEMU TCG plugin: exact executed-instruction counts between marker functions.
 *
 *   qemu-system-arm ... -plugin libicount.so,begin=0xADDR,end=0xADDR[,mark=0xADDR][,out=FILE] -d plugin
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
 * Counting: every translation block adds its instruction count inline when it starts; the
 * marker functions start a block (they are only entered by calls), so the count "before the
 * marker" is the running total minus the marker block's own size.
 *
 * Instruction mix: every block is also classified at translation time from its instruction
 * bytes (thumb_classes.c: ALU, multiply/MAC, divide, loads and stores single/dual/multiple,
 * branches, IT, FPU, Helium...), and one callback per executed block adds its class totals;
 * a block ending in a conditional branch (B<c>, CBZ/CBNZ) is resolved as taken or not taken
 * when the next block starts (not taken: it starts at the fall-through address). Per window:
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
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
                                              void *ptr, uint64_t imm);
void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn *insn, enum qemu_plugin_op op,
                                                void *ptr, uint64_t imm);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags, void *userdata);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn,
                                            qemu_plugin_vcpu_udata_cb_t cb,
                                            enum qemu_plugin_cb_flags flags, void *userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *insn);
void qemu_plugin_outs(const char *string);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
/* ---- end of API declarations ---- */

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#include "thumb_classes.c"

#define MAX_MARKS 4096
#define MAX_SKIP 16
enum { M_BEGIN = 1, M_END = 2, M_MARK = 3 };
#define N_MIX (KC_N_CLASSES + KE_N_EVENTS)

/* Counters bumped inline by every executed (not skipped) instruction: its class, and for the
 * *_MULTI classes the registers it moves. A conditional branch that ends a block counts as not
 * taken, and also in cond_end; on_tb_exec moves it to "taken" once the next block shows where it
 * went. The instruction count is the sum of the class counters. */
static uint64_t mix[N_MIX];
static uint64_t cond_end;
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
    int first_cls;              /* its first instruction's class as translated (-1: none to fix) */
    int first_size;
    uint8_t first[4];           /* ...and its bytes, to classify it again after a load */
    unsigned n;                 /* instructions, all counted (0: a block with skipped ones) */
    struct {
        uint16_t end;           /* offset of the instruction's end from pc */
        int8_t load_rt;         /* destination of a load single, or -1 */
    } insn[];
};

static bool branch_pending;     /* a block ending in a conditional branch started... */
static uint64_t branch_fallthrough, branch_cond_end;   /* ...cond_end was this then */
static const struct tb_info *prev;                     /* the last counted block started... */
static uint64_t prev_total;                            /* ...when this many had run */
static bool fix_pending;        /* a block's first instruction was reclassified in advance */
static int fix_from, fix_to;

/* A block that starts inside the previous one, just after the last instruction that ran there
 * (an interrupt cut it short and QEMU resumes in a new block), continues its instruction stream:
 * its first load or store pipelines after a load single there as it would without the cut. The
 * counter moves now, before the instruction runs; undone if it does not (nothing counted by the
 * next block). */
static void continue_stream(const struct tb_info *t, uint64_t now)
{
    if (fix_pending && now == prev_total) {
        mix[fix_to]--;
        mix[fix_from]++;
    }
    fix_pending = false;
    if (!prev || !prev->n || t->first_cls < 0 || t->pc <= prev->pc || t->pc > prev->fallthrough)
        return;
    uint64_t ran = now - prev_total, off = t->pc - prev->pc;
    if (ran == 0 || ran > prev->n || prev->insn[ran - 1].end != off || prev->insn[ran - 1].load_rt < 0)
        return;                 /* not where the previous block stopped, or not after a load */
    struct kiln_insn d;
    kiln_classify(t->first, t->first_size, prev->insn[ran - 1].load_rt, &d);
    if (d.cls != t->first_cls) {
        mix[t->first_cls]--;
        mix[d.cls]++;
        fix_pending = true;
        fix_from = t->first_cls;
        fix_to = d.cls;
    }
}

static void on_tb_exec(unsigned int vcpu, void *udata)
{
    (void)vcpu;
    const struct tb_info *t = udata;
    uint64_t now = total_insns();
    continue_stream(t, now);
    if (branch_pending && cond_end != branch_cond_end && t->pc != branch_fallthrough) {
        mix[KC_BRANCH_NOT_TAKEN]--;     /* it ran (the block was not cut short) and jumped */
        mix[KC_BRANCH_TAKEN]++;
    }
    branch_pending = t->cond_branch;
    branch_fallthrough = t->fallthrough;
    branch_cond_end = cond_end;
    prev = t;
    prev_total = now;
    if (t->marker)
        on_marker(t->marker);
}

static void count_insn(struct qemu_plugin_insn *insn, unsigned cls, unsigned event, uint32_t regs)
{
    qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64, &mix[cls], 1);
    if (regs)
        qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64,
                                                   &mix[KC_N_CLASSES + event], regs);
}

/* Instrument a block: each instruction outside the skipped ranges bumps its class counter when
 * it executes, so a block cut short by an interrupt counts only what ran. */
static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    struct tb_info *t = calloc(1, sizeof *t + n * sizeof t->insn[0]);
    if (!t)
        return;         /* blocks are translated again after a flush: a few bytes each, kept */
    bool counted = false, all = true;
    int prev_load_rt = -1;
    t->first_cls = -1;
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
        }
        t->fallthrough = pc + size;
        t->insn[i].end = (uint16_t)(t->fallthrough - t->pc);
        t->insn[i].load_rt = (int8_t)d.load_rt;
        if (skipped(pc)) {
            all = false;
            continue;
        }
        counted = true;
        unsigned event = d.cls == KC_STORE_MULTI ? KE_REGS_STORE_MULTI
                         : d.cls == KC_FP_MULTI  ? KE_REGS_FP_MULTI
                                                 : KE_REGS_LOAD_MULTI;
        bool multi = d.cls == KC_LOAD_MULTI || d.cls == KC_POP_PC || d.cls == KC_STORE_MULTI ||
                     d.cls == KC_FP_MULTI;
        uint32_t regs = multi ? (uint32_t)d.regs : 0;
        if (d.cond_branch) {            /* not taken until the next block says otherwise */
            count_insn(insn, KC_BRANCH_NOT_TAKEN, event, regs);
            if (i + 1 == n) {
                t->cond_branch = 1;
                qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64,
                                                           &cond_end, 1);
            }
        } else {
            count_insn(insn, (unsigned)d.cls, event, regs);
            if (i == 0 && size <= sizeof t->first) {
                t->first_cls = d.cls;
                t->first_size = (int)size;
                memcpy(t->first, qemu_plugin_insn_data(insn), size);
            }
        }
    }
    t->n = all ? (unsigned)n : 0;
    if (!all)
        t->first_cls = -1;
    if (!counted && !t->marker) {
        free(t);        /* skipped code (an exception handler): invisible to the windows */
        return;
    }
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
