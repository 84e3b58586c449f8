/* Synthetic classification data: Gaussian clusters around seeded random centres. Learnable by
 * the MLP in a few hundred steps, so tests train something real without the dataset package. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/rng.h"
#include "hearsay/data.h"

int hs_dataset_synthetic(hs_dataset **out, const hs_synth_cfg *cfg) {
    if (cfg->n == 0 || cfg->dim <= 0 || cfg->classes < 2 || cfg->classes > 256)
        return hs__err(HS_EINVAL, "synthetic dataset: n=%zu dim=%d classes=%d (need n>0, dim>0, "
                                  "2<=classes<=256)", cfg->n, cfg->dim, cfg->classes);
    hs_dataset *ds = calloc(1, sizeof(*ds));
    float *centres = malloc(sizeof(float) * (size_t)cfg->classes * (size_t)cfg->dim);
    if (!ds || !centres) goto oom;
    ds->n = cfg->n;
    ds->dim = cfg->dim;
    ds->channels = ds->height = 1;
    ds->width = cfg->dim;
    ds->classes = cfg->classes;
    snprintf(ds->name, sizeof(ds->name), "synthetic/%u", cfg->split);
    ds->x = malloc(sizeof(float) * cfg->n * (size_t)cfg->dim);
    ds->y = malloc(cfg->n);
    if (!ds->x || !ds->y) goto oom;
    hs_rng r;
    /* Centres depend on the seed only, so train and test splits share them. */
    hs__rng_init(&r, cfg->seed, HS_RNG_SYNTH, 0xFFFFFFFFu, 0);
    for (int c = 0; c < cfg->classes; c++) {
        float *v = centres + (size_t)c * cfg->dim;
        double nrm = 0;
        for (int j = 0; j < cfg->dim; j++) {
            v[j] = (float)hs__rng_normal(&r);
            nrm += (double)v[j] * v[j];
        }
        float s = (float)(cfg->separation / sqrt(nrm > 0 ? nrm : 1));
        for (int j = 0; j < cfg->dim; j++) v[j] *= s;
    }
    hs__rng_init(&r, cfg->seed, HS_RNG_SYNTH, cfg->split, 1);
    for (size_t i = 0; i < cfg->n; i++) {
        int c = (int)hs__rng_uniform(&r, (uint32_t)cfg->classes);
        ds->y[i] = (uint8_t)c;
        float *x = ds->x + i * (size_t)cfg->dim;
        const float *v = centres + (size_t)c * cfg->dim;
        for (int j = 0; j < cfg->dim; j++) x[j] = v[j] + (float)hs__rng_normal(&r);
    }
    free(centres);
    *out = ds;
    return 0;
oom:
    free(centres);
    hs_dataset_free(ds);
    return hs__err(HS_ENOMEM, "synthetic dataset of %zu x %d: out of memory", cfg->n, cfg->dim);
}
