/* The state of a model, shared by the layer walk and its lanes (model.c) and the host
 * backends' convolution lowering (conv.c). Nothing outside src/model/ includes it. */
#ifndef HS_MODEL_STATE_H
#define HS_MODEL_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/pool.h"
#include "hearsay/model.h"
#include "hearsay/tensor.h"
#include "model/model_internal.h"

static inline size_t hs__feat(int c, int h, int w) { return (size_t)c * h * w; }

struct hs_model {
    hs_backend *be;
    hs_model_spec spec;
    hs__layer_shape sh[HS_MODEL_MAX_LAYERS];
    int max_batch;
    size_t nparams;
    int first_param;   /* index of the first layer with parameters */
    int transpose_in;  /* the input goes NCHW -> NHWC on the host before the first layer */
    float *params, *grads;                 /* backend memory */
    float *buf[HS_MODEL_MAX_LAYERS];       /* a layer's own output, NULL when it aliases */
    int owner[HS_MODEL_MAX_LAYERS + 1];    /* act[i] is buf[owner[i]], or the input if -1 */
    float *act[HS_MODEL_MAX_LAYERS + 1];   /* act[0] the input, act[i + 1] layer i's output */
    int32_t *arg[HS_MODEL_MAX_LAYERS];     /* maxpool: where each maximum came from */
    float *mean[HS_MODEL_MAX_LAYERS], *rstd[HS_MODEL_MAX_LAYERS]; /* groupnorm statistics */
    float *d[2], *skip;                    /* gradient buffers, a lane batch * max features */
    float *col;                            /* im2col rows, shared by every conv2d */
    float *lcol[HS_MODEL_MAX_LAYERS];      /* a conv2d's own rows, kept for its backward */
    float *wflip;                          /* host: a conv2d's kernel laid out for row_lowered */
    float *input;                          /* backend copy of the input (not host memory) */
    float *host_x;                         /* host scratch for the NHWC input */
    int32_t *labels;                       /* device labels (unused on host backends) */
    int32_t *host_labels;                  /* host scratch for evaluate() */
    /* Lanes (see the top): lane[k] for k in 1..lanes-1; lane 0 is this model. A lane's params
     * are its parent's (borrowed, not freed). */
    int lanes;
    int borrowed_params;
    hs_model **lane;
    struct lane_part *part; /* one per lane: its slice of the current batch and its result */
    hs__pool *pool;
};

/* Lane k's share of a batch and what it reported. */
typedef struct lane_part {
    int off, n;
    int err;
    double loss;
    int correct;
    char msg[256];
} lane_part;

/* How conv layer i is lowered (conv.c). needs_col: it reads lowered rows (not a 1x1
 * convolution straight off NHWC). row_lowered: on this host backend it runs as k GEMMs over
 * im2row's kernel rows. col_floats: floats of lowered rows per example; col_chunk: examples
 * whose rows a host backend builds at a time (at least one). */
int hs__conv_needs_col(const hs_model *m, int i);
int hs__conv_row_lowered(const hs_model *m, int i);
size_t hs__conv_col_floats(const hs_model *m, int i);
int hs__conv_col_chunk(const hs_model *m, int i);

/* Conv layer i on a host backend, a chunk of examples at a time: y = a * W, and the weight
 * gradient (into m->grads) with, if need_dx, the input gradient dx of the output gradient g. */
int hs__conv_forward_host(hs_model *m, int i, const hs_conv_geom *gm, const float *a, float *y,
                          int bs);
int hs__conv_backward_host(hs_model *m, int i, const hs_conv_geom *gm, const float *a,
                           const float *g, int bs, int need_dx, float *dx);

#endif
