/* The one writer of checkpoint states and joiner snapshots (layouts in train/state.h), and the
 * reader of their common head. The parts after the head are read by their owners, which
 * validate everything before changing anything. */
#include <string.h>

#include "algo/algo_internal.h" /* hs__put_* and hs__get_* */
#include "core/error_internal.h"
#include "train/state.h"

static int put_body(hs_buf *out, const hs__state_parts *s) {
    int err;
    if ((err = hs__put_u64(out, s->d)) < 0 || (err = hs__put_u64(out, s->steps)) < 0 ||
        (err = hs_buf_append(out, s->model, sizeof(float) * s->d)) < 0)
        return err;
    return s->put_optim ? s->put_optim(s->optim_ctx, out) : 0;
}

int hs__state_put_checkpoint(hs_buf *out, uint32_t magic, uint32_t version,
                             const hs__state_parts *s) {
    int err;
    if ((err = hs__put_u32(out, magic)) < 0 || (err = hs__put_u32(out, version)) < 0 ||
        (err = put_body(out, s)) < 0 || (err = hs__outer_save(s->outer, out)) < 0)
        return err;
    /* The algorithm's length goes before its bytes, known once they are written. */
    size_t len_at = out->len;
    if ((err = hs__put_u64(out, 0)) < 0 || (s->algo && (err = hs_algo_save(s->algo, out)) < 0))
        return err;
    uint64_t alen = out->len - len_at - 8;
    memcpy(out->data + len_at, &alen, 8);
    return 0;
}

int hs__state_put_snapshot(hs_buf *out, const hs__state_parts *s) {
    int err;
    if ((err = hs__put_u32(out, HS__SNAPSHOT_MAGIC)) < 0 || (err = put_body(out, s)) < 0)
        return err;
    return s->outer ? hs__outer_save(s->outer, out) : 0;
}

int hs__state_get_head(const uint8_t **p, const uint8_t *end, uint32_t magic, uint32_t version,
                       size_t d, const char *what, uint64_t *steps) {
    uint32_t m, v;
    uint64_t dd;
    int err;
    if ((err = hs__get_u32(p, end, &m)) < 0) return err;
    if (m != magic) return hs__err(HS_EFORMAT, "%s: bad magic 0x%08x", what, m);
    if (version) {
        if ((err = hs__get_u32(p, end, &v)) < 0) return err;
        if (v != version)
            return hs__err(HS_EFORMAT, "%s: version %u (this build reads %u)", what, v, version);
    }
    if ((err = hs__get_u64(p, end, &dd)) < 0 || (err = hs__get_u64(p, end, steps)) < 0)
        return err;
    if (dd != d)
        return hs__err(HS_EMISMATCH, "%s has %llu parameters, this model %zu", what,
                       (unsigned long long)dd, d);
    if (*steps > (uint64_t)1 << 48)
        return hs__err(HS_EFORMAT, "%s: step %llu", what, (unsigned long long)*steps);
    return 0;
}
