/* Algorithms on a compute backend's memory (hs__algo_to_device): which algorithms switch, the
 * decode of a neighbour's delta into its host replica and a device accumulator, and the
 * evaluation point on the device. The algorithm's own device work is in its file (choco.c,
 * beer.c, dcd.c, sgp.c, dpsgd_dev.c). */
#include "algo/algo_internal.h"
#include "compress/device.h"
#include "core/error_internal.h"
#include "tensor/gossip_ops.h"

int hs__algo_to_device(hs_algo *a, hs_backend *be) {
    if (a->have_view)
        return hs__err(HS_EINVAL, "%s: moved to a device after its first round", a->ops->name);
    if (a->be) return 1;
    /* An ef: residual is host memory, so the message would start from a host copy anyway. */
    if (!be || be->host_memory || !be->ops->gossip || !a->ops->to_device ||
        hs_compressor_residual(a->comp))
        return 0;
    int err = a->ops->to_device(a, be);
    if (err < 0) return err;
    a->be = be;
    return 1;
}

/* The device accumulator first: its decode checks the whole message and changes nothing on
 * error, so a malformed message leaves both vectors as they were; the host decode of the same
 * checked bytes then adds the same floats as hs_compress_decode_add2's first accumulator. */
int hs__algo_decode_dev(hs_algo *a, hs__nbr *n, uint64_t key, const uint8_t *p, size_t len,
                        size_t at, float *acc) {
    int err = hs__compress_decode_add_be(a->comp, a->be, p, len, n->id, key, acc + at, a->d,
                                         n->w_in);
    if (err < 0) return err;
    return hs_compress_decode_add(a->comp, p, len, n->id, key, n->rep + at, a->d, 1.0f);
}

int hs__algo_eval_point_be(hs_algo *a, float *z, const float *x) {
    if (!a->ops->eval_point_be) return hs_be_copy_f(a->be, z, x, a->d);
    return a->ops->eval_point_be(a, z, x);
}

int hs__algo_from_eval_point_be(hs_algo *a, float *x, const float *z) {
    if (!a->ops->from_eval_point_be) return hs_be_copy_f(a->be, x, z, a->d);
    return a->ops->from_eval_point_be(a, x, z);
}
