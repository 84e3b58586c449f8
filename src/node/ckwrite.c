/* This peer's checkpoint files as the node writes them (hearsay/checkpoint.h): the owner's
 * state, with the members it knows now to rejoin through. Reading them back for --resume is
 * resume.c's. */
#include <stdlib.h>

#include "core/error_internal.h"
#include "core/log.h"
#include "node/node_internal.h"

int hs__node_ck_write(const hs__node_model *m, hs_net *net, const hs_checkpoint_info *base,
                      const char *dir) {
    hs_buf *state = NULL;
    hs_net_member *mem = NULL;
    uint32_t *ids = NULL;
    const char **addrs = NULL;
    int nm = 0, err;
    if ((err = hs_buf_new(&state, 0)) < 0) return err;
    if ((err = m->save(m->ctx, state)) < 0) goto out;
    if (net && hs_net_members(net, &mem, &nm, NULL, NULL) < 0) nm = 0;
    if (nm && (!(ids = calloc((size_t)nm, sizeof(*ids))) ||
               !(addrs = calloc((size_t)nm, sizeof(*addrs))))) {
        err = hs__err(HS_ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    for (int i = 0; i < nm; i++) {
        ids[i] = mem[i].id;
        addrs[i] = mem[i].addr;
    }
    hs_checkpoint_info info = *base;
    info.n_members = nm;
    info.member_ids = ids;
    info.member_addrs = addrs;
    size_t bytes = 0;
    if ((err = hs_checkpoint_write(dir, &info, state->data, state->len, &bytes)) == 0)
        HS_LOGI("checkpoint of round %llu in %s (%zu bytes)", (unsigned long long)info.round, dir,
                bytes);
out:
    free(ids);
    free(addrs);
    free(mem);
    hs_buf_unref(state);
    return err;
}
