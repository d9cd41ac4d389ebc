/* Thumb / Thumb-2 instruction classifier (see thumb_classes.h). Encodings: Arm v7-M and v8-M
 * Architecture Reference Manuals, "Thumb instruction set encoding" (A5 / C2). Compiled into the
 * QEMU plugin (icount.c includes this file) and, alone, into the library the tests load. */
#include "thumb_classes.h"

#define KILN_NAME(id, name) name,
const char *const kiln_class_names[KC_N_CLASSES] = {KILN_CLASSES(KILN_NAME)};
const char *const kiln_event_names[KE_N_EVENTS] = {KILN_EVENTS(KILN_NAME)};
#undef KILN_NAME

static int popcount16(unsigned v)
{
    int n = 0;
    for (v &= 0xFFFF; v; v &= v - 1)
        n++;
    return n;
}

/* a load or store single: its class depends on whether it pipelines after the previous load */
static void mem_single(struct kiln_insn *d, int is_load, int rt, unsigned addr_regs, int prev_load_rt)
{
    int pipe = prev_load_rt >= 0 && !(addr_regs & (1u << prev_load_rt));
    d->addr_regs = addr_regs;
    if (is_load) {
        d->cls = pipe ? KC_LOAD_PIPE : KC_LOAD;
        d->load_rt = rt;
        if (rt == 15)
            d->cls = KC_BRANCH, d->load_rt = -1;
    } else {
        d->cls = pipe ? KC_STORE_PIPE : KC_STORE;
    }
}

static void classify16(unsigned h, int prev, struct kiln_insn *d)
{
    unsigned top6 = h >> 10;
    if ((h >> 14) == 0) {                       /* shift, add, sub, move, compare (immediate) */
        d->cls = KC_ALU;
    } else if (top6 == 0x10) {                  /* data processing (register): MULS is 1101 */
        d->cls = ((h >> 6) & 0xF) == 0xD ? KC_MUL : KC_ALU;
    } else if (top6 == 0x11) {                  /* special data processing, BX/BLX */
        unsigned op = (h >> 8) & 3, rd = ((h >> 4) & 8) | (h & 7);
        d->cls = (op == 3 || (op != 1 && rd == 15)) ? KC_BRANCH : KC_ALU;
    } else if ((h >> 11) == 0x09) {             /* LDR (literal) */
        mem_single(d, 1, (h >> 8) & 7, 1u << 15, prev);
    } else if ((h >> 12) == 0x5) {              /* load/store (register offset) */
        unsigned opb = (h >> 9) & 7;
        mem_single(d, opb >= 3, h & 7, (1u << ((h >> 3) & 7)) | (1u << ((h >> 6) & 7)), prev);
    } else if ((h >> 13) == 0x3 || (h >> 12) == 0x8) {  /* LDR/STR(B) imm, LDRH/STRH imm */
        mem_single(d, (h >> 11) & 1, h & 7, 1u << ((h >> 3) & 7), prev);
    } else if ((h >> 12) == 0x9) {              /* LDR/STR SP-relative */
        mem_single(d, (h >> 11) & 1, (h >> 8) & 7, 1u << 13, prev);
    } else if ((h >> 12) == 0xA) {              /* ADR, ADD SP */
        d->cls = KC_ALU;
    } else if ((h >> 12) == 0xB) {              /* miscellaneous */
        if ((h & 0x0500) == 0x0100) {           /* CBZ / CBNZ */
            d->cls = KC_BRANCH_TAKEN, d->cond_branch = 1;
        } else if ((h & 0x0E00) == 0x0400) {    /* PUSH */
            d->cls = KC_STORE_MULTI, d->regs = popcount16(h & 0xFF) + ((h >> 8) & 1);
        } else if ((h & 0x0E00) == 0x0C00) {    /* POP */
            d->regs = popcount16(h & 0xFF) + ((h >> 8) & 1);
            d->cls = (h & 0x100) ? KC_POP_PC : KC_LOAD_MULTI;
        } else if ((h & 0x0F00) == 0x0F00) {    /* IT, or a hint (NOP, YIELD, WFE, WFI, SEV) */
            d->cls = (h & 0xF) ? KC_IT : KC_SYSTEM;
        } else if ((h & 0x0F00) == 0x0E00 || (h & 0x0FE0) == 0x0660) {  /* BKPT, CPS */
            d->cls = KC_SYSTEM;
        } else {                                /* ADD/SUB SP, extend, REV */
            d->cls = KC_ALU;
        }
    } else if ((h >> 12) == 0xC) {              /* STM / LDM */
        d->regs = popcount16(h & 0xFF);
        d->cls = (h & 0x800) ? KC_LOAD_MULTI : KC_STORE_MULTI;
    } else if ((h >> 12) == 0xD) {              /* B<c>, UDF, SVC */
        unsigned c = (h >> 8) & 0xF;
        if (c >= 0xE)
            d->cls = KC_SYSTEM;
        else
            d->cls = KC_BRANCH_TAKEN, d->cond_branch = 1;
    } else if ((h >> 11) == 0x1C) {             /* B */
        d->cls = KC_BRANCH;
    } else {
        d->cls = KC_OTHER;
    }
}

