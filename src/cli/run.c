/* hearsay run: one peer of a decentralized job on the network. The first peer of a job starts
 * without --bootstrap; every other joins through any member's address. SIGINT/SIGTERM finish
 * the current round, send BYE and exit 0 (SIGTERM writes a checkpoint first when
 * --checkpoint-dir is set: the signal a scheduler sends before preemption). A signal before
 * training began (waiting for the rendezvous or for the other peers) ends the peer at once
 * with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM). */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/precheck.h"
#include "cli/runopts.h"
#include "core/log.h"
#include "hearsay/checkpoint.h"
#include "hearsay/error.h"
#include "hearsay/peer.h"
#include "node/node_internal.h"

enum {
    R_LISTEN = 256,
    R_ADVERTISE,
    R_BOOTSTRAP,
    R_SECRET,
    R_CA,
    R_CERT,
    R_KEY,
    R_INSECURE,
    R_RUN_ID,
    R_EMULATE,
    R_MAX_FRAME,
    R_PEER_TIMEOUT,
    R_JOIN_TIMEOUT,
    R_WORLD,
    R_WAIT_PEERS,
    R_CK_DIR,
    R_CK_EVERY,
    R_RESUME,
    R_SAVE,
    R_RANK,
    R_RENDEZVOUS,
    R_HANDSHAKE_TIMEOUT,
    R_MAX_PENDING,
    R_MAX_PENDING_ADDR,
};

const hs_cli_opt hs_run_opts_table[] = {
    {"listen", R_LISTEN, "HOST:PORT", "address to listen on (default: 127.0.0.1:0, any port)"},
    {"advertise", R_ADVERTISE, "HOST:PORT", "address other peers dial (default: the listen address)"},
    {"bootstrap", R_BOOTSTRAP, "HOST:PORT", "join a running job through any member's address"},
    {"secret-file", R_SECRET, "FILE", "the run's shared secret: TLS 1.3 with a pre-shared key"},
    {"ca", R_CA, "FILE", "CA certificate (PEM): TLS 1.3 with certificates, mutual authentication"},
    {"cert", R_CERT, "FILE", "this peer's certificate (PEM), signed by --ca"},
    {"key", R_KEY, "FILE", "this peer's private key (PEM)"},
    {"insecure", R_INSECURE, NULL, "plain TCP, no authentication or encryption"},
    {"run-id", R_RUN_ID, "ID", "name of the job; peers of other jobs are refused (default: hearsay)"},
    {"emulate", R_EMULATE, "SPEC", "emulate WAN links: delay=50ms,jitter=10ms,rate=10mbit,loss=0.01"},
    {"max-frame", R_MAX_FRAME, "BYTES",
     "largest message in one frame; larger ones travel in 4 MiB parts (default: 64 MiB)"},
    {"peer-timeout", R_PEER_TIMEOUT, "MS", "silence before a neighbour is declared gone (default: 1500)"},
    {"join-timeout", R_JOIN_TIMEOUT, "MS",
     "how long to try to join, to wait for the peers before the first round, to reach the job "
     "when cut off and to rejoin when removed (default: " HS__NODE_STR(HS__NODE_JOIN_TIMEOUT_MS)
     ")"},
    {"handshake-timeout", R_HANDSHAKE_TIMEOUT, "MS",
     "an incoming connection must finish TLS and HELLO within this (default: 2000)"},
    {"max-pending", R_MAX_PENDING, "N",
     "unauthenticated connections held at once; members never count (default: 256)"},
    {"max-pending-per-addr", R_MAX_PENDING_ADDR, "N",
     "unauthenticated connections from one IP address (default: 16)"},
    {"world", R_WORLD, "N",
     "number of data shards, and of peers the job waits for before its first round (default: "
     "1, or the launcher's task count)"},
    {"rank", R_RANK, "R", "this peer's shard, 0..N-1 (default: peer id mod N, or the task rank)"},
    {"rendezvous", R_RENDEZVOUS, "FILE",
     "shared file through which peers find each other: rank 0 writes its address, the others "
     "join it in rank order (so peer ids, and places in the topology, follow --rank)"},
    {"wait-peers", R_WAIT_PEERS, "N",
     "start training once N peers are members; 0 or 1: at once (default: --world's N for a new "
     "job; a joiner of a job still waiting waits with it, by the job's count; one joining a "
     "running job or resuming waits only when given this)"},
    {"slowdown", RO_SLOWDOWN, "F", "compute F times slower (a straggler, for experiments)"},
    {"checkpoint-dir", R_CK_DIR, "DIR", "write checkpoints to DIR"},
    {"checkpoint-every", R_CK_EVERY, "K",
     "rounds between checkpoints (default: " HS__NODE_STR(HS__NODE_CHECKPOINT_EVERY) ")"},
    {"resume", R_RESUME, "[=require]",
     "continue from this shard's newest checkpoint of the job's timeline and rejoin; without "
     "one, start as a new peer (said in the log); =require: exit 2 without one"},
    {"save", R_SAVE, "FILE", "write the final model to FILE (raw float32); {id} becomes the peer id"},
    {NULL, 0, NULL, NULL},
};

