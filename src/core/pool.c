/* The worker pool of core/pool.h: a generation counter under one mutex tells the workers that a
 * new run started, a count of pending lanes tells the caller that it ended. */
#include "core/pool.h"

#include <pthread.h>
#include <stdlib.h>

#include "core/error_internal.h"

typedef struct worker {
    hs__pool *pool;
    int lane;
    pthread_t th;
} worker;

struct hs__pool {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long gen; /* bumped by every run */
    int pending;       /* worker lanes of the current run not finished yet */
    int stop;
    hs__pool_fn fn;
    void *arg;
    int lanes, started;
    worker *w; /* lanes - 1 workers, for lanes 1.. */
};

static void *work(void *opaque) {
    worker *w = opaque;
    hs__pool *p = w->pool;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        hs__pool_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, w->lane);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int hs__pool_new(hs__pool **out, int lanes) {
    if (lanes < 1 || lanes > HS__POOL_MAX_LANES)
        return hs__err(HS_EINVAL, "pool: %d lanes (expected 1..%d)", lanes, HS__POOL_MAX_LANES);
    hs__pool *p = calloc(1, sizeof(*p));
    if (!p) return hs__err(HS_ENOMEM, "pool: out of memory");
    p->lanes = lanes;
    if (pthread_mutex_init(&p->mu, NULL)) {
        free(p);
        return hs__err(HS_ENOMEM, "pool: cannot create a mutex");
    }
    if (pthread_cond_init(&p->go, NULL)) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return hs__err(HS_ENOMEM, "pool: cannot create a condition variable");
    }
    if (pthread_cond_init(&p->done, NULL)) {
        pthread_cond_destroy(&p->go);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return hs__err(HS_ENOMEM, "pool: cannot create a condition variable");
    }
    if (lanes > 1 && !(p->w = calloc((size_t)lanes - 1, sizeof(*p->w)))) {
        hs__pool_free(p);
        return hs__err(HS_ENOMEM, "pool: out of memory");
    }
    for (int k = 1; k < lanes; k++) {
        worker *w = &p->w[k - 1];
        w->pool = p;
        w->lane = k;
        int rc = pthread_create(&w->th, NULL, work, w);
        if (rc) {
            hs__pool_free(p);
            return hs__err(HS_ENOMEM, "pool: cannot start worker thread %d of %d (error %d)", k,
                           lanes - 1, rc);
        }
        p->started = k;
    }
    *out = p;
    return 0;
}

void hs__pool_free(hs__pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int k = 0; k < p->started; k++) pthread_join(p->w[k].th, NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->go);
    pthread_mutex_destroy(&p->mu);
    free(p->w);
    free(p);
}

int hs__pool_lanes(const hs__pool *p) { return p->lanes; }

void hs__pool_run(hs__pool *p, hs__pool_fn fn, void *arg) {
    if (p->lanes > 1) {
        pthread_mutex_lock(&p->mu);
        p->fn = fn;
        p->arg = arg;
        p->pending = p->lanes - 1;
        p->gen++;
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0);
    if (p->lanes > 1) {
        pthread_mutex_lock(&p->mu);
        while (p->pending) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
