/* libFuzzer target: the qsgd decoder (see fuzz_decode.h). */
#define FUZZ_OP "qsgd"
#include "fuzz_decode.h"
