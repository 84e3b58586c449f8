/* hearsay: datasets, sharding and batches.
 *
 * A dataset is n examples of `dim` floats (already normalised) and n labels in [0, classes),
 * held in host memory. Fashion-MNIST comes from the IDX files as Debian's dataset-fashion-mnist
 * package ships them (gzip-compressed, in /usr/share/datasets/fashion-mnist); any other image
 * set comes from IDX files of any shape or from CIFAR-10's binary batches (hs_data_load); tests
 * use the synthetic generator instead. Everything seeded is deterministic across machines.
 *
 * Normalisation: Fashion-MNIST (any IDX set of 1 x 28 x 28 images) uses the fixed constants
 * HS_FMNIST_MEAN/STD; every other set is standardised per channel with the mean and standard
 * deviation of its whole training set, computed from exact integer pixel sums. Every peer loads
 * the full training set before it keeps a subset or cuts its shard, so all peers compute the
 * same numbers without exchanging them. */
#ifndef HEARSAY_DATA_H
#define HEARSAY_DATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HS_DATA_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#define HS_DATA_PACKAGE "dataset-fashion-mnist"
/* Channels an image set may have (the normalisation keeps one mean and std per channel). */
#define HS_DATA_MAX_CHANNELS 16

typedef struct hs_dataset {
    size_t n;       /* examples */
    int dim;        /* floats per example: channels * height * width */
    int channels, height, width; /* the shape of one example (channel-major); a set without
                                    spatial structure is 1 x 1 x dim */
    int classes;    /* labels are in [0, classes) */
    float *x;       /* n * dim, row-major, owned */
    uint8_t *y;     /* n, owned */
    char name[64];  /* "fashion-mnist/train", "synthetic" */
    /* The normalisation applied, per channel: x = (pixel / 255 - mean) / std. Zero for sets
     * that are not images (synthetic). */
    float mean[HS_DATA_MAX_CHANNELS], std[HS_DATA_MAX_CHANNELS];
} hs_dataset;

/* Frees x, y and the struct. Accepts NULL. */
void hs_dataset_free(hs_dataset *ds);

/* One IDX file (https://yann.lecun.com/exdb/mnist/ format), gzip-compressed or raw (detected
 * by the gzip magic). Checks the magic number, the element type (unsigned byte only), the
 * number of dimensions (1..4), that no dimension is 0 and that the data is exactly
 * prod(dims) bytes. Errors name the file: HS_ENOENT, HS_EIO, HS_EFORMAT. */
typedef struct hs_idx {
    int ndim;
    uint32_t dims[4];
    uint8_t *data; /* prod(dims) bytes, owned; free with free() */
    size_t size;
} hs_idx;
int hs_idx_read(const char *path, hs_idx *out);

/* Loads Fashion-MNIST (train: 60,000, test: 10,000 examples of 28x28) from dir (NULL: the
 * default). Pixels are scaled to [0, 1] and standardised with the training set's mean and
 * standard deviation (HS_FMNIST_MEAN/STD) so every peer normalises identically. A missing
 * directory gets an HS_ENOENT error naming it and the package that provides it; a missing,
 * truncated or inconsistent file names the file. Either output may be NULL to skip it. */
#define HS_FMNIST_MEAN 0.2860f
#define HS_FMNIST_STD 0.3530f
int hs_fmnist_load(const char *dir, hs_dataset **train, hs_dataset **test);

/* Loads the image set in dir (NULL: Fashion-MNIST in the default directory), recognised by its
 * files:
 *  - IDX, named as Fashion-MNIST ships them, gzip or raw: train-images-idx3-ubyte (N x H x W)
 *    or train-images-idx4-ubyte (N x C x H x W, channel-major), train-labels-idx1-ubyte and
 *    the same with t10k- for the test set. The class count is the largest training label + 1;
 *    test labels must be below it, and test images must have the training images' shape.
 *  - CIFAR-10 binary: data_batch_1.bin ... data_batch_5.bin and test_batch.bin, in dir or in
 *    dir/cifar-10-batches-bin; records of one label byte (0..9) and 3,072 pixel bytes (3 x 32 x
 *    32, channel-major). Every batch must be present and a whole number of records.
 * Errors name the file: HS_ENOENT (directory or file missing), HS_EFORMAT (truncated, bad
 * label, inconsistent shapes). Either output may be NULL to skip it. */
int hs_data_load(const char *dir, hs_dataset **train, hs_dataset **test);

/* Per-channel mean and standard deviation of pixels / 255 over n images of c x hw bytes
 * (channel-major), as hs_data_load computes them: exact integer sums, then double. A constant
 * channel gets std 1. */
void hs_data_channel_stats(const uint8_t *px, size_t n, int c, size_t hw, float *mean,
                           float *std);

/* A learnable synthetic set for tests that must not depend on the package: `classes` Gaussian
 * clusters in `dim` dimensions with random unit-norm centres scaled by `separation`, unit noise.
 * Deterministic in seed; pass a different `split` for a test set drawn
 * from the same clusters. */
