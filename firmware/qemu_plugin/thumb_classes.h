/* Thumb / Thumb-2 instruction classes for Kiln's timing model (ARMv6-M, ARMv7-M, ARMv7E-M,
 * ARMv8-M Main, ARMv8.1-M with MVE), decoded from the instruction bytes alone.
 *
 * kiln_classify() puts every instruction in exactly one class (so per-class counts sum to the
 * instruction count); the *_REGS events additionally count registers moved by LDM/STM/PUSH/POP
 * and VLDM/VSTM/VPUSH/VPOP (words). Loads and stores are "pipelined" when they directly follow a
 * load single in the same translation block and do not take their address from its result
 * (Cortex-M3/M4 TRM, "Load/store timings"): the caller passes the previous instruction's state.
 *
 * The class names (KILN_CLASS_NAMES) are the contract with kiln/timing: keep the order. */
#ifndef KILN_THUMB_CLASSES_H
#define KILN_THUMB_CLASSES_H

#include <stdint.h>

#define KILN_CLASSES(X)                                                                            \
    X(ALU, "alu")                   /* data processing, moves, shifts, extends, DSP SIMD add/sat */ \
    X(IT, "it")                     /* IT (If-Then) */                                              \
    X(MUL, "mul")                   /* MUL, SMULxy, SMULWy, SMUAD, SMUSD, SMMUL, USAD8 */           \
    X(MAC, "mac")                   /* MLA, MLS, SMLAxy, SMLAWy, SMLAD, SMLSD, SMMLA, USADA8 */     \
    X(MUL_LONG, "mul_long")         /* SMULL, UMULL */                                              \
    X(MAC_LONG, "mac_long")         /* SMLAL, UMLAL, SMLALxy, SMLALD, SMLSLD, UMAAL */              \
    X(DIV, "div")                   /* SDIV, UDIV */                                                \
    X(LOAD, "load")                 /* LDR/LDRB/LDRH/LDRSB/LDRSH/LDREX/LDR literal */               \
    X(LOAD_PIPE, "load_pipelined")  /* a load single directly after a load single */                \
    X(LOAD_DUAL, "load_dual")       /* LDRD */                                                      \
    X(LOAD_MULTI, "load_multiple")  /* LDM, POP without PC */                                       \
    X(STORE, "store")               /* STR/STRB/STRH/STREX */                                       \
    X(STORE_PIPE, "store_pipelined") /* a store single directly after a load single */              \
    X(STORE_DUAL, "store_dual")     /* STRD */                                                      \
    X(STORE_MULTI, "store_multiple") /* STM, PUSH */                                                \
    X(BRANCH, "branch")             /* B, BL, BX, BLX, MOV/ADD PC, LDR PC: always taken */          \
    X(BRANCH_TAKEN, "branch_cond_taken")         /* B<c>, CBZ, CBNZ that jumped */                  \
    X(BRANCH_NOT_TAKEN, "branch_cond_not_taken") /* B<c>, CBZ, CBNZ that fell through */            \
    X(POP_PC, "load_multiple_pc")   /* LDM / POP with PC (a return) */                              \
    X(TABLE_BRANCH, "table_branch") /* TBB, TBH */                                                  \
    X(LOOP, "loop")                 /* low-overhead loops: WLS, DLS, LE, LETP, LCTP, BF */          \
    X(FP, "fp")                     /* VFP single-cycle: VADD, VSUB, VMUL, VCVT, VMOV, VMRS... */   \
    X(FP_MAC, "fp_mac")             /* VMLA, VMLS, VNMLA, VNMLS, VFMA, VFMS, VFNMA, VFNMS */        \
    X(FP_DIV, "fp_div")             /* VDIV, VSQRT */                                               \
    X(FP_LOAD, "fp_load")           /* VLDR */                                                      \
    X(FP_STORE, "fp_store")         /* VSTR */                                                      \
    X(FP_MULTI, "fp_multiple")      /* VLDM, VSTM, VPUSH, VPOP */                                   \
    X(MVE, "mve")                   /* Helium data processing */                                    \
    X(MVE_LOAD, "mve_load")         /* Helium VLDR*, VLD2x/VLD4x */                                 \
    X(MVE_STORE, "mve_store")       /* Helium VSTR*, VST2x/VST4x */                                 \
    X(SYSTEM, "system")             /* NOP and hints, barriers, MSR/MRS, CPS, SVC, BKPT, UDF, PLD */ \
    X(OTHER, "other")               /* anything not decoded above */

#define KILN_EVENTS(X)                                                                             \
    X(REGS_LOAD_MULTI, "regs_load_multiple")   /* registers loaded by LDM/POP (incl. PC) */         \
    X(REGS_STORE_MULTI, "regs_store_multiple") /* registers stored by STM/PUSH */                   \
    X(REGS_FP_MULTI, "words_fp_multiple")      /* 32-bit words moved by VLDM/VSTM/VPUSH/VPOP */

#define KILN_CLASS_ENUM(id, name) KC_##id,
#define KILN_EVENT_ENUM(id, name) KE_##id,
enum kiln_class { KILN_CLASSES(KILN_CLASS_ENUM) KC_N_CLASSES };
enum kiln_event { KILN_EVENTS(KILN_EVENT_ENUM) KE_N_EVENTS };
#undef KILN_CLASS_ENUM
#undef KILN_EVENT_ENUM

/* What the decoder learns from one instruction. */
struct kiln_insn {
    int cls;            /* enum kiln_class; a conditional branch is reported as KC_BRANCH_TAKEN */
    int cond_branch;    /* 1: B<c>/CBZ/CBNZ (the caller resolves taken / not taken) */
    int regs;           /* registers / words for the *_MULTI classes (0 otherwise) */
    int load_rt;        /* destination of a load single (-1 otherwise): the next instruction pipelines */
    unsigned addr_regs; /* bit mask of registers the address of a load/store uses */
    int size;           /* 2 or 4 bytes */
};

int kiln_classify(const uint8_t *bytes, int len, int prev_load_rt, struct kiln_insn *out);
extern const char *const kiln_class_names[KC_N_CLASSES];
extern const char *const kiln_event_names[KE_N_EVENTS];

#endif
