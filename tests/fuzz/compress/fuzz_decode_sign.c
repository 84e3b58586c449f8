/* libFuzzer target: the sign decoder (see fuzz_decode.h). */
#define FUZZ_OP "sign"
#include "fuzz_decode.h"
