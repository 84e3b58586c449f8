/* Unit tests of checkpoint files (src/train/checkpoint.c): round trip, every flipped bit and
 * every cut detected, stale temporaries removed, rotation that never loses newer progress, the
 * job's first round kept, and files of version 4 (which lack it) still read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "hearsay/checkpoint.h"
#include "hearsay/error.h"

static char dir[256];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/hs-ck-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_round(int rank, uint64_t round, const uint8_t *state, size_t len) {
    uint32_t ids[2] = {0, 7};
    const char *addrs[2] = {"127.0.0.1:7000", "127.0.0.1:7007"};
    hs_checkpoint_info in = {round, 500, rank, 7, "mlp:4-3", 2, ids, addrs, NULL, 460};
    assert_int_equal(hs_checkpoint_write(dir, &in, state, len, NULL), 0);
}

static void write_on(const hs_timeline *t, int rank, uint64_t round) {
    uint8_t st[8] = {(uint8_t)round};
    hs_checkpoint_info in = {round, 900, rank, 1, "mlp:4-3", 0, NULL, NULL, t, 0};
    assert_int_equal(hs_checkpoint_write(dir, &in, st, sizeof(st), NULL), 0);
}

static void path_of(int rank, uint64_t round, char *out, size_t cap) {
    snprintf(out, cap, "%s/ckpt-%d-%012llu.hsck", dir, rank, (unsigned long long)round);
}

static void test_round_trip(void **state) {
    (void)state;
    uint8_t st[100];
    for (int i = 0; i < 100; i++) st[i] = (uint8_t)(i * 7);
    write_round(1, 40, st, sizeof(st));
    hs_checkpoint ck;
    assert_int_equal(hs_checkpoint_newest(dir, 1, "mlp:4-3", &ck), 0);
    assert_int_equal(ck.round, 40);
    assert_int_equal(ck.end_round, 500);
    assert_int_equal(ck.has_first_round, 1);
    assert_int_equal(ck.first_round, 460);
    assert_int_equal(ck.rank, 1);
    assert_int_equal(ck.id, 7);
    assert_int_equal(ck.n_members, 2);
    assert_int_equal(ck.ids[1], 7);
    assert_string_equal(ck.addrs[1], "127.0.0.1:7007");
    assert_int_equal(ck.state_len, sizeof(st));
    assert_memory_equal(ck.state, st, sizeof(st));
    hs_checkpoint_clear(&ck);
    /* Another model's run does not take it. */
    assert_int_equal(hs_checkpoint_newest(dir, 1, "mlp:4-5", &ck), HS_ENOENT);
}

/* Every single flipped bit of the file, the header's round field included, and every cut is
 * refused. */
static void test_every_byte_covered(void **state) {
    (void)state;
    uint8_t st[40] = {1, 2, 3};
    write_round(2, 10, st, sizeof(st));
    char p[512];
    path_of(2, 10, p, sizeof(p));
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    uint8_t good[1024];
    size_t n = fread(good, 1, sizeof(good), f);
    fclose(f);
    assert_true(n > 60 && n < sizeof(good));
    uint8_t bad[1024];
    hs_checkpoint ck;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b += 3) {
            memcpy(bad, good, n);
            bad[i] ^= (uint8_t)(1u << b);
            f = fopen(p, "wb");
            fwrite(bad, 1, n, f);
            fclose(f);
            int err = hs_checkpoint_read(p, "mlp:4-3", &ck);
            if (err == 0) fail_msg("a flipped bit %d of byte %zu was not detected", b, i);
        }
    for (size_t cut = 0; cut < n; cut++) {
        f = fopen(p, "wb");
        fwrite(good, 1, cut, f);
        fclose(f);
        if (hs_checkpoint_read(p, "mlp:4-3", &ck) == 0) fail_msg("a file cut at %zu was read", cut);
    }
    /* The header's round field: the message says why. */
    memcpy(bad, good, n);
    bad[9] ^= 1;
    f = fopen(p, "wb");
    fwrite(bad, 1, n, f);
    fclose(f);
    assert_int_equal(hs_checkpoint_read(p, "mlp:4-3", &ck), HS_EFORMAT);
    assert_non_null(strstr(hs_error_message(), "checksum mismatch"));
    unlink(p);
}

