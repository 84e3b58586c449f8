/* hearsay: the model (a sequence of layers: an MLP, a CNN, a ResNet) and its optimizer.
 *
 * All parameters live in ONE contiguous float vector in backend memory, and so do all
 * gradients; each layer's weights and bias are views into it. That is what lets every gossip
 * algorithm and compressor work on (float *x, size_t d) alone. Parameter layout, layer after
 * layer: linear with fan-in a and fan-out b: W as b rows of a floats (out x in), then the bias
 * (b); conv2d: W as out rows of k x k x in floats (kh, kw, in channel), then the bias (out);
 * groupnorm: gamma (c), then beta (c). Activations are NHWC (channels last); a linear layer
 * takes all the features of its input in that order.
 *
 * Threading: a model is used by one thread at a time. */
#ifndef HEARSAY_MODEL_H
#define HEARSAY_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/data.h"
#include "hearsay/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HS_MLP_MAX_LAYERS 16

typedef struct hs_mlp_cfg {
    int n_layers;                     /* number of weight layers (hidden + output) */
    int width[HS_MLP_MAX_LAYERS + 1]; /* width[0] = inputs ... width[n_layers] = classes */
} hs_mlp_cfg;

/* The default 784-256-128-10. */
void hs_mlp_cfg_default(hs_mlp_cfg *cfg);

/* Parses hidden widths "256,128" (or "" / "none" for a linear model) between fixed input and
 * output sizes. HS_EINVAL naming the bad width (0, negative, not a number, too many layers). */
int hs_mlp_cfg_parse(hs_mlp_cfg *cfg, int n_in, const char *hidden, int n_out);

/* "mlp:784-256-128-10"; the architecture part of a model signature. */
void hs_mlp_cfg_format(const hs_mlp_cfg *cfg, char *buf, size_t len);

/* Number of parameters of cfg. */
size_t hs_mlp_cfg_nparams(const hs_mlp_cfg *cfg);

/* ---------------------------------------------------------------- layer lists */

typedef enum hs_layer_kind {
    HS_LAYER_LINEAR = 1,  /* out features (+ bias) over all input features */
    HS_LAYER_CONV2D,      /* out channels, square kernel, stride, zero padding (+ bias) */
    HS_LAYER_MAXPOOL,     /* kernel, stride; no padding */
    HS_LAYER_AVGPOOL,     /* global average pooling: c x h x w -> c */
    HS_LAYER_RELU,
    HS_LAYER_GROUPNORM,   /* groups (dividing the channels), affine gamma and beta */
    HS_LAYER_FLATTEN,     /* no-op: linear layers take all features anyway */
    HS_LAYER_RESIDUAL,    /* remembers its input for the next residual_add (no nesting) */
    HS_LAYER_RESIDUAL_ADD /* adds the remembered input, subsampled and zero-padded in channels
                             to this shape when they differ (He et al.'s option A) */
} hs_layer_kind;

typedef struct hs_layer_spec {
    hs_layer_kind kind;
    int out;                 /* linear: features; conv2d: channels */
    int kernel, stride, pad; /* conv2d, maxpool */
    int bias;                /* linear, conv2d: 1 adds a bias */
    int groups;              /* groupnorm */
} hs_layer_spec;

#define HS_MODEL_MAX_LAYERS 128
#define HS_GROUPNORM_EPS 1e-5f

/* A model's architecture with its resolved input shape. A plain struct: trainer and peer
 * configurations copy it. */
typedef struct hs_model_spec {
    char name[96]; /* "mlp", "cnn-small", "resnet20" or "json:FILE-BASE.HASH" */
    int in_c, in_h, in_w, classes;
    int n_layers;
    hs_layer_spec layer[HS_MODEL_MAX_LAYERS];
} hs_model_spec;

/* The layer kind's name as in model files ("conv2d", "residual_add", ...). */
const char *hs_layer_kind_name(hs_layer_kind k);

/* The MLP of cfg as a layer list (linear, relu, ..., linear) on 1 x 1 x width[0] inputs. */
void hs_model_spec_mlp(hs_model_spec *s, const hs_mlp_cfg *cfg);

/* Resolves a model name for inputs of c x h x w and `classes` classes: "mlp" (hidden widths
 * from `hidden`, "256,128" when NULL), "mlp:784-256-128-10" (the ends must match the data),
 * "cnn-small", "resnet20", or a JSON file (hs_model_spec_load_json). HS_EINVAL naming the
 * model. */
int hs_model_spec_parse(hs_model_spec *s, const char *model, const char *hidden, int c, int h,
                        int w, int classes);

