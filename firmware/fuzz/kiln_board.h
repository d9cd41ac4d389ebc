/* Host stand-in for the generated board header: lets firmware/runtime/main.c and kiln_frame.c
 * compile for the host so the fuzzer can drive the whole command loop under ASan/UBSan. */
#ifndef KILN_BOARD_H
#define KILN_BOARD_H
#define KILN_BOARD_NAME "host-fuzz"
#define KILN_CORE "host"
#define KILN_CLOCK_HZ 1000000u
#define KILN_HAS_FPU 0
#define KILN_HAS_CYCCNT 0
#define KILN_HAS_MSPLIM 0
#define KILN_ARCH_V6M 0
#define KILN_SEMIHOSTING 0
static inline void kiln_board_init(void) {}
#endif
