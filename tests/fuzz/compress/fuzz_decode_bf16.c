/* libFuzzer target: the bf16 decoder (see fuzz_decode.h). */
#define FUZZ_OP "bf16"
#include "fuzz_decode.h"
