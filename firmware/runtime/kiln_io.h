/* Per-input and per-output byte sizes of the model package, as tables the runtime can index.
 *
 * model.h (docs/c_package.md) defines KILN_NUM_INPUTS / KILN_NUM_OUTPUTS and KILN_INPUT<i>_BYTES /
 * KILN_OUTPUT<i>_BYTES; the inputs are packed back to back in the buffer kiln_model_run reads,
 * the outputs likewise. A package without those macros has one input and one output.
 * Generated once for up to 16 of each (the preprocessor cannot loop); more is a build error. */
#ifndef KILN_IO_H
#define KILN_IO_H
#include <stdint.h>
#include "model.h"

#ifndef KILN_NUM_INPUTS
#define KILN_NUM_INPUTS 1
#define KILN_INPUT0_BYTES KILN_INPUT_BYTES
#endif
#ifndef KILN_NUM_OUTPUTS
#define KILN_NUM_OUTPUTS 1
#define KILN_OUTPUT0_BYTES KILN_OUTPUT_BYTES
#endif
#define KILN_IO_MAX 16
#if KILN_NUM_INPUTS < 1 || KILN_NUM_INPUTS > KILN_IO_MAX
#error "the firmware runtime supports 1..16 model inputs"
#endif
#if KILN_NUM_OUTPUTS < 1 || KILN_NUM_OUTPUTS > KILN_IO_MAX
#error "the firmware runtime supports 1..16 model outputs"
#endif

static const uint32_t kiln_input_sizes[KILN_NUM_INPUTS] = {
    KILN_INPUT0_BYTES,
#if KILN_NUM_INPUTS > 1
    KILN_INPUT1_BYTES,
#endif
#if KILN_NUM_INPUTS > 2
    KILN_INPUT2_BYTES,
#endif
#if KILN_NUM_INPUTS > 3
    KILN_INPUT3_BYTES,
#endif
#if KILN_NUM_INPUTS > 4
    KILN_INPUT4_BYTES,
#endif
#if KILN_NUM_INPUTS > 5
    KILN_INPUT5_BYTES,
#endif
#if KILN_NUM_INPUTS > 6
    KILN_INPUT6_BYTES,
#endif
#if KILN_NUM_INPUTS > 7
    KILN_INPUT7_BYTES,
#endif
#if KILN_NUM_INPUTS > 8
    KILN_INPUT8_BYTES,
#endif
#if KILN_NUM_INPUTS > 9
    KILN_INPUT9_BYTES,
#endif
#if KILN_NUM_INPUTS > 10
    KILN_INPUT10_BYTES,
#endif
#if KILN_NUM_INPUTS > 11
    KILN_INPUT11_BYTES,
#endif
#if KILN_NUM_INPUTS > 12
    KILN_INPUT12_BYTES,
#endif
#if KILN_NUM_INPUTS > 13
    KILN_INPUT13_BYTES,
#endif
#if KILN_NUM_INPUTS > 14
    KILN_INPUT14_BYTES,
#endif
#if KILN_NUM_INPUTS > 15
    KILN_INPUT15_BYTES,
#endif
};

static const uint32_t kiln_output_sizes[KILN_NUM_OUTPUTS] = {
    KILN_OUTPUT0_BYTES,
#if KILN_NUM_OUTPUTS > 1
    KILN_OUTPUT1_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 2
    KILN_OUTPUT2_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 3
    KILN_OUTPUT3_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 4
    KILN_OUTPUT4_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 5
    KILN_OUTPUT5_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 6
    KILN_OUTPUT6_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 7
    KILN_OUTPUT7_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 8
    KILN_OUTPUT8_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 9
    KILN_OUTPUT9_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 10
    KILN_OUTPUT10_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 11
    KILN_OUTPUT11_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 12
    KILN_OUTPUT12_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 13
    KILN_OUTPUT13_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 14
    KILN_OUTPUT14_BYTES,
#endif
#if KILN_NUM_OUTPUTS > 15
    KILN_OUTPUT15_BYTES,
#endif
};

#endif
