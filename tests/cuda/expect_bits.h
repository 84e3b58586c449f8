/* The CUDA tests' bit-for-bit comparison of a device result with its reference. Included by
 * the CUDA tests' main files after <cmocka.h>. */
#ifndef HS_TESTS_CUDA_EXPECT_BITS_H
#define HS_TESTS_CUDA_EXPECT_BITS_H

#include <stddef.h>
#include <string.h>

/* Fails, naming `what` and the first differing element, unless got and ref (n floats) have the
 * same bits. */
static void expect_bits(const char *what, const float *got, const float *ref, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &ref[i], sizeof(float)) != 0 && bad++ == 0) first = i;
    if (bad)
        print_error("%s: %zu of %zu elements differ in their bits; first [%zu]: %a (dev) vs "
                    "%a (ref)\n",
                    what, bad, n, first, (double)got[first], (double)ref[first]);
    assert_int_equal(bad, 0);
}

#endif
