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
enum { M_BEGIN = 1, M_END = 2, M_MARK = 3 };

static uint64_t insns;                 /* running total, bumped inline per block */
static uint64_t addr[4];               /* marker addresses by kind (0: unset) */
static uint64_t begin_at, marks[MAX_MARKS];
static unsigned n_marks, window;
static bool in_window;
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

static void on_marker(unsigned int vcpu, void *udata)
{
    (void)vcpu;
    uintptr_t u = (uintptr_t)udata;
    unsigned kind = (unsigned)(u & 0xF);
    uint64_t now = insns - (u >> 4);   /* instructions before this block */
    if (kind == M_BEGIN) {
        begin_at = now;
        n_marks = 0;
        in_window = true;
    } else if (kind == M_MARK && in_window) {
        if (n_marks < MAX_MARKS)
            marks[n_marks++] = now - begin_at;
    } else if (kind == M_END && in_window) {
        in_window = false;
        size_t cap = 96 + (size_t)n_marks * 21;
        char *line = malloc(cap);
        if (!line)
            return;
        int n = snprintf(line, cap, "kiln-icount: window=%u insns=%" PRIu64 " marks=", window++,
                         now - begin_at);
        for (unsigned i = 0; i < n_marks && n > 0 && (size_t)n < cap; i++)
            n += snprintf(line + n, cap - (size_t)n, i ? ",%" PRIu64 : "%" PRIu64, marks[i]);
        if (n > 0 && (size_t)n < cap - 1)
            snprintf(line + n, cap - (size_t)n, "\n");
        emit(line);
        free(line);
    }
}

/* ---- instruction mix ---- */
#define N_MIX (KC_N_CLASSES + KE_N_EVENTS)
struct tb_mix {                 /* one translated block: its class totals, kept for its lifetime */
    uint64_t pc, fallthrough;
    unsigned marker;            /* M_BEGIN / M_END / M_MARK, or 0 */
    int cond_branch;            /* its last instruction is B<c> / CBZ / CBNZ */
    unsigned n_nonzero;
    uint8_t idx[N_MIX];
    uint32_t count[N_MIX];
};

static uint64_t mix[N_MIX], mix_begin[N_MIX], (*mix_marks)[N_MIX];
static unsigned mix_n_marks, mix_window;
static bool mix_in_window;
static bool branch_pending;     /* the last block executed ended in a conditional branch */
static uint64_t branch_fallthrough;

static void emit_mix(const char *what, const uint64_t *v)
{
    char line[64 + N_MIX * 21];
    int n = snprintf(line, sizeof line, "kiln-mix: window=%u %s ", mix_window, what);
    for (unsigned c = 0; c < N_MIX && n > 0 && (size_t)n < sizeof line; c++)
        n += snprintf(line + n, sizeof line - (size_t)n, c ? ",%" PRIu64 : "%" PRIu64, v[c]);
    if (n > 0 && (size_t)n < sizeof line - 1) {
        snprintf(line + n, sizeof line - (size_t)n, "\n");
        emit(line);
    }
}

static void mix_marker(unsigned kind)
{
    uint64_t d[N_MIX];
    if (kind == M_BEGIN) {
        memcpy(mix_begin, mix, sizeof mix);
        mix_n_marks = 0;
        mix_in_window = true;
        return;
    }
    if (!mix_in_window)
        return;
    for (unsigned c = 0; c < N_MIX; c++)
        d[c] = mix[c] - mix_begin[c];
    if (kind == M_MARK) {
        if (mix_marks && mix_n_marks < MAX_MARKS)
            memcpy(mix_marks[mix_n_marks++], d, sizeof d);
        return;
    }
    mix_in_window = false;          /* M_END: the window's marks, then its total */
    char what[32];
    for (unsigned i = 0; i < mix_n_marks; i++) {
        snprintf(what, sizeof what, "mark=%u", i);
        emit_mix(what, mix_marks[i]);
    }
    emit_mix("end", d);
    mix_window++;
}