/* A model file: {"layers": [{"type": "conv2d", "out": 16, "kernel": 3, "pad": 1}, ...]} (see
 * docs/MODELS.md). Every field is checked; errors name the file and the layer. */
int hs_model_spec_load_json(hs_model_spec *s, const char *path, int c, int h, int w,
                            int classes);

/* Checks the shapes flow through every layer (kernels fit, groups divide the channels, the
 * last layer is a linear one with `classes` outputs, ...). HS_EINVAL naming the layer. */
int hs_model_spec_check(const hs_model_spec *s);

/* The signature peers compare: "mlp:784-256-128-10" for MLPs (as before layer lists existed),
 * "cnn-small:1x28x28-10", "json:net.1a2b3c4d:3x32x32-10". */
void hs_model_spec_format(const hs_model_spec *s, char *buf, size_t len);

/* Number of parameters (0 if the spec does not check). */
size_t hs_model_spec_nparams(const hs_model_spec *s);

/* The warm-up the command line uses when none is given, for a run of total_steps optimizer
 * steps: 0 for an MLP (as always), a tenth of the steps for other models, whose He-initialised
 * convolutions take the full learning rate badly from the first step (cnn-small on
 * Fashion-MNIST, 10 epochs: 89.96% test accuracy without, 91.73% with). */
long hs_model_default_warmup(const hs_model_spec *s, long total_steps);

typedef struct hs_model hs_model;

/* A model on backend `be` (borrowed; must outlive the model) whose work buffers fit batches of
 * up to max_batch examples. Parameters are zero until hs_model_init. HS_ENOTSUP naming the
 * layer and the device when the backend lacks an op the model needs. */
int hs_model_new_spec(hs_model **out, hs_backend *be, const hs_model_spec *spec, int max_batch);
/* The MLP of cfg (hs_model_spec_mlp). */
int hs_model_new(hs_model **out, hs_backend *be, const hs_mlp_cfg *cfg, int max_batch);
void hs_model_free(hs_model *m); /* accepts NULL */

/* Seeded He (Kaiming normal, fan-in) initialisation of weights in layer order, zero biases,
 * GroupNorm gamma 1 and beta 0. Deterministic in seed on every backend (drawn on the host,
 * then uploaded). */
int hs_model_init(hs_model *m, uint64_t seed);

size_t hs_model_nparams(const hs_model *m);
const hs_model_spec *hs_model_get_spec(const hs_model *m);
hs_backend *hs_model_backend(const hs_model *m);
/* The parameter and gradient vectors (backend memory, nparams floats each). */
float *hs_model_params(hs_model *m);
float *hs_model_grads(hs_model *m);

typedef struct hs_step_stats {
    double loss;  /* mean loss over the batch */
    int correct;  /* examples classified correctly (before the update) */
    int count;    /* batch size */
} hs_step_stats;

/* Forward and backward on one batch from host memory (x: bs examples of c x h x w floats,
 * channel-major as datasets hold them; y: bs labels):
 * overwrites the gradient vector with the gradient of the mean loss. bs <= max_batch. */
int hs_model_grad(hs_model *m, const float *x, const int32_t *y, int bs, hs_step_stats *st);

/* Forward only; optional per-batch loss and correct count. */
int hs_model_eval_batch(hs_model *m, const float *x, const int32_t *y, int bs, hs_step_stats *st);

/* Mean loss and accuracy over a whole dataset, in batches of at most max_batch. */
int hs_model_evaluate(hs_model *m, const hs_dataset *ds, double *loss, double *accuracy);

/* Learning-rate schedule and SGD with momentum over one flat vector. */
typedef enum hs_lr_sched {
    HS_LR_CONST = 0,
    HS_LR_COSINE = 1, /* lr_min + (lr - lr_min) * (1 + cos(pi t / T)) / 2 after warm-up */
    HS_LR_STEP = 2,   /* lr * gamma^(floor(t / step_size)) after warm-up */
} hs_lr_sched;

/* The update rule: SGD (with optional momentum, Nesterov, L2 weight decay) or AdamW (Adam with
 * weight decay decoupled from the gradient, Loshchilov & Hutter 2019, as PyTorch's AdamW). */
typedef enum hs_optim_kind {
    HS_OPTIM_SGD = 0,
    HS_OPTIM_ADAMW = 1,
} hs_optim_kind;

/* What SGD's momentum buffer accumulates. LOCAL: the local gradients (heavy ball). QG:
 * quasi-global momentum (Lin, Karimireddy, Stich and Jaggi, ICML 2021, Algorithm 1), for
 * decentralized training on heterogeneous data: each local step uses m = beta mhat + g without
 * writing m back, and after the round's gossip (hs_optim_round_end)
 *   mhat = beta mhat + (1 - beta) (x_round_start - x_round_end) / (sum of the round's lrs),
 * so the buffer follows the network's model change instead of amplifying the local drift. */
