/* The algorithms' real rounds with some peers on the device (hs__algo_to_device): real hs_algo
 * objects over hs_simnet, a ring of five (or a path), two peers keeping x and their algorithm's
 * state in the backend's memory and the others on the host. CHOCO, BEER, DCD, SGP and D-PSGD:
 * every peer's x after every round must be the bits of the all-host run, for each compressor
 * the algorithm takes, with peers that start apart (the first round carries full replicas) and
 * with lost messages (replicas asked for again in full), and a steady device round must not
 * bring x (or any d-float vector) to the host, bar the one compressor whose message is x
 * itself. The saved states (replicas, own replica, BEER's tracker, SGP's weight) are equal
 * too, and every message crosses through the backend's staging memory. ef: compressors (their
 * residual is host memory) stay on the host.
 *
 * Exit codes as tests/cuda (../cuda_open.h): 77 without a CUDA build or a GPU, a failure where
 * a GPU cannot be opened or with HEARSAY_REQUIRE_CUDA=1; runs under ../shared/tools/cuda-emu.
 * `--reference` runs it on gossip_ref.h's reference device (the host side on every machine). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../cuda_open.h"
#include "gossip_ref.h"
#include "round_job.h"
#include "algo/algo_internal.h"
#include "compress/compress_ew.h"
#include "core/error_internal.h"
#include "hearsay/data.h"
#include "hearsay/model.h"
#include "hearsay/sim.h"
#include "hearsay/topo.h"
#include "hearsay/trainer.h"
#include "train/round.h"

/* qsgd:4:128 is rescaled before CHOCO and BEER compress (hs__compress_replica_scale). */
static const char *const specs[] = {"topk:0.03:fp16", "topk:0.1", "randk:0.1:unscaled",
                                    "qsgd:16:128",    "qsgd:4:128", "sign:64",
                                    "fp16",           "bf16",       "none"};

static void test_choco_mixed_job(void **state) {
    (void)state;
    for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++) {
        job_opts o = {specs[s], HS_ALGO_CHOCO, 1, 0, 0, NULL};
        check(&o);
    }
}

/* BEER, DCD, SGP and D-PSGD with every compressor of specs they take
 * (hs_algo_check_compressor). */
static void test_other_algos_mixed_job(void **state) {
    (void)state;
    const hs_algo_kind kinds[] = {HS_ALGO_BEER, HS_ALGO_DCD, HS_ALGO_SGP, HS_ALGO_DPSGD};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        int ran = 0;
        for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]) + 1; s++) {
            /* DCD takes unbiased compressors: rescaled random-k besides specs' ones. */
            const char *spec = s < sizeof(specs) / sizeof(specs[0]) ? specs[s] : "randk:0.5";
            hs_compressor *c;
            assert_int_equal(hs_compressor_new(&c, spec, D, 3), 0);
            int ok = hs_algo_check_compressor(kinds[k], c) == 0;
            hs_compressor_free(c);
            if (!ok) continue;
            job_opts o = {spec, kinds[k], 1, 0, 0, NULL};
            check(&o);
            ran++;
        }
        assert_true(ran >= 3);
    }
}

/* Peers that restart from their saved state mid-job (reload_peers) go on with the bits of the
 * same restart on the host, for every algorithm. */
static void test_reload_mid_job(void **state) {
    (void)state;
    const job_opts jobs[] = {
        {"topk:0.1", HS_ALGO_CHOCO, 1, 0, 0, NULL},  {"topk:0.1", HS_ALGO_BEER, 0, 0, 0, NULL},
        {"qsgd:16:128", HS_ALGO_DCD, 1, 0, 0, NULL}, {"fp16", HS_ALGO_DPSGD, 1, 0, 0, NULL},
        {"topk:0.1", HS_ALGO_SGP, 1, 0, 0, NULL},
    };
    for (size_t i = 0; i < sizeof(jobs) / sizeof(jobs[0]); i++) {
        reload_at = 4;
        check(&jobs[i]);
    }
    reload_at = 0;
}

/* One job of each algorithm, with a compressor it takes. */
static const job_opts each_algo[] = {
    {"topk:0.1", HS_ALGO_CHOCO, 1, 0, 0, NULL},  {"topk:0.1", HS_ALGO_BEER, 1, 0, 0, NULL},
    {"qsgd:16:128", HS_ALGO_DCD, 1, 0, 0, NULL}, {"fp16", HS_ALGO_DPSGD, 1, 0, 0, NULL},
    {"topk:0.1", HS_ALGO_SGP, 1, 0, 0, NULL},
};
#define N_ALGOS (sizeof(each_algo) / sizeof(each_algo[0]))

/* Writes a topology file of the given JSON to a new file named after template path. */
static void topo_file(char *path, const char *json) {
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", json);
    assert_int_equal(fclose(f), 0);
}