static void test_stale_tmp_removed(void **state) {
    (void)state;
    char p[512], own[512], other[512];
    snprintf(p, sizeof(p), "%s/.ckpt-3-000000000020.999999.tmp", dir);
    snprintf(own, sizeof(own), "%s/.ckpt-3-000000000030.%d.tmp", dir, (int)getpid());
    snprintf(other, sizeof(other), "%s/.ckpt-4-000000000020.999999.tmp", dir);
    const char *files[3] = {p, own, other};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(files[i], "w");
        fputs("half a checkpoint", f);
        fclose(f);
    }
    assert_int_equal(hs_checkpoint_clean_tmp(dir, 3), 1);
    assert_int_not_equal(access(p, F_OK), 0);
    assert_int_equal(access(own, F_OK), 0);   /* this process's own write in progress */
    assert_int_equal(access(other, F_OK), 0); /* another shard's */
    unlink(own);
    unlink(other);
}

/* Keeps the newest HS_CHECKPOINT_KEEP; a file of a later round than the one written is never
 * removed, so a peer that restarted behind its newest file cannot delete it. */
static void test_rotation(void **state) {
    (void)state;
    uint8_t st[8] = {0};
    char p[512];
    for (uint64_t r = 100; r <= 600; r += 100) write_round(5, r, st, sizeof(st));
    for (uint64_t r = 100; r <= 600; r += 100) {
        path_of(5, r, p, sizeof(p));
        assert_int_equal(access(p, F_OK) == 0, r >= 400);
    }
    /* Written behind the newest: rounds 400-600 stay, and so does the one just written. */
    write_round(5, 50, st, sizeof(st));
    for (uint64_t r = 400; r <= 600; r += 100) {
        path_of(5, r, p, sizeof(p));
        assert_int_equal(access(p, F_OK), 0);
    }
    path_of(5, 50, p, sizeof(p));
    assert_int_equal(access(p, F_OK), 0);
    hs_checkpoint ck;
    assert_int_equal(hs_checkpoint_newest(dir, 5, "mlp:4-3", &ck), 0);
    assert_int_equal(ck.round, 600);
    hs_checkpoint_clear(&ck);
}

/* A job stopped in a staggered way and restarted from rank 0's round 240 (timeline B branching
 * from A there): files of A after 240 are of a timeline the job abandoned. They are never
 * found, the peer's first write (or drop_abandoned) removes them, and the ones up to 240 stay
 * usable on B and on a later branch of B. */
static void test_timelines(void **state) {
    (void)state;
    hs_timeline a, b, c;
    hs_timeline_new(&a, NULL, 0);
    for (uint64_t r = 200; r <= 260; r += 20) write_on(&a, 6, r);
    for (uint64_t r = 200; r <= 600; r += 20) write_on(&a, 7, r);
    hs_timeline_new(&b, &a, 240);
    assert_true(b.id != a.id && b.n_anc == 1 && b.anc_id[0] == a.id && b.anc_round[0] == 240);
    assert_true(hs_timeline_has(&b, a.id, 240) && !hs_timeline_has(&b, a.id, 241));
    hs_checkpoint ck;
    assert_int_equal(hs_checkpoint_find(dir, 6, "mlp:4-3", &b, 240, &ck), 0);
    assert_int_equal(ck.round, 240);
    assert_true(ck.timeline.id == a.id);
    hs_checkpoint_clear(&ck);
    /* Rank 7 kept only rounds 560-600 of A: nothing of B's history. */
    assert_int_equal(hs_checkpoint_find(dir, 7, "mlp:4-3", &b, 240, &ck), HS_ENOENT);
    assert_int_equal(hs_checkpoint_drop_abandoned(dir, 7, &b, 240), 3);
    assert_int_equal(hs_checkpoint_newest(dir, 7, "mlp:4-3", &ck), HS_ENOENT);
    /* Rank 6 writes round 260 on B: A's 260 goes, A's 220 and 240 stay. */
    write_on(&b, 6, 260);
    char p[512];
    assert_int_equal(hs_checkpoint_newest(dir, 6, "mlp:4-3", &ck), 0);
    assert_true(ck.round == 260 && ck.timeline.id == b.id);
    hs_checkpoint_clear(&ck);
    path_of(6, 240, p, sizeof(p));
    assert_int_equal(access(p, F_OK), 0);
    /* A restart of B at 250 branches again: B's 260 is abandoned, A's 240 is history. */
    hs_timeline_new(&c, &b, 250);
    assert_true(c.n_anc == 2 && hs_timeline_has(&c, a.id, 240) && !hs_timeline_has(&c, b.id, 260));
    assert_int_equal(hs_checkpoint_find(dir, 6, "mlp:4-3", &c, 300, &ck), 0);
    assert_int_equal(ck.round, 240);
    hs_checkpoint_clear(&ck);
}