static void on_tb_exec(unsigned int vcpu, void *udata)
{
    (void)vcpu;
    const struct tb_mix *t = udata;
    if (branch_pending) {           /* the previous block's conditional branch: where did it go? */
        mix[t->pc == branch_fallthrough ? KC_BRANCH_NOT_TAKEN : KC_BRANCH_TAKEN]++;
        branch_pending = false;
    }
    if (t->marker)                  /* counts before this block's first instruction */
        mix_marker(t->marker);
    for (unsigned i = 0; i < t->n_nonzero; i++)
        mix[t->idx[i]] += t->count[i];
    if (t->cond_branch) {
        branch_pending = true;
        branch_fallthrough = t->fallthrough;
    }
}

/* classify a block's instructions; a conditional branch that ends it is left to on_tb_exec */
static struct tb_mix *classify_tb(struct qemu_plugin_tb *tb, size_t n)
{
    uint32_t per[N_MIX] = {0};
    struct tb_mix *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    int prev_load_rt = -1;
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        struct kiln_insn d;
        kiln_classify(qemu_plugin_insn_data(insn), (int)qemu_plugin_insn_size(insn), prev_load_rt, &d);
        uint64_t pc = qemu_plugin_insn_vaddr(insn);
        if (i == 0)
            t->pc = pc;
        t->fallthrough = pc + qemu_plugin_insn_size(insn);
        if (d.cond_branch && i + 1 == n)
            t->cond_branch = 1;     /* resolved when the next block starts */
        else
            per[d.cond_branch ? KC_BRANCH_NOT_TAKEN : d.cls]++;
        if (d.cls == KC_LOAD_MULTI || d.cls == KC_POP_PC)
            per[KC_N_CLASSES + KE_REGS_LOAD_MULTI] += (uint32_t)d.regs;
        else if (d.cls == KC_STORE_MULTI)
            per[KC_N_CLASSES + KE_REGS_STORE_MULTI] += (uint32_t)d.regs;
        else if (d.cls == KC_FP_MULTI)
            per[KC_N_CLASSES + KE_REGS_FP_MULTI] += (uint32_t)d.regs;
        prev_load_rt = d.load_rt;
    }
    for (unsigned c = 0; c < N_MIX; c++)
        if (per[c]) {
            t->idx[t->n_nonzero] = (uint8_t)c;
            t->count[t->n_nonzero++] = per[c];
        }
    return t;
}

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insns, n);
    struct qemu_plugin_insn *first = qemu_plugin_tb_get_insn(tb, 0);
    uint64_t pc = qemu_plugin_insn_vaddr(first);
    struct tb_mix *t = classify_tb(tb, n);
    for (unsigned kind = M_BEGIN; kind <= M_MARK; kind++) {
        if (addr[kind] && pc == addr[kind]) {
            qemu_plugin_register_vcpu_insn_exec_cb(first, on_marker, QEMU_PLUGIN_CB_NO_REGS,
                                                   (void *)(uintptr_t)((n << 4) | kind));
            if (t)
                t->marker = kind;
        }
    }
    if (t)      /* blocks are translated again after a flush: a few KB each time, kept */
        qemu_plugin_register_vcpu_tb_exec_cb(tb, on_tb_exec, QEMU_PLUGIN_CB_NO_REGS, t);
}

static void on_plugin_exit(qemu_plugin_id_t id, void *udata)
{
    (void)id;
    (void)udata;
    char line[96];
    snprintf(line, sizeof line, "kiln-icount: total insns=%" PRIu64 "\n", insns);
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
        else if (!strncmp(a, "out=", 4)) {
            out = fopen(a + 4, "w");
            if (!out) {
                fprintf(stderr, "kiln icount plugin: cannot open %s\n", a + 4);
                return -1;
            }
        } else {
            fprintf(stderr, "kiln icount plugin: unknown argument '%s' "
                            "(expected begin=, end=, mark=, out=)\n", a);
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