/* A neighbour of a device peer leaves (host peer 3, beside device peer 2), or a device peer
 * leaves (peer 1, beside host peer 0): the survivors go on with the bits of the all-host job
 * through the BYE and the membership change that follows it. */
static void test_neighbour_leaves(void **state) {
    (void)state;
    for (int who = 0; who < 2; who++)
        for (size_t i = 0; i < N_ALGOS; i++) {
            leave_at = 2;
            leaver = who ? 1 : 3;
            check(&each_algo[i]);
        }
    leave_at = 0;
}

/* Time-varying topologies: the one-peer exponential graph (directed, a new in-neighbour every
 * round), and a schedule that swaps the ring for the pentagram every two rounds, so that each
 * device peer's two neighbours are replaced by two others and come back. */
static void test_time_varying(void **state) {
    (void)state;
    char path[] = "/tmp/hs-round-swap-XXXXXX.json";
    const char *ring = "{\"edges\": [[0, 1], [1, 2], [2, 3], [3, 4], [4, 0]]}";
    const char *star = "{\"edges\": [[0, 2], [2, 4], [4, 1], [1, 3], [3, 0]]}";
    char json[512];
    snprintf(json, sizeof(json), "{\"peers\": 5, \"schedule\": [%s, %s, %s, %s]}", ring, ring,
             star, star);
    topo_file(path, json);
    for (int swap = 0; swap < 2; swap++)
        for (size_t i = 0; i < N_ALGOS; i++) {
            job_opts o = each_algo[i];
            o.topo = swap ? path : "onepeer-exp";
            check(&o);
            /* Each device peer has two in-neighbours at a time, four over the schedule: it
             * holds two device replicas, not one for every neighbour it ever had. */
            if (swap && o.kind == HS_ALGO_DCD && round_allocs > 4)
                fail_msg("dcd, neighbours swapped: the 2 device peers hold %d device replicas",
                         round_allocs);
        }
    unlink(path);
}

/* A device failure while a neighbour's message is decoded (page-locked staging or scratch that
 * cannot be had, a kernel that fails) is the round's error, not a lost message: taken for one,
 * every message would be dropped for as long as it lasts while the run goes on, exit 0. */
static void test_decode_failure_surfaces(void **state) {
    (void)state;
    float *x = malloc(sizeof(float) * ROUNDS * N * D);
    assert_non_null(x);
    uint64_t h[N];
    for (size_t i = 0; i < N_ALGOS; i++) {
        job_opts o = each_algo[i];
        o.mixed = 1;
        fail_pull_at = 2;
        fail_pull_rc[1] = fail_pull_rc[2] = 0;
        run_job(&o, x, h);
        for (int p = 1; p <= 2; p++)
            if (fail_pull_rc[p] != HS_ECUDA)
                fail_msg("%s: device peer %d's pull returned %d with its decodes failing",
                         hs_algo_kind_name(o.kind), p, fail_pull_rc[p]);
    }
    fail_pull_at = 0;
    free(x);
}

/* D-PSGD's peers with one neighbour mix on their own paths (in place, or from the messages'
 * values with fp32): the device peers 1 and 2 end the path 1 - 0 - 3 - 4 - 2. */
static void test_dpsgd_one_neighbour(void **state) {
    (void)state;
    char path[] = "/tmp/hs-round-path-XXXXXX.json";
    topo_file(path, "{\"peers\": 5, \"directed\": false, \"self_weight\": \"auto\", "
                    "\"edges\": [[1, 0], [0, 3], [3, 4], [4, 2]]}");
    const char *specs1[] = {"none", "fp16", "qsgd:16:128"};
    for (size_t i = 0; i < 3; i++) {
        job_opts o = {specs1[i], HS_ALGO_DPSGD, 1, 0, 0, path};
        check(&o);
    }
    job_opts lossy = {"fp16", HS_ALGO_DPSGD, 1, 0.15, 0, path};
    check(&lossy);
    unlink(path);
}

/* Peers that start apart exchange full replicas first (the host rebuilds m and uploads it);
 * lost messages make replicas be asked for again in full. */
static void test_full_replicas(void **state) {
    (void)state;
    job_opts apart = {"topk:0.1", HS_ALGO_CHOCO, 0, 0, 0, NULL};
    check(&apart);
    job_opts lossy = {"topk:0.1", HS_ALGO_CHOCO, 1, 0.15, 0, NULL};
    check(&lossy);
    job_opts lossy_q = {"qsgd:16:128", HS_ALGO_CHOCO, 0, 0.15, 0, NULL};
    check(&lossy_q);
    /* The same for BEER's two parts, DCD's device replicas and SGP's lost shares. */
    const job_opts more[] = {
        {"topk:0.1", HS_ALGO_BEER, 0, 0, 0, NULL},
        {"topk:0.1", HS_ALGO_BEER, 1, 0.15, 0, NULL},
        {"qsgd:16:128", HS_ALGO_DCD, 0, 0, 0, NULL},
        {"qsgd:16:128", HS_ALGO_DCD, 1, 0.15, 0, NULL},
        {"qsgd:16:128", HS_ALGO_SGP, 0, 0.15, 0, NULL},
        {"topk:0.1", HS_ALGO_SGP, 0, 0, 0, NULL},
        {"fp16", HS_ALGO_DPSGD, 0, 0.15, 0, NULL},
    };
    for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++) check(&more[i]);
}

