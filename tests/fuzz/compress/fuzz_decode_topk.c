/* libFuzzer target: the topk decoder (see fuzz_decode.h). */
#define FUZZ_OP "topk"
#include "fuzz_decode.h"
