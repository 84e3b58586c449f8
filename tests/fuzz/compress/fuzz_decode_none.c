/* libFuzzer target: the none decoder (see fuzz_decode.h). */
#define FUZZ_OP "none"
#include "fuzz_decode.h"