/* A compressor with an ef: residual (host memory) keeps the host path (x of its peers stays on
 * the host), and a backend whose memory is host memory has nothing to move. */
static void test_host_path_stays(void **state) {
    (void)state;
    job_opts dpsgd = {"ef:topk:0.1", HS_ALGO_DPSGD, 1, 0, 0, NULL};
    check(&dpsgd);
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    float x0[D] = {0};
    hs_algo *a;
    assert_int_equal(hs_algo_new(&a, &cfg, 0, D, x0), 0);
    hs_backend *cpu;
    hs_backend_cfg bc = {1, 0};
    assert_int_equal(hs_backend_open(&cpu, HS_DEVICE_CPU, &bc), 0);
    assert_int_equal(hs__algo_to_device(a, cpu), 0); /* host memory: nothing to move */
    hs_backend_close(cpu);
    hs_algo_free(a);
}

/* The simulator's algorithm and compressor (new_sim). */
static hs_algo_kind sim_kind = HS_ALGO_CHOCO;
static const char *sim_compress = "topk:0.1";
static long sim_steps = 6; /* the cosine schedule's length: lr 0 from round 3 on */

/* The simulated jobs' data: 600 synthetic samples of 16 features in 4 classes. */
static hs_dataset *sim_data(void) {
    hs_synth_cfg dc = {600, 16, 4, 4.0f, 11, 0};
    hs_dataset *ds;
    assert_int_equal(hs_dataset_synthetic(&ds, &dc), 0);
    return ds;
}

/* The simulator on backend be: 4 peers training an MLP with sim_kind. */
static hs_sim *new_sim(hs_backend *be, hs_backend *const *peer_be, const hs_dataset *ds,
                       hs_momentum_kind mk) {
    hs_sim_cfg sc;
    memset(&sc, 0, sizeof(sc));
    sc.peer_be = peer_be;
    sc.n = 4;
    sc.topology = "ring";
    sc.seed = 3;
    assert_int_equal(hs_partition_parse("iid", &sc.partition), 0);
    hs_algo_cfg_default(&sc.algo);
    sc.algo.kind = sim_kind;
    sc.algo.compress = sim_compress;
    sc.algo.seed = 3;
    hs_mlp_cfg mc;
    assert_int_equal(hs_mlp_cfg_parse(&mc, ds->dim, "32", ds->classes), 0);
    hs_model_spec_mlp(&sc.trainer.model, &mc);
    hs_optim_cfg_default(&sc.trainer.optim);
    sc.trainer.optim.lr = 0.05f;
    sc.trainer.optim.momentum = 0.9f;
    sc.trainer.optim.momentum_kind = mk;
    sc.trainer.optim.total_steps = sim_steps;
    sc.trainer.batch = 16;
    sc.trainer.local_steps = 2;
    sc.trainer.seed = 3;
    hs_sim *s;
    if (hs_sim_new(&s, be, &sc, ds) < 0) fail_msg("sim: %s", hs_error_message());
    return s;
}

/* new_sim's job for 6 rounds; returns every peer's x (host, 4 d floats; caller frees). On a
 * device the trainers hand the parameters themselves to the algorithm, and their host copy
 * of x, read after the rounds, is the device's. */
