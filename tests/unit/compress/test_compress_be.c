/* hs_compress_encode_be / hs_compress_decode_add_be (src/compress/device.c) against the host
 * functions, byte for byte and bit for bit, errors included, on three backends:
 * - the CPU backend (host memory: the plain functions);
 * - an emulated device (be_check.h: host_memory = 0 and sequential models of the CUDA
 *   primitives), which takes every device path of device.c: packing from the primitives'
 *   output, the host redo on refused inputs, dense decoding on the device, staged decoding;
 * - the same without primitives: the copy fallbacks.
 * The CUDA backend itself is tested by tests/cuda/compress (skipped without a GPU). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "be_check.h"

/* Every spec on every kind of vector of each size, three rounds (the last above 2^32). */
static void run_specs(hs_backend *be, const char *label, const size_t *sizes, size_t nsizes) {
    char lab[128];
    for (size_t z = 0; z < nsizes; z++) {
        for (int kind = 0; kind < BE_KINDS; kind++) {
            float *x = be_vec(sizes[z], 1 + z, kind);
            snprintf(lab, sizeof(lab), "%s, %s", label, be_kind_name[kind]);
            for (size_t s = 0; s < BE_N_SPECS; s++)
                be_check_spec(be, be_specs[s], x, sizes[z], 42, 3, 1, lab);
            free(x);
        }
    }
}

static const size_t small_sizes[] = {1, 7, 33, 1000, 4099};
#define N_SMALL (sizeof(small_sizes) / sizeof(small_sizes[0]))

static void test_cpu_backend(void **state) {
    (void)state;
    hs_backend_cfg cfg = {1, 0};
    hs_backend *be = NULL;
    assert_int_equal(hs_backend_open(&be, HS_DEVICE_CPU, &cfg), 0);
    assert_true(be->host_memory);
    run_specs(be, "cpu", small_sizes, N_SMALL);
    be_check_bad_inputs(be, 7, "cpu");
    hs_backend_close(be);
}

static void test_emulated_device(void **state) {
    (void)state;
    hs_backend *be = emu_open(1);
    /* 12289: three compaction chunks and a partial one. */
    const size_t sizes[] = {1, 7, 33, 1000, 4099, 12289};
    run_specs(be, "emulated", sizes, sizeof(sizes) / sizeof(sizes[0]));
    be_check_bad_inputs(be, 7, "emulated");
    be_check_bad_inputs(be, 1000, "emulated");
    hs_backend_close(be);
}

static void test_emulated_fallbacks(void **state) {
    (void)state;
    hs_backend *be = emu_open(0);
    run_specs(be, "bare", small_sizes, N_SMALL);
    be_check_bad_inputs(be, 7, "bare");
    hs_backend_close(be);
}

/* The radix-select model on inputs that stress its decomposition: ties across chunk and tile
 * boundaries, more chunks than scan threads (d > 1024 * 4096, so scan runs hold several chunks),
 * every k from 1 to d on small vectors. */
static void test_emulated_topk(void **state) {
    (void)state;
    hs_backend *be = emu_open(1);
    for (size_t d = 1; d <= 40; d++) {
        float *x = be_vec(d, d, BE_TIES);
        for (size_t k = 1; k <= d; k++) be_check_topk(be, x, d, k, "emulated ties");
        free(x);
    }
    const size_t big = 1024 * 4096 + 3 * 4096 + 17;
    for (int kind = 0; kind < BE_KINDS; kind++) {
        float *x = be_vec(big, 9, kind);
        const size_t ks[] = {1, 4095, 4097, big / 100, big / 7 + 3, big - 1, big};
        for (size_t j = 0; j < sizeof(ks) / sizeof(ks[0]); j++)
            be_check_topk(be, x, big, ks[j], be_kind_name[kind]);
        free(x);
    }
    float *x = be_vec(12289, 3, BE_GAUSS);
    be_check_randk(be, x, 12289, 1, 5, 2, 9, "emulated");
    be_check_randk(be, x, 12289, 123, 5, 2, ((uint64_t)1 << 33) + 1, "emulated");
    be_check_randk(be, x, 12289, 12289, 5, 2, 9, "emulated");
    free(x);
    hs_backend_close(be);
}

/* Argument errors are the host functions' own. */
static void test_arguments(void **state) {
    (void)state;
    hs_backend *be = emu_open(1);
    hs_compressor *c = be_mk("topk:3", 10, 1);
    float x[11] = {0};
    float *dev = be_upload(be, x, 11);
    hs_buf *b = be_newbuf();
    assert_int_equal(hs_compress_encode_be(c, be, dev, 11, 0, 0, b), HS_EINVAL);
    assert_int_equal(b->len, 3);
    uint8_t msg[64] = {0};
    assert_int_equal(hs_compress_decode_add_be(c, be, msg, sizeof(msg), 0, 0, dev, 11, 1.0f),
                     HS_EINVAL);
    assert_int_equal(hs_compress_decode_add_be(c, be, msg, sizeof(msg), 0, 0, dev, 10, NAN),
                     HS_EINVAL);
    hs_buf_unref(b);
    hs_be_free(be, dev);
    hs_compressor_free(c);
    hs_backend_close(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_backend),
        cmocka_unit_test(test_emulated_device),
        cmocka_unit_test(test_emulated_fallbacks),
        cmocka_unit_test(test_emulated_topk),
        cmocka_unit_test(test_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