typedef struct run_args {
    hs_runopts ro;
    hs_net_config net;
    int security_set, insecure;
    int world, wait_peers;
    const char *emulate;
    const char *ck_dir;
    long ck_every;
    int resume;
    const char *save;
    int rank, world_set, wait_set, wait_env, listen_set, run_id_set;
    const char *rendezvous;
    char env_run_id[128], env_rendezvous[4096];
} run_args;

static int handle(void *ctx, int key, const char *v) {
    run_args *a = ctx;
    int rc = hs__runopts_handle(&a->ro, key, v);
    if (rc != 1) return rc;
    long l;
    switch (key) {
    case R_LISTEN:
        a->listen_set = 1;
        a->net.listen = v;
        return 0;
    case R_ADVERTISE: a->net.advertise = v; return 0;
    case R_BOOTSTRAP: a->net.bootstrap = v; return 0;
    case R_SECRET: a->net.secret_file = v; return 0;
    case R_CA: a->net.ca_file = v; return 0;
    case R_CERT: a->net.cert_file = v; return 0;
    case R_KEY: a->net.key_file = v; return 0;
    case R_INSECURE: a->insecure = 1; return 0;
    case R_RUN_ID:
        a->run_id_set = 1;
        a->net.run_id = v;
        return 0;
    case R_EMULATE: a->emulate = v; return 0;
    case R_MAX_FRAME:
        if ((rc = hs__cli_long("--max-frame", v, 1024, 256L << 20, &l)) < 0) return rc;
        a->net.max_frame = (size_t)l;
        return 0;
    case R_PEER_TIMEOUT: return hs__cli_int("--peer-timeout", v, 100, 3600000, &a->net.peer_timeout_ms);
    case R_JOIN_TIMEOUT: return hs__cli_int("--join-timeout", v, 100, 3600000, &a->net.join_timeout_ms);
    case R_HANDSHAKE_TIMEOUT:
        return hs__cli_int("--handshake-timeout", v, 100, 3600000, &a->net.handshake_timeout_ms);
    case R_MAX_PENDING: return hs__cli_int("--max-pending", v, 1, 1 << 20, &a->net.max_conns);
    case R_MAX_PENDING_ADDR:
        return hs__cli_int("--max-pending-per-addr", v, 1, 1 << 20, &a->net.max_conns_per_addr);
    case R_WORLD:
        a->world_set = 1;
        return hs__cli_int("--world", v, 1, 1 << 20, &a->world);
    case R_WAIT_PEERS:
        a->wait_set = 1;
        return hs__cli_int("--wait-peers", v, 0, 1 << 20, &a->wait_peers);
    case R_RANK: return hs__cli_int("--rank", v, 0, 1 << 20, &a->rank);
    case R_RENDEZVOUS: a->rendezvous = v; return 0;
    case R_CK_DIR: a->ck_dir = v; return 0;
    case R_CK_EVERY: return hs__cli_long("--checkpoint-every", v, 1, 1L << 40, &a->ck_every);
    case R_RESUME:
        if (v && strcmp(v, "require") != 0)
            return hs__cli_usage_error("--resume=%s: expected --resume or --resume=require", v);
        a->resume = v ? HS__NODE_RESUME_REQUIRE : 1;
        return 0;
    case R_SAVE: a->save = v; return 0;
    }
    return hs__cli_usage_error("internal: unhandled option %d", key);
}

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) {
    if (!stop_signal) stop_signal = sig;
    hs_peer_request_stop(sig == SIGTERM);
}