static float *run_sim(hs_backend *be, hs_backend *const *peer_be, const hs_dataset *ds,
                      hs_momentum_kind mk, size_t *d, double *cons) {
    hs_sim *s = new_sim(be, peer_be, ds, mk);
    *d = hs_trainer_dim(hs_sim_trainer(s, 0));
    x_bytes = sizeof(float) * *d;
    x_downloads = 0;
    for (int r = 0; r < 6; r++) {
        int peer;
        if (hs_sim_step(s, &peer) < 0) fail_msg("round %d: %s", r, hs_error_message());
    }
    /* The trainers' own copies of x to the host in the 6 rounds of 4 peers (hs_sim_step
     * observes no consensus; hs_sim_consensus and the reads below come after the count):
     * local momentum needs none, quasi-global momentum one per peer and round, at its close. */
    int xd = x_downloads;
    x_bytes = 0;
    if (be == dev && !peer_be) {
        printf("# sim on the device, %s, momentum %s: %d downloads of x in 6 rounds of 4 peers\n",
               hs_algo_kind_name(sim_kind), mk == HS_MOMENTUM_QG ? "qg" : "local", xd);
        assert_int_equal(xd, mk == HS_MOMENTUM_QG ? 4 * 6 : 0);
    }
    assert_int_equal(hs_sim_consensus(s, cons, NULL), 0);
    float *x = malloc(sizeof(float) * 4 * *d), *g = malloc(sizeof(float) * *d);
    assert_true(x && g);
    for (int i = 0; i < 4; i++) {
        hs_trainer *t = hs_sim_trainer(s, i);
        memcpy(x + (size_t)i * *d, hs_trainer_x(t), sizeof(float) * *d);
        hs_backend *bi = peer_be && peer_be[i] ? peer_be[i] : be;
        if (bi->host_memory) continue;
        /* The gossip works on the device's x, and the host copy read above is its bits. */
        const float *gx = hs_trainer_gossip_x(t);
        assert_ptr_not_equal(gx, hs_trainer_x(t));
        assert_int_equal(hs_be_download(bi, g, gx, sizeof(float) * *d), 0);
        assert_memory_equal(g, x + (size_t)i * *d, sizeof(float) * *d);
    }
    free(g);
    hs_sim_free(s);
    return x;
}

/* The trainers' hand-off (src/train/trainer.c) in a simulated job on the device, with local
 * and quasi-global momentum (which reads x at each round's close). On the reference device,
 * whose model kernels are the CPU backend's, every peer's x must be the bits of the same job
 * on the CPU backend; a GPU's model kernels round differently, so there the check is the
 * hand-off's own (run_sim). */
static void sim_case(const hs_dataset *ds, hs_momentum_kind mk) {
    size_t d, d2;
    double cd, cc;
    float *xd = run_sim(dev, NULL, ds, mk, &d, &cd);
    for (size_t j = 0; j < 4 * d; j++)
        if (!isfinite(xd[j])) fail_msg("element %zu of the device job is %g", j, (double)xd[j]);
    if (reference) {
        hs_backend *cpu;
        hs_backend_cfg bc = {1, 0};
        assert_int_equal(hs_backend_open(&cpu, HS_DEVICE_CPU, &bc), 0);
        float *xc = run_sim(cpu, NULL, ds, mk, &d2, &cc);
        assert_int_equal(d, d2);
        for (size_t j = 0; j < 4 * d; j++)
            if (hs_cw_bits(xc[j]) != hs_cw_bits(xd[j]))
                fail_msg("momentum %d: peer %zu, element %zu: CPU backend %a, reference device %a",
                         (int)mk, j / d, j % d, (double)xc[j], (double)xd[j]);
        printf("# sim (%s, momentum %s): 4 peers' x on the reference device are the CPU "
               "backend's bits\n",
               hs_algo_kind_name(sim_kind), mk == HS_MOMENTUM_QG ? "qg" : "local");
        free(xc);
        hs_backend_close(cpu);
    }
    free(xd);
}

static void test_sim_on_device(void **state) {
    (void)state;
    hs_dataset *ds = sim_data();
    sim_case(ds, HS_MOMENTUM_LOCAL);
    sim_case(ds, HS_MOMENTUM_QG);
    /* The trainers hand BEER, DCD and D-PSGD the parameters too, and SGP an x beside them
     * (its parameters are x / w). */
    sim_kind = HS_ALGO_BEER;
    sim_case(ds, HS_MOMENTUM_LOCAL);
    sim_kind = HS_ALGO_SGP;
    sim_case(ds, HS_MOMENTUM_LOCAL);
    sim_kind = HS_ALGO_DCD;
    sim_compress = "qsgd:16:128";
    sim_case(ds, HS_MOMENTUM_LOCAL);
    sim_kind = HS_ALGO_DPSGD;
    sim_compress = "fp16"; /* with none the message is x itself: one download a round */
    sim_case(ds, HS_MOMENTUM_LOCAL);
    sim_case(ds, HS_MOMENTUM_QG);
    sim_kind = HS_ALGO_CHOCO;
    sim_compress = "topk:0.1";
    hs_dataset_free(ds);
}

/* A failed copy of x from the device is every reader's error, never the older host copy: the
 * consensus, the trainer's x, a checkpoint, a snapshot, the written parameters, and a round
 * of quasi-global momentum (whose close reads x). */
