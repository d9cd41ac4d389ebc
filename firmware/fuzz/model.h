/* Stub model package for the fuzzer (same interface as docs/c_package.md). */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H
#include <stdint.h>
#define KILN_ARENA_SIZE 64
#define KILN_INPUT_BYTES 700
#define KILN_OUTPUT_BYTES 600
#define KILN_NUM_COMMANDS 70
int kiln_model_run(uint8_t *arena, const void *input, void *output);
extern const char *const kiln_command_names[KILN_NUM_COMMANDS];
extern const uint32_t kiln_command_macs[KILN_NUM_COMMANDS];
#ifdef KILN_PROFILE
void kiln_profile_mark(int index);
#endif
#endif
