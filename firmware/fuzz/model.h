/* Stub model package for the fuzzer (same interface as docs/c_package.md): two inputs and two
 * outputs packed back to back, like a compiled multi-input/multi-output package. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H
#include <stdint.h>
#define KILN_ARENA_SIZE 64
#define KILN_INPUT_BYTES 700
#define KILN_OUTPUT_BYTES 600
#define KILN_NUM_COMMANDS 70
#define KILN_NUM_INPUTS 2
#define KILN_NUM_OUTPUTS 2
#define KILN_INPUT0_BYTES 300u
#define KILN_INPUT1_BYTES 400u
#define KILN_OUTPUT0_BYTES 100u
#define KILN_OUTPUT1_BYTES 500u
int kiln_model_run(uint8_t *arena, const void *input, void *output);
extern const char *const kiln_command_names[KILN_NUM_COMMANDS];
extern const uint32_t kiln_command_macs[KILN_NUM_COMMANDS];
#ifdef KILN_PROFILE
void kiln_profile_mark(int index);
#endif
#endif