static void test_x_copy_fails(void **state) {
    (void)state;
    hs_dataset *ds = sim_data();
    hs_buf *b;
    assert_int_equal(hs_buf_new(&b, 64), 0);
    for (int qg = 0; qg < 2; qg++) {
        hs_sim *s = new_sim(dev, NULL, ds, qg ? HS_MOMENTUM_QG : HS_MOMENTUM_LOCAL);
        hs_trainer *t = hs_sim_trainer(s, 0);
        x_bytes = sizeof(float) * hs_trainer_dim(t);
        int peer;
        double cons;
        fail_x = qg;
        if (qg) {
            assert_true(hs_sim_step(s, &peer) < 0);
            printf("# qg round with a failed copy of x: %s\n", hs_error_message());
        } else {
            assert_int_equal(hs_sim_step(s, &peer), 0);
            /* x as a gossip leaves it: changed on the device (a round's close may have
             * copied it already). */
            for (int i = 0; i < 4; i++) (void)hs_trainer_gossip_x(hs_sim_trainer(s, i));
            fail_x = 1;
            assert_int_equal(hs_sim_consensus(s, &cons, NULL), HS_ECUDA);
            assert_null(hs_trainer_x(t));
            assert_null(hs_trainer_eval_x(t));
            assert_int_equal(hs_trainer_save(t, b), HS_ECUDA);
            assert_int_equal(hs_trainer_snapshot(t, b), HS_ECUDA);
            assert_int_equal(hs_trainer_write_params(t, "/nonexistent/x"), HS_ECUDA);
            fail_x = 0; /* the copy works again: x is there */
            assert_non_null(hs_trainer_x(t));
        }
        fail_x = 0;
        x_bytes = 0;
        hs_sim_free(s);
    }
    hs_buf_unref(b);
    hs_dataset_free(ds);
}

/* The divergence guard's scale, which a node reads after every round (node.c's node_end, the
 * trainer's hs__trainer_eval_ms in peer.c): with x changed on the device it is summed there, no
 * copy of x comes to the host, and it is the mean square of the host's evaluation point (the
 * same bits on the reference device; within the double sums' rounding on a GPU). CHOCO gossips
 * the parameters themselves, SGP an x beside them (the guard's is z = x / w). */
static void test_guard_scale_on_device(void **state) {
    (void)state;
    hs_dataset *ds = sim_data();
    const hs_algo_kind kinds[] = {HS_ALGO_CHOCO, HS_ALGO_SGP};
    for (int k = 0; k < 2; k++) {
        sim_kind = kinds[k];
        hs_sim *s = new_sim(dev, NULL, ds, HS_MOMENTUM_LOCAL);
        size_t d = hs_trainer_dim(hs_sim_trainer(s, 0));
        x_bytes = sizeof(float) * d;
        for (int r = 0; r < 3; r++) {
            int peer;
            if (hs_sim_step(s, &peer) < 0) fail_msg("round %d: %s", r, hs_error_message());
            double ms[4];
            x_downloads = 0;
            for (int i = 0; i < 4; i++) {
                /* x as a gossip leaves it: changed on the device. */
                (void)hs_trainer_gossip_x(hs_sim_trainer(s, i));
                assert_int_equal(hs__trainer_eval_ms(hs_sim_trainer(s, i), &ms[i]), 0);
            }
            if (x_downloads)
                fail_msg("%s round %d: the guard's scale of 4 peers copied x to the host %d "
                         "times", hs_algo_kind_name(sim_kind), r, x_downloads);
            for (int i = 0; i < 4; i++) {
                const float *z = hs_trainer_eval_x(hs_sim_trainer(s, i));
                assert_non_null(z);
                double want = hs__sum_sq(z, d) / (double)d;
                if (reference ? ms[i] != want
                              : !(fabs(ms[i] - want) <= (double)d * 0x1p-52 * want))
                    fail_msg("%s round %d, peer %d: device %.17g, host %.17g",
                             hs_algo_kind_name(sim_kind), r, i, ms[i], want);
            }
        }
        printf("# %s: the guard's scale of 4 device peers in 3 rounds without copying x\n",
               hs_algo_kind_name(sim_kind));
        x_bytes = 0;
        hs_sim_free(s);
    }
    sim_kind = HS_ALGO_CHOCO;
    hs_dataset_free(ds);
}

/* One simulated job with peers 1 and 2 on the device and 0 and 3 on the CPU backend
 * (hs_sim_cfg.peer_be) against the all-CPU job. On the reference device the two are equal bit
 * for bit. On a GPU the local steps' kernels round differently from the CPU's (the gossip is
 * bit-exact: test_choco_mixed_job), so the jobs agree within that rounding: every x within
 * 1e-3 of the all-CPU job's, and the consensus distance within 5% of it. */