/* op1 = 01: load/store multiple, dual, exclusive, table branch; data processing (shifted reg) */
static void classify32_01(unsigned h1, unsigned h2, int prev, struct kiln_insn *d)
{
    unsigned rn = h1 & 0xF;
    if ((h1 & 0x0640) == 0x0000) {              /* LDM / STM (also PUSH.W / POP.W) */
        d->regs = popcount16(h2);
        if (h1 & 0x10)
            d->cls = (h2 & 0x8000) ? KC_POP_PC : KC_LOAD_MULTI;
        else
            d->cls = KC_STORE_MULTI;
    } else if ((h1 & 0x0640) == 0x0040) {       /* dual, exclusive, table branch */
        unsigned op1 = (h1 >> 7) & 3, op2 = (h1 >> 4) & 3, op3 = (h2 >> 4) & 0xF;
        if (op1 == 0 && op2 <= 1) {             /* STREX / LDREX */
            mem_single(d, op2, (h2 >> 12) & 0xF, 1u << rn, prev);
        } else if ((op1 <= 1 && op2 >= 2) || op1 >= 2) {    /* STRD / LDRD */
            d->cls = (h1 & 0x10) ? KC_LOAD_DUAL : KC_STORE_DUAL;
            d->addr_regs = 1u << rn;
        } else if (op2 == 1 && op3 <= 1) {      /* TBB / TBH */
            d->cls = KC_TABLE_BRANCH;
        } else {                                /* STREXB/H, LDREXB/H, LDA/STL */
            mem_single(d, op2 & 1, (h2 >> 12) & 0xF, 1u << rn, prev);
        }
    } else if ((h1 & 0x0600) == 0x0200) {       /* data processing (shifted register) */
        d->cls = KC_ALU;
    } else {
        d->cls = KC_OTHER;                      /* coprocessor space: handled by the caller */
    }
}

/* op1 = 10, hw2[15] = 1: branches and miscellaneous control */
static void classify32_branch(unsigned h1, unsigned h2, struct kiln_insn *d)
{
    unsigned op1 = (h2 >> 12) & 5;              /* hw2 bits 14 and 12 */
    if (h2 == 0xE801) {                         /* VCTP (Helium) */
        d->cls = KC_MVE;
        return;
    }
    if ((h2 & 0xD001) == 0xC001) {              /* hw2 = 11x0 ... 1 (BLX on Armv7-A) */
        d->cls = KC_LOOP;                       /* Armv8.1-M low-overhead loops and branch future */
        return;
    }
    if (op1 == 0) {
        if ((h1 & 0x0380) != 0x0380)            /* B<c>.W */
            d->cls = KC_BRANCH_TAKEN, d->cond_branch = 1;
        else                                    /* MSR, MRS, hints, barriers, CLREX */
            d->cls = KC_SYSTEM;
    } else if (op1 == 1 || op1 == 5) {          /* B.W, BL */
        d->cls = KC_BRANCH;
    } else {                                    /* BLX (imm): not on M-profile */
        d->cls = KC_OTHER;
    }
}

/* op1 = 11 outside coprocessor space: load/store single, data processing (register), multiply */
static void classify32_11(unsigned h1, unsigned h2, int prev, struct kiln_insn *d)
{
    unsigned rn = h1 & 0xF, rt = (h2 >> 12) & 0xF;
    unsigned reg_offset = ((h1 & 0x0080) == 0 && (h2 & 0x0FC0) == 0) ? 1u << (h2 & 0xF) : 0;
    if ((h1 & 0x0710) == 0x0000) {              /* STR, STRB, STRH (.W) */
        mem_single(d, 0, rt, (1u << rn) | reg_offset, prev);
    } else if ((h1 & 0x0610) == 0x0010) {       /* LDR, LDRB, LDRH, LDRSB, LDRSH, PLD, PLI */
        unsigned size = (h1 >> 5) & 3;
        if (rt == 15 && size != 2)
            d->cls = KC_SYSTEM;                 /* PLD / PLI: hints */
        else
            mem_single(d, 1, rt, (1u << rn) | reg_offset, prev);
    } else if ((h1 & 0x0780) == 0x0300) {       /* multiply, multiply accumulate, |difference| */
        unsigned ra = (h2 >> 12) & 0xF;
        d->cls = ra == 15 ? KC_MUL : KC_MAC;
    } else if ((h1 & 0x0780) == 0x0380) {       /* long multiply, long MAC, divide */
        unsigned op1 = (h1 >> 4) & 7, op2 = (h2 >> 4) & 0xF;
        if (op2 == 0xF && (op1 == 1 || op1 == 3))
            d->cls = KC_DIV;
        else
            d->cls = (op1 == 0 || op1 == 2) ? KC_MUL_LONG : KC_MAC_LONG;
    } else if ((h1 & 0x0700) == 0x0200) {       /* data processing (register), parallel add/sub */
        d->cls = KC_ALU;
    } else {
        d->cls = KC_OTHER;
    }
}

