/* The runtime's configuration (net layer): defaults, the copy hs_net_start keeps (strings
 * owned, links' emulation, checks), and the topology file that fixes the number of peers.
 *
 * Threading: the application's thread before the loop starts; hs__net_topo_file also on the
 * loop thread when WELCOME names the run's topology. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/runtime.h"

const char *hs_net_security_name(hs_net_security s) {
    switch (s) {
    case HS_NET_SECRET:
        return "secret";
    case HS_NET_CERT:
        return "cert";
    case HS_NET_INSECURE:
        return "insecure";
    }
    return "?";
}

void hs_net_config_init(hs_net_config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen = "127.0.0.1:0";
    cfg->security = HS_NET_SECRET;
    cfg->run_id = "hearsay";
    cfg->model_sig = "";
    cfg->algo = "";
    cfg->codec = "";
    cfg->topo_spec = "ring";
    cfg->max_frame = 64u << 20;
    cfg->max_conns = 256;
    cfg->max_conns_per_addr = 16;
    cfg->handshake_timeout_ms = 2000;
    cfg->peer_timeout_ms = 1500;
    cfg->join_timeout_ms = 30000;
    cfg->snapshot_timeout_ms = HS_NET_SNAPSHOT_TIMEOUT_MS;
    cfg->change_rounds = 4;
    cfg->change_delay_ms = 300;
    cfg->tune_malloc = 1;
}

void hs_net_welcome_clear(hs_net_welcome *w) {
    if (!w)
        return;
    free(w->members);
    free(w->topo_spec);
    free(w->app_config);
    hs_buf_unref(w->snapshot);
    memset(w, 0, sizeof(*w));
}

static char *dup_or(const char *s, const char *dflt) {
    if (!s)
        s = dflt;
    return s ? strdup(s) : NULL;
}

int hs__net_copy_config(hs_net *net, const hs_net_config *in) {
    net->cfg = *in;
    hs_net_config *c = &net->cfg;
    if (!(net->s_listen = dup_or(in->listen, "127.0.0.1:0")) ||
        !(net->s_run = dup_or(in->run_id, "hearsay")) ||
        !(net->s_sig = dup_or(in->model_sig, "")) || !(net->s_algo = dup_or(in->algo, "")) ||
        !(net->s_codec = dup_or(in->codec, "")) || !(net->s_topo = dup_or(in->topo_spec, "ring")))
        return hs__err(HS_ENOMEM, "config: out of memory");
    if ((in->advertise && !(net->s_advertise = strdup(in->advertise))) ||
        (in->bootstrap && !(net->s_bootstrap = strdup(in->bootstrap))) ||
        (in->secret_file && !(net->s_secret = strdup(in->secret_file))) ||
        (in->ca_file && !(net->s_ca = strdup(in->ca_file))) ||
        (in->cert_file && !(net->s_cert = strdup(in->cert_file))) ||
        (in->key_file && !(net->s_key = strdup(in->key_file))) ||
        (in->app_config && !(net->s_app_config = strdup(in->app_config))))
        return hs__err(HS_ENOMEM, "config: out of memory");
    c->listen = net->s_listen;
    c->advertise = net->s_advertise;
    c->bootstrap = net->s_bootstrap;
    c->secret_file = net->s_secret;
    c->ca_file = net->s_ca;
    c->cert_file = net->s_cert;
    c->key_file = net->s_key;
    c->run_id = net->s_run;
    c->model_sig = net->s_sig;
    c->algo = net->s_algo;
    c->codec = net->s_codec;
    c->topo_spec = net->s_topo;
    c->app_config = net->s_app_config;
    if (in->n_link_emulate > 0) {
        if (!(net->link_emu = malloc((size_t)in->n_link_emulate * sizeof(*net->link_emu))))
            return hs__err(HS_ENOMEM, "config: out of memory");
        memcpy(net->link_emu, in->link_emulate,
               (size_t)in->n_link_emulate * sizeof(*net->link_emu));
    }
    c->link_emulate = net->link_emu;
    if (c->max_frame == 0)
        c->max_frame = 64u << 20;
    if (c->max_frame > HS__FRAME_CAP)
        return hs__err(HS_EINVAL, "max frame %zu is over the hard cap of %u bytes", c->max_frame,
                       HS__FRAME_CAP);
    if (c->max_message == 0)
        c->max_message = 24 * c->n_params > c->max_frame ? 24 * c->n_params : c->max_frame;
    if (c->max_message < c->max_frame)
        c->max_message = c->max_frame;
    if (c->max_message > HS__MSG_CAP)
        return hs__err(HS_EINVAL, "max message %llu is over the hard cap of %llu bytes",
                       (unsigned long long)c->max_message, (unsigned long long)HS__MSG_CAP);
    if (c->max_buffered == 0)
        c->max_buffered = 2 * c->max_frame + (1u << 20);
    if (c->max_buffered < c->max_frame + HS__HDR_LEN)
        return hs__err(HS_EINVAL, "max buffered %zu is below max frame %zu", c->max_buffered,
                       c->max_frame);
    if (c->max_conns <= 0)
        c->max_conns = 256;
    if (c->max_conns_per_addr <= 0)
        c->max_conns_per_addr = 16;
    if (c->handshake_timeout_ms <= 0)
        c->handshake_timeout_ms = 2000;
    if (c->peer_timeout_ms <= 0)
        c->peer_timeout_ms = 1500;
    if (c->heartbeat_ms <= 0)
        c->heartbeat_ms = c->peer_timeout_ms / 4;
    if (c->heartbeat_ms < 1)
        c->heartbeat_ms = 1;
    if (c->join_timeout_ms <= 0)
        c->join_timeout_ms = 30000;
    if (c->snapshot_timeout_ms <= 0)
        c->snapshot_timeout_ms = HS_NET_SNAPSHOT_TIMEOUT_MS;
    if (c->change_rounds <= 0)
        c->change_rounds = 4;
    if (c->change_delay_ms < 0)
        c->change_delay_ms = 0;
    for (size_t i = 0; i < strlen(net->s_run); i++)
        if (net->s_run[i] < 0x20 || net->s_run[i] > 0x7e)
            return hs__err(HS_EINVAL, "run id has a non-printable character");
    if (strlen(net->s_run) > HS__RUNID_MAX || strlen(net->s_sig) > HS__SIG_MAX ||
        strlen(net->s_algo) > HS__NAME_MAX || strlen(net->s_codec) > HS__NAME_MAX ||
        strlen(net->s_topo) > HS__SPEC_MAX)
        return hs__err(HS_EINVAL, "config: run id, model signature, algorithm, codec or topology "
                                  "string too long");
    return 0;
}

/* Topology files fix the number of peers (and so the ids that can join). */
int hs__net_topo_file(hs_net *net) {
    const char *s = net->s_topo;
    size_t n = strlen(s);
    hs_topo_free(net->topo_file);
    net->topo_file = NULL;
    net->mb.topo_spec = net->s_topo;
    net->mb.topo_file_n = 0;
    if (!strchr(s, '/') && !(n > 5 && !strcmp(s + n - 5, ".json")))
        return 0;
    int err = hs_topo_new(&net->topo_file, s, 0, net->cfg.topo_seed);
    if (err < 0)
        return err;
    net->mb.topo_file_n = hs_topo_n(net->topo_file);
    return 0;
}