static void test_sim_mixed_peers(void **state) {
    (void)state;
    hs_dataset *ds = sim_data();
    hs_backend *cpu;
    hs_backend_cfg bc = {1, 0};
    assert_int_equal(hs_backend_open(&cpu, HS_DEVICE_CPU, &bc), 0);
    hs_backend *const peers[4] = {cpu, dev, dev, cpu};
    size_t d, d2;
    double cm, cc;
    float *xm = run_sim(cpu, peers, ds, HS_MOMENTUM_LOCAL, &d, &cm);
    float *xc = run_sim(cpu, NULL, ds, HS_MOMENTUM_LOCAL, &d2, &cc);
    assert_int_equal(d, d2);
    double worst = 0;
    for (size_t j = 0; j < 4 * d; j++) {
        if (reference && hs_cw_bits(xc[j]) != hs_cw_bits(xm[j]))
            fail_msg("peer %zu, element %zu: all-CPU job %a, mixed job %a", j / d, j % d,
                     (double)xc[j], (double)xm[j]);
        double e = fabs((double)xc[j] - (double)xm[j]);
        if (!(e <= worst)) worst = e;
    }
    printf("# mixed sim (peers 1, 2 on the device): consensus %.6g, all-CPU %.6g; largest "
           "difference of x %.3g\n", cm, cc, worst);
    if (!(worst <= 1e-3)) fail_msg("mixed job's x differs from the all-CPU job's by %g", worst);
    if (!(fabs(cm - cc) <= 0.05 * cc)) fail_msg("consensus %g, all-CPU %g", cm, cc);
    free(xm);
    free(xc);
    hs_backend_close(cpu);
    hs_dataset_free(ds);
}

/* Each test starts without a restart: a failed one may have left reload_at set. */
static int fresh(void **state) {
    (void)state;
    reload_at = 0;
    leave_at = 0;
    fail_pull_at = 0;
    return 0;
}

static void test_momentum_mixed_peers(void **state); /* below */
static void test_optim_on_device(void **state);

int main(int argc, char **argv) {
    int rc = gossip_test_open(argc, argv, &dev, &reference);
    if (rc != 0) return rc;
    round_job_instrument(dev);
    printf("# CHOCO, BEER, DCD, SGP and D-PSGD rounds with peers on %s and on the host\n",
           dev->description);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_choco_mixed_job, fresh),
        cmocka_unit_test_setup(test_other_algos_mixed_job, fresh),
        cmocka_unit_test_setup(test_dpsgd_one_neighbour, fresh),
        cmocka_unit_test_setup(test_reload_mid_job, fresh),
        cmocka_unit_test_setup(test_full_replicas, fresh),
        cmocka_unit_test_setup(test_neighbour_leaves, fresh),
        cmocka_unit_test_setup(test_time_varying, fresh),
        cmocka_unit_test_setup(test_decode_failure_surfaces, fresh),
        cmocka_unit_test_setup(test_host_path_stays, fresh),
        cmocka_unit_test_setup(test_sim_on_device, fresh),
        cmocka_unit_test_setup(test_x_copy_fails, fresh),
        cmocka_unit_test_setup(test_guard_scale_on_device, fresh),
        cmocka_unit_test_setup(test_sim_mixed_peers, fresh),
        cmocka_unit_test_setup(test_momentum_mixed_peers, fresh),
        cmocka_unit_test_setup(test_optim_on_device, fresh),
    };
    int failed = cmocka_run_group_tests_name("cuda-round", tests, NULL, NULL);
    round_job_uninstrument(dev);
    hs_backend_close(dev);
    return failed ? 1 : 0;
}

/* ------------------------------------------------ quasi-global and hybrid momentum, mixed */

/* One 6-round job of new_sim with momentum mk, peers on peer_be (NULL: all on be). x_rounds
 * receives every peer's x after each round (6 * 4 * d floats), saved[i] peer i's checkpoint at
 * the end (hs_trainer_save: x, the optimizer's state vectors, the algorithm's state). With
 * resume, every peer checkpoints after round 1 and goes back to it after round 3, as a job
 * resuming from an older checkpoint does: the state on the device (both of hybrid's vectors)
 * must become the checkpoint's for the job to go on with the bits of the same resume on the
 * host. (A resumed job is not the bits of one that never stopped, on the host too: CHOCO
 * rebuilds its mix from the loaded replicas.) */
static size_t mom_job(hs_backend *be, hs_backend *const *peer_be, const hs_dataset *ds,
                      hs_momentum_kind mk, int resume, float **x_rounds, hs_buf **saved) {
    hs_sim *s = new_sim(be, peer_be, ds, mk);
    size_t d = hs_trainer_dim(hs_sim_trainer(s, 0));
    *x_rounds = malloc(sizeof(float) * 6 * 4 * d);
    assert_non_null(*x_rounds);
    hs_buf *early[4] = {0};
    for (int r = 0; r < 6; r++) {
        int peer;
        if (hs_sim_step(s, &peer) < 0) fail_msg("round %d: %s", r, hs_error_message());
        for (int i = 0; i < 4; i++) {
            hs_trainer *t = hs_sim_trainer(s, i);
            const float *x = hs_trainer_x(t);
            if (!x) fail_msg("round %d, peer %d: x: %s", r, i, hs_error_message());
            memcpy(*x_rounds + ((size_t)r * 4 + (size_t)i) * d, x, sizeof(float) * d);
            if (resume && r == 1) {
                assert_int_equal(hs_buf_new(&early[i], 64), 0);
                if (hs_trainer_save(t, early[i]) < 0)
                    fail_msg("save, peer %d: %s", i, hs_error_message());
            }
            if (resume && r == 3 && hs_trainer_load(t, early[i]->data, early[i]->len, 1) < 0)
                fail_msg("resume of peer %d: %s", i, hs_error_message());
        }
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(hs_buf_new(&saved[i], 64), 0);
        if (hs_trainer_save(hs_sim_trainer(s, i), saved[i]) < 0)
            fail_msg("final save, peer %d: %s", i, hs_error_message());
        if (early[i]) hs_buf_unref(early[i]);
    }
    hs_sim_free(s);
    return d;
}