static void test_dir_check(void **state) {
    (void)state;
    char sub[512];
    snprintf(sub, sizeof(sub), "%s/new", dir);
    assert_int_equal(hs_checkpoint_dir_check(sub), 0);
    struct stat sb;
    assert_int_equal(stat(sub, &sb), 0);
    /* Under a regular file nothing can be created, even as root. */
    char file[512], under[600];
    snprintf(file, sizeof(file), "%s/plain", dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    snprintf(under, sizeof(under), "%s/ck", file);
    assert_int_equal(hs_checkpoint_dir_check(under), HS_EIO);
    assert_non_null(strstr(hs_error_message(), under));
}

/* A state whose runs of zeros are read by leaving the zeroed buffer untouched (read_sparse):
 * real zeros, a -0.0f (not zero bytes), lone bytes at the 64 KiB read chunks' edges and at the
 * very end, a chunk all zeros, all load to the same bytes. */
static void test_zero_runs(void **state) {
    (void)state;
    size_t len = 3 * 65536 + 123;
    uint8_t *st = calloc(1, len);
    assert_non_null(st);
    float negz = -0.0f;
    memcpy(st + 4096, &negz, 4);
    st[65535] = 1;
    st[65536] = 2;
    st[2 * 65536 + 7] = 0x80;
    st[len - 1] = 9;
    write_round(2, 41, st, len);
    hs_checkpoint ck;
    assert_int_equal(hs_checkpoint_newest(dir, 2, "mlp:4-3", &ck), 0);
    assert_int_equal(ck.state_len, len);
    assert_memory_equal(ck.state, st, len);
    hs_checkpoint_clear(&ck);
    free(st);
}

/* A file of version 4 (before the job's first round was kept) is read as it was: the same
 * round, end, members and state, and no first round (the node then says what it counts from). */
static void test_version4_read(void **state) {
    (void)state;
    uint8_t st[24] = {9, 8, 7};
    write_round(3, 30, st, sizeof(st));
    char p[512];
    path_of(3, 30, p, sizeof(p));
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    uint8_t v5[1024], v4[1024];
    size_t n = fread(v5, 1, sizeof(v5), f);
    fclose(f);
    assert_true(n > 60 && n < sizeof(v5));
    /* Version 4: the same bytes without the first round (just before the state's length). */
    size_t at = n - 4 - sizeof(st) - 8 - 8, m = n - 8;
    memcpy(v4, v5, at);
    memcpy(v4 + at, v5 + at + 8, n - 4 - (at + 8));
    uint32_t ver = 4, crc;
    memcpy(v4 + 4, &ver, 4);
    crc = (uint32_t)crc32_z(0L, v4, m - 4);
    memcpy(v4 + m - 4, &crc, 4);
    f = fopen(p, "wb");
    assert_int_equal(fwrite(v4, 1, m, f), m);
    fclose(f);
    hs_checkpoint ck;
    assert_int_equal(hs_checkpoint_read(p, "mlp:4-3", &ck), 0);
    assert_int_equal(ck.round, 30);
    assert_int_equal(ck.end_round, 500);
    assert_int_equal(ck.has_first_round, 0);
    assert_int_equal(ck.n_members, 2);
    assert_int_equal(ck.state_len, sizeof(st));
    assert_memory_equal(ck.state, st, sizeof(st));
    hs_checkpoint_clear(&ck);
    /* and found among the shard's files (the header's version is checked there too) */
    assert_int_equal(hs_checkpoint_newest(dir, 3, "mlp:4-3", &ck), 0);
    assert_int_equal(ck.round, 30);
    hs_checkpoint_clear(&ck);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),        cmocka_unit_test(test_every_byte_covered),
        cmocka_unit_test(test_stale_tmp_removed), cmocka_unit_test(test_rotation),
        cmocka_unit_test(test_timelines),         cmocka_unit_test(test_version4_read),
        cmocka_unit_test(test_dir_check),          cmocka_unit_test(test_zero_runs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
