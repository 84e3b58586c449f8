/* libFuzzer target: the fp16 decoder (see fuzz_decode.h). */
#define FUZZ_OP "fp16"
#include "fuzz_decode.h"