typedef enum hs_momentum_kind {
    HS_MOMENTUM_LOCAL = 0,
    HS_MOMENTUM_QG = 1,
    /* HYBRID: the heavy ball on the local gradients (v = beta v + g, decay beta), plus a second
     * buffer that takes only the gossip's share of the round's change at QG's pace:
     *   mg = beta (2 - beta) mg + (1 - beta) (x_after_local_steps - x_round_end) / (sum of lrs),
     * and every local step moves x by -lr (v + beta mg). QG's buffer, with one local step a
     * round, forgets at beta (2 - beta) a step (0.99 for 0.9): too slow on data that is alike
     * on every peer; local momentum amplifies the local drift 1 / (1 - beta) but not the
     * gossip's pull back, which loses on data that differs. Here both are amplified alike,
     * the gradients at the heavy ball's pace and the gossip at QG's (a faster gossip buffer
     * made CHOCO diverge: docs/RESULTS.md, "IID gap (iid branch)"). */
    HS_MOMENTUM_HYBRID = 2,
} hs_momentum_kind;

typedef struct hs_optim_cfg {
    hs_optim_kind kind;
    float lr;
    float momentum;
    float weight_decay;
    int nesterov;
    hs_lr_sched sched;
    long warmup_steps; /* linear warm-up from lr / warmup_steps to lr */
    long total_steps;  /* T of the cosine schedule */
    long step_size;    /* of the step schedule */
    float step_gamma;
    float lr_min;
    float beta1, beta2, eps; /* AdamW (defaults 0.9, 0.999, 1e-8); momentum is SGD's only */
    hs_momentum_kind momentum_kind; /* SGD with momentum > 0 only (default LOCAL) */
} hs_optim_cfg;

void hs_optim_cfg_default(hs_optim_cfg *cfg);
int hs_lr_sched_parse(const char *s, hs_lr_sched *out);
/* "sgd" or "adamw". */
int hs_optim_kind_parse(const char *s, hs_optim_kind *out);
const char *hs_optim_kind_name(hs_optim_kind k);
/* "local", "qg" or "hybrid". */
int hs_momentum_kind_parse(const char *s, hs_momentum_kind *out);
const char *hs_momentum_kind_name(hs_momentum_kind k);

/* The learning rate at global step t (from 0). */
float hs_optim_lr(const hs_optim_cfg *cfg, long t);

typedef struct hs_optim hs_optim;
/* An optimizer for n parameters on be (borrowed): owns the velocity buffer. */
int hs_optim_new(hs_optim **out, hs_backend *be, size_t n, const hs_optim_cfg *cfg);
void hs_optim_free(hs_optim *o);
/* x -= lr(t) * direction(g) with momentum and weight decay; returns the lr used in *lr_out
 * (may be NULL). */
int hs_optim_step(hs_optim *o, float *x, const float *g, long t, float *lr_out);
/* Quasi-global momentum's round boundaries (no-ops for any other optimizer): round_begin
 * records x (n host floats) as the round's start and zeroes the sum of the learning rates of
 * the steps that follow; round_end, given x after the round's gossip, folds the round's model
 * change into the buffer (unchanged when that sum is 0, e.g. lr 0). */
int hs_optim_round_begin(hs_optim *o, const float *x_host);
int hs_optim_round_end(hs_optim *o, const float *x_host);
/* 1 when the two above read x (quasi-global momentum): a caller whose x is on a device can
 * skip bringing it to the host for them otherwise. */
int hs_optim_needs_x(const hs_optim *o);
/* The velocity vector (backend memory, n floats), for checkpoints; NULL unless SGD with
 * momentum. */
float *hs_optim_velocity(hs_optim *o);
/* The optimizer's state, for checkpoints and join snapshots: hs_optim_nstate vectors of n
 * floats in backend memory (SGD with momentum: the velocity, and with HYBRID momentum the
 * gossip buffer mg after it; AdamW: the first and second moments m and v; plain SGD: none)
 * and a step count (AdamW's bias correction). */
int hs_optim_nstate(const hs_optim *o);
float *hs_optim_state(hs_optim *o, int i);
uint64_t hs_optim_count(const hs_optim *o);
void hs_optim_set_count(hs_optim *o, uint64_t t);
const hs_optim_cfg *hs_optim_config(const hs_optim *o);

#ifdef __cplusplus
}
#endif
#endif
