/* libFuzzer target: the randk decoder (see fuzz_decode.h). */
#define FUZZ_OP "randk"
#include "fuzz_decode.h"