static const char *env_first(const char *a, const char *b, const char *c) {
    const char *v = getenv(a);
    if (!v && b) v = getenv(b);
    if (!v && c) v = getenv(c);
    return v && *v ? v : NULL;
}

/* The launcher's id of this job (one srun step, one mpirun), the same in every task and
 * different for the next job: it names the run and the rendezvous file, so a file left by
 * another job is never read. Written into out with only [A-Za-z0-9._-]. */
static void launcher_job_id(int slurm, char *out, size_t cap) {
    char raw[200] = "";
    const char *job;
    if (slurm) {
        /* Several sruns in one allocation share the job id; each is its own step. */
        const char *step = env_first("SLURM_STEP_ID", "SLURM_STEPID", NULL);
        job = env_first("SLURM_JOB_ID", "SLURM_JOBID", NULL);
        if (job) snprintf(raw, sizeof(raw), "%s%s%s", job, step ? "." : "", step ? step : "");
    } else {
        /* Open MPI 4 (ess_base_jobid), Open MPI 2-3 (orte_ess_jobid), PMIx (Open MPI 5, or
         * srun --mpi=pmix): the namespace names the job. */
        job = env_first("OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE");
        if (job) snprintf(raw, sizeof(raw), "%s", job);
    }
    if (!raw[0]) snprintf(raw, sizeof(raw), "job");
    size_t i = 0;
    for (; raw[i] && i + 1 < cap; i++) {
        char c = raw[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '-' || c == '_';
        out[i] = ok ? c : '_';
    }
    out[i] = '\0';
}

/* Under srun (SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_ID) or mpirun (OMPI_COMM_WORLD_RANK/SIZE,
 * PMI_RANK/PMI_SIZE) every task runs the same command line: the rank, the shard count, the
 * run id and the way to find each other come from the environment. Flags win. mpirun's
 * variables come first: an mpirun inside a Slurm allocation inherits the batch step's
 * SLURM_PROCID, the same in every task. */
static int from_launcher_env(run_args *a) {
    const char *rank = env_first("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID");
    const char *size = env_first("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS");
    if (!rank || !size) return 0;
    int r, n, rc;
    if ((rc = hs__cli_int("rank from the environment", rank, 0, 1 << 20, &r)) < 0 ||
        (rc = hs__cli_int("task count from the environment", size, 1, 1 << 20, &n)) < 0)
        return rc;
    if (r >= n) return hs__cli_usage_error("task rank %d is not below the task count %d", r, n);
    char job[100];
    launcher_job_id(!env_first("OMPI_COMM_WORLD_RANK", NULL, NULL) && getenv("SLURM_PROCID"), job,
                    sizeof(job));
    if (a->rank < 0) a->rank = r;
    if (!a->world_set) a->world = n;
    /* Every task of the job starts (or resumes) together: wait for all, resumed or not. */
    if (!a->wait_set) {
        a->wait_peers = n;
        a->wait_env = 1;
    }
    if (!a->run_id_set) {
        snprintf(a->env_run_id, sizeof(a->env_run_id), "hearsay-%s", job);
        a->net.run_id = a->env_run_id;
    }
    if (!a->net.bootstrap && !a->rendezvous) {
        const char *rv = getenv("HEARSAY_RENDEZVOUS");
        if (rv && *rv)
            snprintf(a->env_rendezvous, sizeof(a->env_rendezvous), "%s", rv);
        else
            snprintf(a->env_rendezvous, sizeof(a->env_rendezvous), "hearsay-%s.addr", job);
        a->rendezvous = a->env_rendezvous;
    }
    if (!a->listen_set) {
        const char *l = getenv("HEARSAY_LISTEN");
        a->net.listen = l && *l ? l : "0.0.0.0:0";
    }
    HS_LOGI("task %d of %d from the launcher's environment: run %s, rendezvous %s", a->rank, n,
            a->net.run_id, a->rendezvous ? a->rendezvous : "-");
    return 0;
}

int hs__cmd_run(int argc, char **argv) {
    run_args a;
    memset(&a, 0, sizeof(a));
    hs__runopts_default(&a.ro);
    /* The node's defaults (hearsay/node.h), so that `run` and a library node agree. */
    hs__node_cfg dc;
    hs__node_cfg_defaults(&dc);
    a.net = dc.net;
    a.world = dc.world;
    a.ck_every = dc.checkpoint_every;
    a.rank = dc.rank;
    const hs_cli_opt *tables[] = {hs_run_opts_table, hs_runopts_table, NULL};
    int rc = hs__cli_expand_config(&argc, &argv, tables);
    if (rc < 0) return -rc;
    rc = hs__cli_parse(argc, argv, "run", "[options]",
                          "Run one peer of a decentralized training job. Start the first peer "
                          "without --bootstrap; start the others with --bootstrap HOST:PORT of "
                          "any member. The job trains --rounds rounds from its first round, as "
                          "the peer that started it says: joiners end with it whatever their own "
                          "--rounds. SIGINT/SIGTERM finish the round, send BYE and exit 0; while "
                          "still waiting to start they exit 130/143 at once. A --listen address "
                          "in use exits 2.",
                          tables, handle, &a, NULL, 0, NULL);
    if (rc == 1) return HS_EXIT_OK;
    if (rc < 0) return -rc;
    if ((rc = hs__runopts_finish(&a.ro)) < 0) return -rc;
    /* --quiet: the final summary, warnings and errors; the node would quiet the log too, but
     * only once it exists, after this command's own info lines. */
    if (a.ro.quiet) hs__log_quiet();
    if ((rc = from_launcher_env(&a)) < 0) return -rc;
    /* A rank outside the shards would silently train on another peer's shard (rank mod N). */
    if (a.rank >= a.world)
        return -hs__cli_usage_error("--rank %d is outside 0..%d (--world %d)", a.rank,
                                   a.world - 1, a.world);
    int modes = (a.net.secret_file != NULL) + (a.net.ca_file || a.net.cert_file || a.net.key_file) + a.insecure;
    if (modes != 1)
        return -hs__cli_usage_error(modes ? "choose one of --secret-file, --ca/--cert/--key and --insecure"
                                         : "no security mode: give --secret-file FILE, or --ca, "
                                           "--cert and --key, or --insecure for plain TCP");
    if (a.net.ca_file || a.net.cert_file || a.net.key_file) {
        if (!a.net.ca_file || !a.net.cert_file || !a.net.key_file)
            return -hs__cli_usage_error("certificates need all of --ca, --cert and --key");
        a.net.security = HS_NET_CERT;
    } else if (a.insecure) {
        a.net.security = HS_NET_INSECURE;
    } else {
        a.net.security = HS_NET_SECRET;
    }
    if (a.emulate && hs_net_emulation_parse(a.emulate, &a.net.emulate) < 0)
        return -hs__cli_usage_error("--emulate: %s", hs_error_message());
    double slow = 1.0;
    if (a.ro.slowdown && (rc = hs__cli_double("--slowdown", a.ro.slowdown, 1.0, 1e6, &slow)) < 0)
        return -rc;
    if (a.resume && !a.ck_dir) return -hs__cli_usage_error("--resume needs --checkpoint-dir");
    /* Where results go is checked before any data is loaded: a run must not train for hours
     * to find that it cannot write its checkpoints or its model. */
    if (a.ck_dir && hs_checkpoint_dir_check(a.ck_dir) < 0)
        return -hs__cli_usage_error("%s", hs_error_message());
    if (a.save && (rc = hs__cli_check_out_path("--save", a.save)) < 0) return -rc;
    int job_n = a.wait_peers > 1 ? a.wait_peers : a.world > 1 ? a.world : 0;
    if ((rc = hs__cli_precheck(a.ro.model, a.ro.metrics, a.ro.topology, job_n, a.ro.seed)) < 0)
        return -rc;

    int exit_code = HS_EXIT_FAIL, err;
    hs_backend *be = NULL;
    hs_dataset *train = NULL, *test = NULL;
    if ((rc = hs__runopts_open(&a.ro, &be, &train, &test)) < 0) {
        exit_code = -rc;
        goto out;
    }
    hs_peer_cfg pc;
    memset(&pc, 0, sizeof(pc));
    pc.net = a.net;
    pc.net.topo_spec = a.ro.topology;
    pc.net.topo_seed = a.ro.seed;
    pc.net.seed = a.ro.seed;
    pc.algo = a.ro.algo;
    pc.partition = a.ro.partition;
    pc.world = a.world;
    pc.rank = a.rank;
    pc.rendezvous = a.rendezvous;
    size_t shard_n = train->n / (size_t)a.world;
    pc.rounds = hs__runopts_rounds(&a.ro, shard_n);
    long rpe = hs__runopts_rounds(&(hs_runopts){.batch = a.ro.batch, .epochs = 1,
                                               .local_steps = a.ro.local_steps},
                                 shard_n);
    pc.eval_every = a.ro.eval_every > 0 ? a.ro.eval_every : rpe;
    /* --world N alone: a new job waits for its N peers before round 0, or the first would
     * train alone while the others start. */
    pc.wait_peers = a.wait_set || a.wait_env ? a.wait_peers : a.world;
    pc.wait_new_only = !a.wait_set && !a.wait_env;
    pc.wait_timeout_ms =
        a.net.join_timeout_ms > 0 ? a.net.join_timeout_ms : HS__NODE_JOIN_TIMEOUT_MS;
    pc.slowdown = slow;
    pc.metrics = a.ro.metrics;
    pc.quiet = a.ro.quiet;
    pc.checkpoint_dir = a.ck_dir;
    pc.checkpoint_every = a.ck_every;
    pc.resume = a.resume;
    pc.save = a.save;
    hs__runopts_guard_cfg(&a.ro, rpe, &pc.guard);
    if ((rc = hs__runopts_trainer_cfg(&a.ro, train, pc.rounds, &pc.trainer)) < 0) {
        exit_code = -rc;
        goto out;
    }
    /* The topology at the job's size (its degree) is an input of the automatic CHOCO step;
     * every peer given the same options computes the same one. */
    char why[320];
    float gamma_c = hs__runopts_choco_step(&a.ro, job_n, hs_model_spec_nparams(&pc.trainer.model),
                                          why, sizeof(why));
    pc.algo.gap = a.ro.algo.gap;
    pc.algo.max_degree = a.ro.algo.max_degree;
    if (gamma_c > 0) {
        /* The guard's advice halves the step in use, not the 0 that means automatic. */
        pc.guard.gamma_c = gamma_c;
        char an[16];
        hs__cli_upper(an, sizeof(an), hs_algo_kind_name(a.ro.algo.kind));
        HS_LOGI("%s consensus step gamma_c %g (%s)", an, (double)gamma_c, why);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    hs_peer_result res;
    if ((err = hs_peer_run(&pc, be, train, test, &res)) < 0) {
        /* The --listen address is taken or not this host's: a usage problem like a bad flag. */
        int addr_err = err == -EADDRINUSE || err == -EADDRNOTAVAIL || err == -EACCES;
        fprintf(stderr, "hearsay run: %s%s\n", hs_error_message(),
                err == -EADDRINUSE ? " (another process listens there: choose another --listen "
                                     "port, or port 0 for any free one)"
                                   : "");
        exit_code = (err == HS_EMISMATCH || err == HS_EAUTH || err == HS_EINVAL || err == HS_ETLS ||
                     err == HS_ENOENT || err == HS_ENOTSUP || addr_err)
                        ? HS_EXIT_USAGE
                        : HS_EXIT_FAIL;
        /* Stopped before training began: nothing to save, the status says by which signal. */
        if (err == HS_EINTR) exit_code = 128 + (stop_signal ? (int)stop_signal : SIGINT);
        goto out;
    }
    if (res.diverged) {
        fprintf(stderr, "hearsay run: peer %u diverged at round %.0f: %s; %s\n", res.id,
                res.diverged_round, res.reason, res.advice);
        fflush(stderr);
    }
    printf("%s: peer %u test accuracy %.2f%% (loss %.4f), rounds %llu..%llu, %.2f MB sent, %.1f s\n",
           res.diverged ? "diverged" : res.stopped ? "stopped" : res.late ? "late" : "final", res.id, 100 * res.test_acc, res.test_loss,
           (unsigned long long)res.first_round, (unsigned long long)res.last_round,
           res.bytes_sent / 1e6, res.wall_s);
    fflush(stdout);
    exit_code = res.diverged ? HS_EXIT_DIVERGED : HS_EXIT_OK;
out:
    hs_dataset_free(train);
    hs_dataset_free(test);
    hs_backend_close(be);
    return exit_code;
}