/* CHOCO top-5% fp16 with hybrid momentum (the heavy ball plus the gossip's share of the round,
 * two state vectors on the device; the default before sign:512), and with quasi-global
 * momentum, peers 1 and 2 on the device and 0 and 3 on the CPU backend, against the all-CPU
 * job, after every round and in the saved checkpoints; both resume mid-way, the device peers
 * through the device path (mom_job). On the reference device the two are the same bits; on a
 * GPU the local steps round differently (test_sim_mixed_peers), so x agrees within 1e-3 there.
 * All on the device, hybrid copies two vectors of d floats to the host per peer and round, x
 * for the round's close and x after the local steps for the gossip's share (hybrid_round_end). */
static void test_momentum_mixed_peers(void **state) {
    (void)state;
    hs_dataset *ds = sim_data();
    hs_backend *cpu;
    hs_backend_cfg bc = {1, 0};
    assert_int_equal(hs_backend_open(&cpu, HS_DEVICE_CPU, &bc), 0);
    hs_backend *const peers[4] = {cpu, dev, dev, cpu};
    const char *saved_compress = sim_compress;
    sim_compress = "topk:0.05:fp16";
    sim_steps = 13; /* every round's steps move x (2 local steps a round) */
    const hs_momentum_kind kinds[] = {HS_MOMENTUM_HYBRID, HS_MOMENTUM_QG};
    for (int k = 0; k < 2; k++) {
        const char *name = hs_momentum_kind_name(kinds[k]);
        float *xm, *xc;
        hs_buf *sm[4], *sc[4];
        size_t d = mom_job(cpu, peers, ds, kinds[k], 1, &xm, sm);
        assert_int_equal(mom_job(cpu, NULL, ds, kinds[k], 1, &xc, sc), d);
        double worst = 0;
        for (size_t j = 0; j < 6 * 4 * d; j++) {
            if (!isfinite(xm[j])) fail_msg("%s: element %zu of the mixed job is %g", name, j,
                                           (double)xm[j]);
            if (reference && hs_cw_bits(xc[j]) != hs_cw_bits(xm[j]))
                fail_msg("%s: round %zu, peer %zu, element %zu: all-CPU job %a, mixed job %a",
                         name, j / (4 * d), j / d % 4, j % d, (double)xc[j], (double)xm[j]);
            double e = fabs((double)xc[j] - (double)xm[j]);
            if (!(e <= worst)) worst = e;
        }
        for (int i = 0; i < 4; i++) {
            if (sm[i]->len != sc[i]->len ||
                (reference && memcmp(sm[i]->data, sc[i]->data, sm[i]->len)))
                fail_msg("%s: peer %d's checkpoint (%zu bytes) differs from the all-CPU job's "
                         "(%zu bytes)", name, i, sm[i]->len, sc[i]->len);
            hs_buf_unref(sm[i]);
            hs_buf_unref(sc[i]);
        }
        printf("# CHOCO %s, momentum %s, peers 1, 2 on the device, back to round 1 after round 3: "
               "largest difference of x from the all-CPU job %.3g%s\n", sim_compress, name,
               worst, reference ? ", checkpoints the same bytes" : "");
        if (!(worst <= 1e-3)) fail_msg("%s: mixed job's x differs by %g", name, worst);
        free(xm);
        free(xc);
    }
    hs_sim *s = new_sim(dev, NULL, ds, HS_MOMENTUM_HYBRID);
    x_bytes = sizeof(float) * hs_trainer_dim(hs_sim_trainer(s, 0));
    x_downloads = 0;
    for (int r = 0; r < 6; r++) {
        int peer;
        if (hs_sim_step(s, &peer) < 0) fail_msg("round %d: %s", r, hs_error_message());
    }
    printf("# sim on the device, choco, momentum hybrid: %d downloads of d floats in 6 rounds "
           "of 4 peers\n", x_downloads);
    assert_int_equal(x_downloads, 2 * 4 * 6);
    x_bytes = 0;
    hs_sim_free(s);
    sim_compress = saved_compress;
    sim_steps = 6;
    hs_backend_close(cpu);
    hs_dataset_free(ds);
}