typedef struct hs_synth_cfg {
    size_t n;
    int dim;
    int classes;
    float separation;
    uint64_t seed;
    uint32_t split; /* 0 = train, 1 = test, ...: same centres, different samples */
} hs_synth_cfg;
int hs_dataset_synthetic(hs_dataset **out, const hs_synth_cfg *cfg);

/* A new dataset holding the examples idx[0..count) of src, in that order. */
int hs_dataset_subset(hs_dataset **out, const hs_dataset *src, const uint32_t *idx, size_t count);

/* Keeps n examples of *ds (nothing happens when n is 0 or at least ds->n): a seeded random
 * choice when `random`, else the first n. Replaces *ds with the smaller set. */
int hs_dataset_keep(hs_dataset **ds, size_t n, uint64_t seed, int random);

/* Sharding for peer `rank` of `world`. The returned index array (malloc'd, owned by the
 * caller) lists the examples of that peer's shard in ascending order. Shards of all ranks are
 * disjoint and cover the set (IID: a seeded permutation cut into near-equal parts; Dirichlet:
 * for each class, proportions drawn from Dir(alpha) over the peers, as in Hsu et al. 2019).
 * HS_EINVAL for world < 1, rank out of range, alpha <= 0. */
int hs_shard_iid(size_t n, int rank, int world, uint64_t seed, uint32_t **idx, size_t *count);
int hs_shard_dirichlet(const uint8_t *labels, size_t n, int classes, int rank, int world,
                       double alpha, uint64_t seed, uint32_t **idx, size_t *count);

/* Partition spec as given on the command line: "iid" or "dirichlet:ALPHA". */
typedef struct hs_partition {
    int kind; /* 0 = iid, 1 = dirichlet */
    double alpha;
} hs_partition;
int hs_partition_parse(const char *s, hs_partition *out);
int hs_shard(const hs_dataset *ds, const hs_partition *p, int rank, int world, uint64_t seed,
             uint32_t **idx, size_t *count);

/* Mini-batches over a dataset: every epoch is a fresh seeded permutation of the examples
 * (seed, stream, epoch), cut into batches of `batch` (the last short batch of an epoch is
 * dropped when drop_last is set). Batches are gathered into caller-visible buffers. */
typedef struct hs_batcher hs_batcher;
int hs_batcher_new(hs_batcher **out, const hs_dataset *ds, int batch, uint64_t seed,
                   uint32_t stream, int drop_last);
void hs_batcher_free(hs_batcher *b);
/* Gathers the next batch; returns its size (> 0). x points to size*dim floats and y to size
 * labels, both valid until the next call. Advances to the next epoch when one ends. */
int hs_batcher_next(hs_batcher *b, const float **x, const int32_t **y);
/* The next batch as positions, for a caller that holds the data elsewhere (on a device):
 * returns its size as hs_batcher_next does and points *idx at its examples' indices (valid
 * until the next call), advancing the same way: a batcher used through either call draws the
 * same sequence of examples. */
int hs_batcher_next_idx(hs_batcher *b, const uint32_t **idx);
/* The current epoch's permutation (n indices), of which every batch is a slice. */
const uint32_t *hs_batcher_perm(const hs_batcher *b);
/* With augmentation on (else 0 and nothing written): 1, and aug[3 k .. 3 k + 2] = the dy, dx
 * and flip that hs_batcher_next applies to example k in epoch `epoch`, for every example of
 * the set (3 n bytes). */
int hs_batcher_augment_table(const hs_batcher *b, long epoch, uint8_t *aug);
/* Epoch of the batch returned last, from 0; and batches per epoch. */
long hs_batcher_epoch(const hs_batcher *b);
long hs_batcher_steps_per_epoch(const hs_batcher *b);
/* Positions the batcher at the start of global step `step` (used on resume). */
int hs_batcher_seek(hs_batcher *b, long step);

/* Random-crop and flip augmentation (--augment) of every gathered example: the image, padded
 * with 4 zeros on each side (zero after normalisation: the channel's mean), is cropped back to
 * its size at a random offset and flipped horizontally with probability 1/2. The draw of an
 * example depends only on (seed, stream, epoch, the example's index in the set), so it is the
 * same on every machine and after a resume. HS_EINVAL, naming the set, for a set without
 * spatial structure (height or width 1). */
#define HS_AUGMENT_PAD 4
int hs_batcher_set_augment(hs_batcher *b, int on);
/* The draw for one example: offsets dy, dx in [0, 2 * HS_AUGMENT_PAD] into the padded image
 * and the flip. */
void hs_augment_draw(uint64_t seed, uint32_t stream, long epoch, size_t example, int *dy,
                     int *dx, int *flip);
/* dst (c x h x w) = the crop of src padded by HS_AUGMENT_PAD at (dy, dx), then flipped
 * horizontally when flip is set. */
void hs_augment_apply(float *dst, const float *src, int c, int h, int w, int dy, int dx,
                      int flip);

#ifdef __cplusplus
}
#endif
#endif