/* coprocessor space (hw1 = 111x 11xx): VFP with coprocessors 9-11, else Helium (MVE) */
static void classify32_cp(unsigned h1, unsigned h2, struct kiln_insn *d)
{
    unsigned cp = (h2 >> 8) & 0xF;
    int vfp = (cp == 10 || cp == 11 || cp == 9) && !(h1 & 0x1000);
    if ((h1 & 0x0300) == 0x0300) {              /* hw1 = 0xEF.. / 0xFF..: MVE data processing */
        d->cls = KC_MVE;
    } else if ((h1 & 0x0E00) == 0x0C00) {       /* hw1 = 0xEC.. - 0xED.., 0xFC.. - 0xFD.. */
        int load = (h1 >> 4) & 1;
        if (!vfp)                               /* MVE VLDR* / VSTR* / VLD2x / VST4x ... */
            d->cls = load ? KC_MVE_LOAD : KC_MVE_STORE;
        else if ((h1 & 0x01E0) == 0x0040)       /* 64-bit transfers (VMOV two core registers) */
            d->cls = KC_FP;
        else if ((h1 & 0x0120) == 0x0100)       /* P=1, W=0: VLDR / VSTR */
            d->cls = load ? KC_FP_LOAD : KC_FP_STORE;
        else                                    /* VLDM / VSTM / VPUSH / VPOP */
            d->cls = KC_FP_MULTI, d->regs = h2 & 0xFF;
    } else if (vfp && !(h2 & 0x10)) {           /* VFP data processing */
        unsigned opc1 = (h1 >> 4) & 0xB, opc2 = h1 & 0xF, opc3 = (h2 >> 7) & 1;
        if (opc1 == 0x8 || (opc1 == 0xB && opc2 == 1 && opc3))
            d->cls = KC_FP_DIV;                 /* VDIV, VSQRT */
        else if (opc1 == 0 || opc1 == 1 || opc1 == 9 || opc1 == 0xA)
            d->cls = KC_FP_MAC;                 /* VMLA/VMLS, VNMLA/VNMLS, VFNMA/VFNMS, VFMA/VFMS */
        else
            d->cls = KC_FP;
    } else if (cp == 11 && (h1 & 0x0090) == 0x0080) {   /* VDUP (Helium) */
        d->cls = KC_MVE;
    } else {                                    /* VMOV / VMRS / VMSR (VFP); MVE otherwise */
        d->cls = vfp ? KC_FP : KC_MVE;
    }
}

int kiln_classify(const uint8_t *b, int len, int prev_load_rt, struct kiln_insn *d)
{
    d->cls = KC_OTHER, d->cond_branch = 0, d->regs = 0, d->load_rt = -1, d->addr_regs = 0;
    d->size = 0;
    if (len < 2)
        return -1;
    unsigned h1 = (unsigned)b[0] | ((unsigned)b[1] << 8);
    if ((h1 >> 11) < 0x1D) {
        d->size = 2;
        classify16(h1, prev_load_rt, d);
        return 0;
    }
    if (len < 4)
        return -1;
    unsigned h2 = (unsigned)b[2] | ((unsigned)b[3] << 8);
    d->size = 4;
    unsigned op1 = (h1 >> 11) & 3;
    if ((h1 & 0xEC00) == 0xEC00)
        classify32_cp(h1, h2, d);
    else if (op1 == 1)
        classify32_01(h1, h2, prev_load_rt, d);
    else if (op1 == 2)
        (h2 & 0x8000) ? classify32_branch(h1, h2, d) : (void)(d->cls = KC_ALU);
    else
        classify32_11(h1, h2, prev_load_rt, d);
    return 0;
}