/* The optimizer's device path alone (hs_optim_step, hs_optim_round_end: sgd_step, axpby and
 * the copies, all without fused multiply-adds), without the model's kernels, whose rounding
 * differs on a GPU: hybrid and quasi-global momentum on dev and on the CPU backend, fed the
 * same gradients and the same gossip's change of x over 5 rounds of 2 local steps (weight
 * decay, a warm-up and a cosine schedule, so that lr changes each step), leave x and every
 * state vector the same bits, on any device. */
static float noise(uint32_t *s) { /* in [-0.5, 0.5): xorshift32 */
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return (float)(*s >> 8) * 0x1p-24f - 0.5f;
}

static void test_optim_on_device(void **state) {
    (void)state;
    hs_backend *cpu;
    hs_backend_cfg bc = {1, 0};
    assert_int_equal(hs_backend_open(&cpu, HS_DEVICE_CPU, &bc), 0);
    float *xc = malloc(sizeof(float) * D), *g = malloc(sizeof(float) * D);
    float *xh = malloc(sizeof(float) * D), *vh = malloc(sizeof(float) * D);
    assert_true(xc && g && xh && vh);
    const hs_momentum_kind kinds[] = {HS_MOMENTUM_HYBRID, HS_MOMENTUM_QG};
    for (int k = 0; k < 2; k++) {
        hs_optim_cfg oc;
        hs_optim_cfg_default(&oc);
        oc.momentum_kind = kinds[k];
        oc.weight_decay = 1e-3f;
        oc.warmup_steps = 3;
        oc.total_steps = 12;
        hs_optim *on_cpu, *on_dev;
        float *xd, *gd;
        assert_int_equal(hs_optim_new(&on_cpu, cpu, D, &oc), 0);
        assert_int_equal(hs_optim_new(&on_dev, dev, D, &oc), 0);
        assert_int_equal(hs_be_alloc_f(dev, D, &xd), 0);
        assert_int_equal(hs_be_alloc_f(dev, D, &gd), 0);
        uint32_t seed = 21;
        for (size_t j = 0; j < D; j++) xc[j] = noise(&seed);
        assert_int_equal(hs_be_upload(dev, xd, xc, sizeof(float) * D), 0);
        long t = 0;
        for (int r = 0; r < 5; r++) {
            assert_int_equal(hs_optim_round_begin(on_cpu, xc), 0);
            assert_int_equal(hs_optim_round_begin(on_dev, xc), 0); /* x's host copy: the same */
            for (int s = 0; s < 2; s++, t++) {
                for (size_t j = 0; j < D; j++) g[j] = noise(&seed);
                assert_int_equal(hs_be_upload(dev, gd, g, sizeof(float) * D), 0);
                assert_int_equal(hs_optim_step(on_cpu, xc, g, t, NULL), 0);
                assert_int_equal(hs_optim_step(on_dev, xd, gd, t, NULL), 0);
            }
            /* The gossip's change of x, on each side's x; the device's host copy for the
             * round's close, as the trainer makes it. */
            assert_int_equal(hs_be_download(dev, xh, xd, sizeof(float) * D), 0);
            for (size_t j = 0; j < D; j++) {
                float dx = 0.05f * noise(&seed);
                xc[j] += dx;
                xh[j] += dx;
            }
            assert_int_equal(hs_be_upload(dev, xd, xh, sizeof(float) * D), 0);
            assert_int_equal(hs_optim_round_end(on_cpu, xc), 0);
            assert_int_equal(hs_optim_round_end(on_dev, xh), 0);
            assert_int_equal(hs_optim_nstate(on_dev), kinds[k] == HS_MOMENTUM_HYBRID ? 2 : 1);
            for (int i = -1; i < hs_optim_nstate(on_dev); i++) {
                const float *want = i < 0 ? xc : hs_optim_state(on_cpu, i);
                const float *got = i < 0 ? xd : hs_optim_state(on_dev, i);
                assert_int_equal(hs_be_download(dev, vh, got, sizeof(float) * D), 0);
                for (size_t j = 0; j < D; j++)
                    if (hs_cw_bits(vh[j]) != hs_cw_bits(want[j]))
                        fail_msg("%s, round %d, %s%d, element %zu: CPU %a, device %a",
                                 hs_momentum_kind_name(kinds[k]), r, i < 0 ? "x" : "state ",
                                 i < 0 ? 0 : i, j, (double)want[j], (double)vh[j]);
            }
        }
        printf("# optimizer, momentum %s: x and %d state vectors the CPU's bits after 5 "
               "rounds\n", hs_momentum_kind_name(kinds[k]), hs_optim_nstate(on_dev));
        hs_be_free(dev, xd);
        hs_be_free(dev, gd);
        hs_optim_free(on_cpu);
        hs_optim_free(on_dev);
    }
    free(xc);
    free(g);
    free(xh);
    free(vh);
    hs_backend_close(cpu);
}
