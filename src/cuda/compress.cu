/* Kernels of the compression primitives (the compression entries of hs_gossip_ops,
 * src/tensor/gossip_ops.h) and their host launchers (compress.cuh).
 *
 * Bit-exactness with the CPU codecs: every per-element number is a src/compress/compress_ew.h
 * function (integer arithmetic or single IEEE operations; --fmad=false keeps them unfused, and
 * nvcc's defaults keep division and square root correctly rounded and subnormals), and the
 * reductions follow the definition's order exactly: one warp per bucket, lane l summing the
 * bucket's elements l, l + 32, ... one after another in double, the lanes then combined by
 * shuffle-down for h = 16, 8, 4, 2, 1, which is hs_cw_lanes32. No floating-point atomics
 * anywhere; the integer histograms and counts of top-k are exact whatever the order of their
 * atomic increments, so every result is the same on every run.
 *
 * Top-k is a radix select on the 31-bit magnitude keys (hs_cw_key), as topk.c: a histogram of
 * bits 30..20 finds the bin of the k-th largest key, histograms of bits 19..10 and 9..0 among
 * the keys of that prefix refine it to the exact threshold key T and the number `ties` of
 * elements equal to T that are taken (the lowest indices). A count pass, a scan over blocks
 * and a stable compaction then write the indices in increasing order. The order of the
 * selected set does not depend on any schedule: it is the k largest keys, ties by index.
 *
 * Threading: launchers only enqueue on the stream they are given. */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "compress/compress_ew.h"
#include "cuda/compress.cuh"

/* Threads per block of every kernel here, except the one-block scan. */
#define CT_THREADS 256
#define CT_WARPS (CT_THREADS / 32)
/* Grid cap of the grid-stride kernels. */
#define CT_MAX_BLOCKS 65535u
#define FULL_MASK 0xffffffffu

/* Top-k: histogram bins of the first digit (11 bits) and of the two others (10 bits). */
#define TK_BINS1 2048
#define TK_BINS2 1024
/* Elements per block of the count and compaction passes: at most 2^20 blocks for d < 2^32
 * (the grid's x dimension takes 2^31 - 1), each run of 2^10 of them scanned by one thread. */
#define TK_CHUNK 4096
/* Threads of the one-block scan over the compaction blocks. */
#define TK_SCAN_THREADS 1024
/* Histogram blocks: each thread takes at least this many elements. */
#define TK_HIST_PER_THREAD 16
#define TK_HIST_MAX_BLOCKS 1024u

#define CT_GRID_STRIDE(i, n)                                                                       \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)blockDim.x * gridDim.x)

/* Returns the launch error of the kernel just launched, if any (inside a launcher that has a
 * cudaError_t e). */
#define CT_LAUNCHED()                                                                              \
    do {                                                                                           \
        if ((e = cudaGetLastError()) != cudaSuccess) return e;                                     \
    } while (0)

static size_t align256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

static unsigned grid_for(size_t items) {
    size_t b = (items + CT_THREADS - 1) / CT_THREADS;
    return b < CT_MAX_BLOCKS ? (unsigned)(b ? b : 1) : CT_MAX_BLOCKS;
}

/* ------------------------------------------------------------------ block-wide helpers */

/* Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, at most 1024; every
 * thread must call it) and the block's total in *total. sh: 32 words of shared memory, free
 * again when this returns. */
static __device__ uint32_t block_exclusive_scan(uint32_t v, uint32_t *sh, uint32_t *total) {
    unsigned lane = threadIdx.x & 31u, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint32_t incl = v;
    for (unsigned o = 1; o < 32; o <<= 1) {
        uint32_t y = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) sh[w] = incl;
    __syncthreads();
    if (w == 0) {
        /* Warp 0 scans the warps' totals; each lane reads and writes only its own slot. */
        uint32_t s = lane < nw ? sh[lane] : 0u;
        for (unsigned o = 1; o < 32; o <<= 1) {
            uint32_t y = __shfl_up_sync(FULL_MASK, s, o);
            if (lane >= o) s += y;
        }
        sh[lane] = s;
    }
    __syncthreads();
    uint32_t r = (w ? sh[w - 1] : 0u) + incl - v;
    *total = sh[nw - 1];
    __syncthreads();
    return r;
}

/* Sum of v over the block (CT_THREADS threads, all calling), valid in thread 0. */
static __device__ uint32_t block_sum_u32(uint32_t v, uint32_t *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    if ((threadIdx.x & 31u) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    uint32_t s = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < CT_WARPS; w++) s += sh[w];
    return s;
}

/* ------------------------------------------------------------------ top-k */

struct topk_state {
    uint32_t hist[TK_BINS1]; /* the current pass's histogram; zero between passes */
    uint32_t prefix;         /* key bits fixed by the passes so far, in place */
    uint32_t need;           /* rank sought among the keys of that prefix, from the top */
    uint32_t max_key;        /* largest key of x */
    uint32_t thresh;         /* T */
    uint32_t ties;           /* elements equal to T to take, >= 1 */
};

/* Histogram of digit kPass of the keys that carry the prefix found so far. */
template <int kPass>
static __global__ void topk_hist_kernel(const float *x, size_t d, topk_state *st) {
    __shared__ uint32_t h[TK_BINS1];
    const int nbins = kPass == 0 ? TK_BINS1 : TK_BINS2;
    for (int b = (int)threadIdx.x; b < nbins; b += CT_THREADS) h[b] = 0;
    __syncthreads();
    const uint32_t pre = kPass == 0 ? 0u : st->prefix;
    uint32_t mx = 0;
    CT_GRID_STRIDE(i, d) {
        uint32_t key = hs_cw_key(x[i]);
        if (kPass == 0) {
            atomicAdd(&h[key >> 20], 1u);
            mx = key > mx ? key : mx;
        } else if (kPass == 1) {
            if ((key >> 20) == (pre >> 20)) atomicAdd(&h[(key >> 10) & 1023u], 1u);
        } else {
            if ((key >> 10) == (pre >> 10)) atomicAdd(&h[key & 1023u], 1u);
        }
    }
    __syncthreads();
    for (int b = (int)threadIdx.x; b < nbins; b += CT_THREADS)
        if (h[b]) atomicAdd(&st->hist[b], h[b]);
    if (kPass == 0) {
        for (int o = 16; o > 0; o >>= 1) {
            uint32_t y = __shfl_xor_sync(FULL_MASK, mx, o);
            mx = y > mx ? y : mx;
        }
        if ((threadIdx.x & 31u) == 0 && mx) atomicMax(&st->max_key, mx);
    }
}

/* One block of CT_THREADS: the bin holding the need-th largest key (topk.c's find_bin, a
 * segment of bins per thread first), then the histogram is cleared for the next pass. */
template <int kPass>
static __global__ void topk_select_kernel(topk_state *st, uint32_t k) {
    const int nbins = kPass == 0 ? TK_BINS1 : TK_BINS2, per = nbins / CT_THREADS;
    __shared__ uint32_t seg[CT_THREADS];
    const int t = (int)threadIdx.x;
    uint32_t sum = 0;
    for (int j = 0; j < per; j++) sum += st->hist[t * per + j];
    seg[t] = sum;
    __syncthreads();
    if (t == 0) {
        /* The histogram holds at least `need` keys (k <= d, and each later pass counts the
         * whole bin the previous one chose), so the scans stop at a bin that reaches it. */
        uint32_t need = kPass == 0 ? k : st->need, above = 0;
        int sg = CT_THREADS - 1;
        for (; sg > 0; sg--) {
            if (above + seg[sg] >= need) break;
            above += seg[sg];
        }
        int b = sg * per + per - 1;
        for (; b > sg * per; b--) {
            uint32_t hb = st->hist[b];
            if (above + hb >= need) break;
            above += hb;
        }
        need -= above;
        if (kPass == 0) {
            st->prefix = (uint32_t)b << 20;
        } else if (kPass == 1) {
            st->prefix |= (uint32_t)b << 10;
        } else {
            st->thresh = st->prefix | (uint32_t)b;
            st->ties = need;
        }
        st->need = need;
    }
    __syncthreads();
    for (int b = t; b < TK_BINS1; b += CT_THREADS) st->hist[b] = 0;
}

/* Block b's chunk [b TK_CHUNK, (b + 1) TK_CHUNK): how many keys are above T, and equal. */
static __global__ void topk_count_kernel(const float *x, size_t d, const topk_state *st,
                                         uint32_t *cnt_gt, uint32_t *cnt_eq) {
    __shared__ uint32_t sh[CT_WARPS];
    size_t lo = (size_t)blockIdx.x * TK_CHUNK, hi = d - lo < TK_CHUNK ? d : lo + TK_CHUNK;
    uint32_t thr = st->thresh, gt = 0, eq = 0;
    for (size_t i = lo + threadIdx.x; i < hi; i += CT_THREADS) {
        uint32_t key = hs_cw_key(x[i]);
        gt += key > thr;
        eq += key == thr;
    }
    uint32_t g = block_sum_u32(gt, sh);
    __syncthreads();
    uint32_t e = block_sum_u32(eq, sh);
    if (threadIdx.x == 0) {
        cnt_gt[blockIdx.x] = g;
        cnt_eq[blockIdx.x] = e;
    }
}

/* Elements a chunk takes: all above T, and those equal to T whose rank among the keys equal to
 * T (eq_before of them in earlier chunks) is below `ties`. */
static __device__ uint32_t chunk_taken(uint32_t gt, uint32_t eq, uint32_t eq_before,
                                       uint32_t ties) {
    uint32_t left = ties > eq_before ? ties - eq_before : 0u;
    return gt + (eq < left ? eq : left);
}

/* One block of TK_SCAN_THREADS: per chunk, the keys equal to T in earlier chunks (eqb) and the
 * output offset of its first taken element (off). Thread t handles a contiguous run of chunks,
 * so the runs' totals scan in chunk order. */
/* The bound lets nvcc keep the registers a 1024-thread block can have (its default assumes
 * 256 threads and the launch could fail for lack of them). */
static __global__ void __launch_bounds__(TK_SCAN_THREADS)
    topk_scan_kernel(const uint32_t *cnt_gt, const uint32_t *cnt_eq, uint32_t nchunks,
                     const topk_state *st, uint32_t *off, uint32_t *eqb) {
    __shared__ uint32_t sh[32];
    uint32_t per = (nchunks + TK_SCAN_THREADS - 1) / TK_SCAN_THREADS;
    uint32_t b0 = threadIdx.x * per, b1 = b0 + per;
    b0 = b0 < nchunks ? b0 : nchunks;
    b1 = b1 < nchunks ? b1 : nchunks;
    uint32_t ties = st->ties, total;
    uint32_t e = 0;
    for (uint32_t b = b0; b < b1; b++) e += cnt_eq[b];
    uint32_t ebase = block_exclusive_scan(e, sh, &total);
    uint32_t taken = 0;
    for (uint32_t b = b0, eb = ebase; b < b1; b++) {
        eqb[b] = eb;
        taken += chunk_taken(cnt_gt[b], cnt_eq[b], eb, ties);
        eb += cnt_eq[b];
    }
    uint32_t sbase = block_exclusive_scan(taken, sh, &total);
    for (uint32_t b = b0, eb = ebase; b < b1; b++) {
        off[b] = sbase;
        sbase += chunk_taken(cnt_gt[b], cnt_eq[b], eb, ties);
        eb += cnt_eq[b];
    }
}

/* Block b writes its chunk's taken elements at off[b] onwards, tile by tile of CT_THREADS
 * elements, each tile's order fixed by two block scans (rank among keys equal to T, then
 * output position). The loop bound is the same for the whole block. */
static __global__ void topk_write_kernel(const float *x, size_t d, size_t k,
                                         const topk_state *st, const uint32_t *off,
                                         const uint32_t *eqb, uint32_t *idx, float *val) {
    __shared__ uint32_t sh[32];
    size_t lo = (size_t)blockIdx.x * TK_CHUNK, hi = d - lo < TK_CHUNK ? d : lo + TK_CHUNK;
    uint32_t thr = st->thresh, ties = st->ties;
    uint32_t run_out = off[blockIdx.x], run_eq = eqb[blockIdx.x];
    for (size_t base = lo; base < hi; base += CT_THREADS) {
        size_t i = base + threadIdx.x;
        bool valid = i < hi;
        float v = valid ? x[i] : 0.0f;
        uint32_t key = hs_cw_key(v);
        bool gt = valid && key > thr, eq = valid && key == thr;
        uint32_t n_eq, n_out;
        uint32_t er = block_exclusive_scan(eq ? 1u : 0u, sh, &n_eq);
        bool take = gt || (eq && run_eq + er < ties);
        uint32_t pos = block_exclusive_scan(take ? 1u : 0u, sh, &n_out);
        size_t at = (size_t)run_out + pos;
        if (take && at < k) { /* at < k always (exactly k are taken); the test guards memory */
            idx[at] = (uint32_t)i;
            val[at] = v;
        }
        run_eq += n_eq;
        run_out += n_out;
    }
}

static size_t topk_chunks(size_t d) { return (d + TK_CHUNK - 1) / TK_CHUNK; }

size_t hs__cuda_topk_scratch(size_t d, size_t k) {
    return align256(sizeof(topk_state)) + 4 * align256(topk_chunks(d) * sizeof(uint32_t)) +
           2 * align256(k * sizeof(uint32_t));
}

cudaError_t hs__cuda_topk(cudaStream_t st, const float *x, size_t d, size_t k, void *scratch,
                          uint32_t *idx, float *val, uint32_t *max_key) {
    size_t nch = topk_chunks(d), cb = align256(nch * sizeof(uint32_t));
    char *p = (char *)scratch;
    topk_state *ts = (topk_state *)p;
    p += align256(sizeof(topk_state));
    uint32_t *cnt_gt = (uint32_t *)p, *cnt_eq = (uint32_t *)(p + cb);
    uint32_t *off = (uint32_t *)(p + 2 * cb), *eqb = (uint32_t *)(p + 3 * cb);
    p += 4 * cb;
    uint32_t *d_idx = (uint32_t *)p;
    float *d_val = (float *)(p + align256(k * sizeof(uint32_t)));

    size_t hb = (d + (size_t)CT_THREADS * TK_HIST_PER_THREAD - 1) /
                ((size_t)CT_THREADS * TK_HIST_PER_THREAD);
    unsigned hgrid = hb < TK_HIST_MAX_BLOCKS ? (unsigned)hb : TK_HIST_MAX_BLOCKS;
    uint32_t k32 = (uint32_t)k;
    cudaError_t e = cudaMemsetAsync(ts, 0, sizeof(*ts), st);
    if (e != cudaSuccess) return e;
    topk_hist_kernel<0><<<hgrid, CT_THREADS, 0, st>>>(x, d, ts);
    CT_LAUNCHED();
    topk_select_kernel<0><<<1, CT_THREADS, 0, st>>>(ts, k32);
    CT_LAUNCHED();
    topk_hist_kernel<1><<<hgrid, CT_THREADS, 0, st>>>(x, d, ts);
    CT_LAUNCHED();
    topk_select_kernel<1><<<1, CT_THREADS, 0, st>>>(ts, k32);
    CT_LAUNCHED();
    topk_hist_kernel<2><<<hgrid, CT_THREADS, 0, st>>>(x, d, ts);
    CT_LAUNCHED();
    topk_select_kernel<2><<<1, CT_THREADS, 0, st>>>(ts, k32);
    CT_LAUNCHED();
    topk_count_kernel<<<(unsigned)nch, CT_THREADS, 0, st>>>(x, d, ts, cnt_gt, cnt_eq);
    CT_LAUNCHED();
    topk_scan_kernel<<<1, TK_SCAN_THREADS, 0, st>>>(cnt_gt, cnt_eq, (uint32_t)nch, ts, off, eqb);
    CT_LAUNCHED();
    topk_write_kernel<<<(unsigned)nch, CT_THREADS, 0, st>>>(x, d, k, ts, off, eqb, d_idx, d_val);
    CT_LAUNCHED();
    if ((e = cudaMemcpyAsync(idx, d_idx, k * sizeof(uint32_t), cudaMemcpyDeviceToHost, st)) !=
        cudaSuccess)
        return e;
    if ((e = cudaMemcpyAsync(val, d_val, k * sizeof(float), cudaMemcpyDeviceToHost, st)) !=
        cudaSuccess)
        return e;
    return cudaMemcpyAsync(max_key, &ts->max_key, sizeof(uint32_t), cudaMemcpyDeviceToHost, st);
}

/* ------------------------------------------------------------------ random-k */

/* Thread q: strata 4q .. 4q + 3, whose words are the four of Philox block q. */
static __global__ void randk_kernel(const float *x, uint32_t d, uint32_t k, uint64_t key_seed,
                                    uint32_t peer, uint32_t round32, uint32_t *idx, float *val) {
    size_t nq = ((size_t)k + 3) / 4;
    CT_GRID_STRIDE(q, nq) {
        uint32_t w[4];
        hs_rng_block(key_seed, HS_RNG_RANDK, peer, round32, (uint32_t)q, w);
        for (uint32_t e = 0; e < 4; e++) {
            uint32_t j = (uint32_t)q * 4u + e;
            if (j >= k) break;
            uint32_t start, size;
            hs_cw_randk_stratum(d, k, j, &start, &size);
            uint32_t at = start + hs_cw_randk_offset(w[e], size);
            idx[j] = at;
            val[j] = x[at];
        }
    }
}

size_t hs__cuda_randk_scratch(size_t k) { return 2 * align256(k * sizeof(uint32_t)); }

cudaError_t hs__cuda_randk(cudaStream_t st, const float *x, size_t d, size_t k, uint64_t seed,
                           uint32_t peer, uint64_t round, void *scratch, uint32_t *idx,
                           float *val) {
    uint32_t *d_idx = (uint32_t *)scratch;
    float *d_val = (float *)((char *)scratch + align256(k * sizeof(uint32_t)));
    randk_kernel<<<grid_for((k + 3) / 4), CT_THREADS, 0, st>>>(
        x, (uint32_t)d, (uint32_t)k, hs_cw_key_seed(seed, round), peer, (uint32_t)round, d_idx,
        d_val);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    if ((e = cudaMemcpyAsync(idx, d_idx, k * sizeof(uint32_t), cudaMemcpyDeviceToHost, st)) !=
        cudaSuccess)
        return e;
    return cudaMemcpyAsync(val, d_val, k * sizeof(float), cudaMemcpyDeviceToHost, st);
}

/* ------------------------------------------------------------------ bucket reductions */

template <bool kSquares> static __device__ double lane_term(float v) {
    return kSquares ? (double)v * (double)v : (double)fabsf(v);
}

/* One warp per bucket (the loop over buckets is warp-uniform, so the full-mask shuffles have
 * all 32 lanes): the 32-lane double sum of compress_ew.h, of squares (QSGD: out = the norm) or
 * of magnitudes (sign: out = the scale). Loads go ahead four at a time; the additions stay in
 * element order. */
template <bool kSquares>
static __global__ void lanes32_kernel(const float *x, size_t d, size_t bucket, size_t nb,
                                      float *out) {
    unsigned lane = threadIdx.x & 31u;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t j = warp; j < nb; j += nwarps) {
        size_t lo = j * bucket, hi = d - lo < bucket ? d : lo + bucket;
        double acc = 0.0;
        size_t i = lo + lane;
        for (; i + 96 < hi; i += 128) {
            float v0 = x[i], v1 = x[i + 32], v2 = x[i + 64], v3 = x[i + 96];
            acc = acc + lane_term<kSquares>(v0);
            acc = acc + lane_term<kSquares>(v1);
            acc = acc + lane_term<kSquares>(v2);
            acc = acc + lane_term<kSquares>(v3);
        }
        for (; i < hi; i += 32) acc = acc + lane_term<kSquares>(x[i]);
        for (int h = 16; h > 0; h >>= 1) acc = acc + __shfl_down_sync(FULL_MASK, acc, h);
        if (lane == 0)
            out[j] = kSquares ? hs_cw_qsgd_norm(acc) : hs_cw_sign_scale(acc, (uint32_t)(hi - lo));
    }
}

/* The same sums for long buckets, one block per bucket: a single warp streaming a bucket of
 * millions of elements would wait on memory for most of its time, so all CT_WARPS warps load
 * the bucket tile by tile (LB_ROWS elements per lane) into shared memory, double-buffered,
 * while warp 0 adds the previous tile. Tile element t is bucket offset q LB_TILE + t, so its
 * lane is t mod 32 and lane l adds t = l, l + 32, ... in order: the same additions, in the same
 * order, as lanes32_kernel. The loop over buckets and tiles is uniform across the block. */
#define LB_ROWS 64
#define LB_TILE (32 * LB_ROWS)
#define LB_PER_THREAD (LB_TILE / CT_THREADS)
/* Buckets from this length on take the block kernel. */
#define LB_MIN_BUCKET 4096

template <bool kSquares>
static __global__ void lanes32_block_kernel(const float *x, size_t d, size_t bucket, size_t nb,
                                            float *out) {
    __shared__ float tile[2][LB_TILE];
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (size_t j = blockIdx.x; j < nb; j += gridDim.x) {
        size_t lo = j * bucket, hi = d - lo < bucket ? d : lo + bucket, n = hi - lo;
        size_t ntiles = (n + LB_TILE - 1) / LB_TILE;
        for (unsigned r = 0; r < LB_PER_THREAD; r++) {
            size_t t = (size_t)r * CT_THREADS + threadIdx.x;
            if (t < n) tile[0][t] = x[lo + t];
        }
        __syncthreads();
        double acc = 0.0;
        for (size_t q = 0; q < ntiles; q++) {
            const unsigned cur = (unsigned)(q & 1);
            /* Issue the next tile's loads first; they complete while warp 0 adds. */
            float nxt[LB_PER_THREAD];
            size_t nlo = (q + 1) * LB_TILE;
#pragma unroll
            for (unsigned r = 0; r < LB_PER_THREAD; r++) {
                size_t t = nlo + (size_t)r * CT_THREADS + threadIdx.x;
                nxt[r] = t < n ? x[lo + t] : 0.0f;
            }
            if (warp == 0) {
                size_t cnt = n - q * LB_TILE < LB_TILE ? n - q * LB_TILE : LB_TILE;
#pragma unroll 16
                for (unsigned r = 0; r < LB_ROWS; r++) {
                    size_t t = (size_t)r * 32 + lane;
                    if (t < cnt) acc = acc + lane_term<kSquares>(tile[cur][t]);
                }
            }
#pragma unroll
            for (unsigned r = 0; r < LB_PER_THREAD; r++) {
                size_t t = nlo + (size_t)r * CT_THREADS + threadIdx.x;
                if (t < n) tile[cur ^ 1u][t - nlo] = nxt[r];
            }
            __syncthreads();
        }
        if (warp == 0) {
            for (int h = 16; h > 0; h >>= 1) acc = acc + __shfl_down_sync(FULL_MASK, acc, h);
            if (lane == 0)
                out[j] = kSquares ? hs_cw_qsgd_norm(acc)
                                  : hs_cw_sign_scale(acc, (uint32_t)(hi - lo));
        }
    }
}

/* Launches the 32-lane sums of the nb buckets of x (bucket <= d). */
template <bool kSquares>
static cudaError_t launch_lanes32(cudaStream_t st, const float *x, size_t d, size_t bucket,
                                  size_t nb, float *out) {
    if (bucket >= LB_MIN_BUCKET) {
        unsigned grid = nb < CT_MAX_BLOCKS ? (unsigned)nb : CT_MAX_BLOCKS;
        lanes32_block_kernel<kSquares><<<grid, CT_THREADS, 0, st>>>(x, d, bucket, nb, out);
    } else {
        size_t b = (nb + CT_WARPS - 1) / CT_WARPS;
        unsigned grid = b < CT_MAX_BLOCKS ? (unsigned)b : CT_MAX_BLOCKS;
        lanes32_kernel<kSquares><<<grid, CT_THREADS, 0, st>>>(x, d, bucket, nb, out);
    }
    return cudaGetLastError();
}

/* ------------------------------------------------------------------ QSGD fields */

/* Thread g: elements 8g .. 8g + 7, whose 16-bit draws are the four words of Philox block g,
 * and whose fields (b <= 16 bits each) fill exactly bytes g b .. g b + b - 1 of the stream
 * (the last group: ceil(n b / 8) bytes, zero padding), so no two threads share a byte. */
static __global__ void qsgd_fields_kernel(const float *x, uint32_t d, uint32_t bucket,
                                          const float *norms, uint32_t s, uint32_t b,
                                          uint64_t key_seed, uint32_t peer, uint32_t round32,
                                          uint8_t *fields) {
    size_t ngroups = ((size_t)d + 7) / 8;
    CT_GRID_STRIDE(g, ngroups) {
        uint32_t w[4];
        hs_rng_block(key_seed, HS_RNG_QSGD, peer, round32, (uint32_t)g, w);
        uint32_t i0 = (uint32_t)g * 8u, n = d - i0 < 8u ? d - i0 : 8u;
        /* Bucket of element i0, then a step at each boundary (bucket >= 1: at most one per
         * element). */
        /* next <= d - 1 + bucket, up to 2^33 - 3 with bucket clamped to d < 2^32: 64 bits. */
        uint32_t j = i0 / bucket;
        uint64_t next = ((uint64_t)j + 1u) * bucket;
        float pre, inv16;
        hs_cw_qsgd_factors(norms[j], s, &pre, &inv16);
        uint64_t lo = 0, hi = 0;
#pragma unroll
        for (uint32_t e = 0; e < 8; e++) {
            if (e < n) {
                uint32_t i = i0 + e;
                if (i >= next) {
                    j++;
                    next += bucket;
                    hs_cw_qsgd_factors(norms[j], s, &pre, &inv16);
                }
                uint32_t u = (e & 1) ? w[e >> 1] >> 16 : w[e >> 1] & 0xFFFFu;
                uint64_t f = hs_cw_qsgd_field(x[i], pre, inv16, s, b, u);
                uint32_t pos = e * b; /* <= 112; f < 2^16 */
                if (pos < 64) {
                    lo |= f << pos;
                    if (pos + b > 64) hi |= f >> (64 - pos);
                } else {
                    hi |= f << (pos - 64);
                }
            }
        }
        uint32_t nbytes = (n * b + 7) / 8;
        uint8_t *o = fields + g * b;
        for (uint32_t t = 0; t < nbytes; t++)
            o[t] = (uint8_t)(t < 8 ? lo >> (8 * t) : hi >> (8 * (t - 8)));
    }
}

size_t hs__cuda_qsgd_scratch(size_t d, size_t bucket, uint32_t s) {
    if (bucket > d) bucket = d;
    size_t nb = (d + bucket - 1) / bucket;
    return align256(nb * sizeof(float)) + align256((d * hs_cw_qsgd_bits(s) + 7) / 8);
}

cudaError_t hs__cuda_qsgd(cudaStream_t st, const float *x, size_t d, size_t bucket, uint32_t s,
                          uint64_t seed, uint32_t peer, uint64_t round, void *scratch,
                          void *norms, void *fields) {
    if (bucket > d) bucket = d; /* the same single bucket, and 32-bit arithmetic below */
    size_t nb = (d + bucket - 1) / bucket;
    uint32_t b = hs_cw_qsgd_bits(s);
    size_t fbytes = (d * b + 7) / 8;
    float *d_norms = (float *)scratch;
    uint8_t *d_fields = (uint8_t *)scratch + align256(nb * sizeof(float));
    cudaError_t e = launch_lanes32<true>(st, x, d, bucket, nb, d_norms);
    if (e != cudaSuccess) return e;
    qsgd_fields_kernel<<<grid_for((d + 7) / 8), CT_THREADS, 0, st>>>(
        x, (uint32_t)d, (uint32_t)bucket, d_norms, s, b, hs_cw_key_seed(seed, round), peer,
        (uint32_t)round, d_fields);
    CT_LAUNCHED();
    if ((e = cudaMemcpyAsync(norms, d_norms, nb * sizeof(float), cudaMemcpyDeviceToHost, st)) !=
        cudaSuccess)
        return e;
    return cudaMemcpyAsync(fields, d_fields, fbytes, cudaMemcpyDeviceToHost, st);
}

/* ------------------------------------------------------------------ sign bits */

/* One warp per 32 elements: the ballot of their sign bits is 4 bytes of the LSB-first stream;
 * lanes 0..3 write one byte each, up to the last byte of the stream (padding bits are 0:
 * elements past d vote 0). */
static __global__ void sign_bits_kernel(const float *x, size_t d, uint8_t *bits) {
    unsigned lane = threadIdx.x & 31u;
    size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    size_t nwarps = ((size_t)gridDim.x * blockDim.x) >> 5;
    size_t nwords = (d + 31) / 32, nbytes = (d + 7) / 8;
    for (size_t w = warp; w < nwords; w += nwarps) {
        size_t i = w * 32 + lane;
        bool neg = i < d && (hs_cw_bits(x[i]) >> 31) != 0;
        uint32_t m = __ballot_sync(FULL_MASK, neg);
        size_t byte = w * 4 + lane;
        if (lane < 4 && byte < nbytes) bits[byte] = (uint8_t)(m >> (8 * lane));
    }
}

size_t hs__cuda_sign_scratch(size_t d, size_t bucket) {
    if (bucket > d) bucket = d;
    size_t nb = (d + bucket - 1) / bucket;
    return align256(nb * sizeof(float)) + align256((d + 7) / 8);
}

cudaError_t hs__cuda_sign(cudaStream_t st, const float *x, size_t d, size_t bucket,
                          void *scratch, void *scales, void *bits) {
    if (bucket > d) bucket = d;
    size_t nb = (d + bucket - 1) / bucket, nbytes = (d + 7) / 8;
    float *d_scales = (float *)scratch;
    uint8_t *d_bits = (uint8_t *)scratch + align256(nb * sizeof(float));
    cudaError_t e = launch_lanes32<false>(st, x, d, bucket, nb, d_scales);
    if (e != cudaSuccess) return e;
    size_t wb = ((d + 31) / 32 + CT_WARPS - 1) / CT_WARPS;
    sign_bits_kernel<<<wb < CT_MAX_BLOCKS ? (unsigned)wb : CT_MAX_BLOCKS, CT_THREADS, 0, st>>>(
        x, d, d_bits);
    CT_LAUNCHED();
    if ((e = cudaMemcpyAsync(scales, d_scales, nb * sizeof(float), cudaMemcpyDeviceToHost,
                             st)) != cudaSuccess)
        return e;
    return cudaMemcpyAsync(bits, d_bits, nbytes, cudaMemcpyDeviceToHost, st);
}

/* ------------------------------------------------------------------ 16-bit casts */

static __global__ void half_kernel(const float *x, size_t d, int bf16, uint16_t *out) {
    CT_GRID_STRIDE(i, d) out[i] = bf16 ? hs_cw_bf16_from_f32(x[i]) : hs_cw_f16_from_f32(x[i]);
}

size_t hs__cuda_half_scratch(size_t d) { return align256(d * sizeof(uint16_t)); }

cudaError_t hs__cuda_half(cudaStream_t st, const float *x, size_t d, int bf16, void *scratch,
                          void *out) {
    half_kernel<<<grid_for(d), CT_THREADS, 0, st>>>(x, d, bf16, (uint16_t *)scratch);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    /* Device and host (every CUDA host) are little-endian: the halves are the wire bytes. */
    return cudaMemcpyAsync(out, scratch, d * sizeof(uint16_t), cudaMemcpyDeviceToHost, st);
}

/* ------------------------------------------------------------------ decode-add */

/* The same single multiply and add as simd.c's hs__cf32_add / hs__cf16_add / hs__cbf16_add. */
template <int kFmt>
static __global__ void add_dense_kernel(float *acc, const void *p, size_t n, float alpha) {
    CT_GRID_STRIDE(i, n) {
        float v;
        if (kFmt == 0)
            v = ((const float *)p)[i];
        else if (kFmt == 1)
            v = hs_cw_f32_from_f16(((const uint16_t *)p)[i]);
        else
            v = hs_cw_f32_from_bf16(((const uint16_t *)p)[i]);
        acc[i] = acc[i] + alpha * v;
    }
}

static size_t fmt_width(int fmt) { return fmt == 0 ? 4 : 2; }

size_t hs__cuda_add_dense_scratch(size_t n, int fmt) { return align256(n * fmt_width(fmt)); }

cudaError_t hs__cuda_add_dense(cudaStream_t st, float *acc, const void *p, size_t n, int fmt,
                               float alpha, void *scratch) {
    cudaError_t e =
        cudaMemcpyAsync(scratch, p, n * fmt_width(fmt), cudaMemcpyHostToDevice, st);
    if (e != cudaSuccess) return e;
    if (fmt == 0)
        add_dense_kernel<0><<<grid_for(n), CT_THREADS, 0, st>>>(acc, scratch, n, alpha);
    else if (fmt == 1)
        add_dense_kernel<1><<<grid_for(n), CT_THREADS, 0, st>>>(acc, scratch, n, alpha);
    else
        add_dense_kernel<2><<<grid_for(n), CT_THREADS, 0, st>>>(acc, scratch, n, alpha);
    return cudaGetLastError();
}

/* Distinct indices: no two threads touch the same element. */
static __global__ void add_sparse_kernel(float *acc, const uint32_t *idx, const float *val,
                                         size_t n) {
    CT_GRID_STRIDE(j, n) {
        uint32_t at = idx[j];
        acc[at] = acc[at] + val[j];
    }
}

size_t hs__cuda_add_sparse_scratch(size_t n) { return 2 * align256(n * sizeof(uint32_t)); }

cudaError_t hs__cuda_add_sparse(cudaStream_t st, float *acc, const uint32_t *idx,
                                const float *val, size_t n, void *scratch) {
    uint32_t *d_idx = (uint32_t *)scratch;
    float *d_val = (float *)((char *)scratch + align256(n * sizeof(uint32_t)));
    cudaError_t e = cudaMemcpyAsync(d_idx, idx, n * sizeof(uint32_t), cudaMemcpyHostToDevice, st);
    if (e != cudaSuccess) return e;
    if ((e = cudaMemcpyAsync(d_val, val, n * sizeof(float), cudaMemcpyHostToDevice, st)) !=
        cudaSuccess)
        return e;
    add_sparse_kernel<<<grid_for(n), CT_THREADS, 0, st>>>(acc, d_idx, d_val, n);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------ QSGD and sign decode */

/* Element i's field: b <= 16 bits at bit i b of the LSB-first stream, within 3 bytes (read
 * only as far as the stream goes). */
static __device__ uint32_t field_at(const uint8_t *f, size_t nbytes, size_t i, uint32_t b) {
    size_t bit = i * b, at = bit / 8;
    uint32_t w = 0;
    for (uint32_t t = 0; t < 3 && at + t < nbytes; t++) w |= (uint32_t)f[at + t] << (8 * t);
    return (w >> (bit % 8)) & ((1u << b) - 1u);
}

/* qsgd.c's walk_fields and simd.c's add: the value with its sign bit, then acc + alpha v. */
static __global__ void qsgd_add_kernel(float *acc, const uint8_t *body, size_t d, size_t bucket,
                                       uint32_t s, uint32_t b, size_t nb, float alpha) {
    const uint8_t *fields = body + 4 * nb;
    size_t nbytes = (d * b + 7) / 8;
    CT_GRID_STRIDE(i, d) {
        size_t j = i / bucket;
        uint32_t u = (uint32_t)body[4 * j] | (uint32_t)body[4 * j + 1] << 8 |
                     (uint32_t)body[4 * j + 2] << 16 | (uint32_t)body[4 * j + 3] << 24;
        float unit = hs_cw_qsgd_unit(hs_cw_float(u), s);
        float v = hs_cw_qsgd_value(field_at(fields, nbytes, i, b), b, unit);
        float t = alpha * v;
        acc[i] = acc[i] + t;
    }
}

/* sign.c's decode: one product alpha * scale per bucket, then acc + (bit ? -as : as). */
static __global__ void sign_add_kernel(float *acc, const uint8_t *body, size_t d, size_t bucket,
                                       size_t nb, float alpha) {
    const uint8_t *bits = body + 4 * nb;
    CT_GRID_STRIDE(i, d) {
        size_t j = i / bucket;
        uint32_t u = (uint32_t)body[4 * j] | (uint32_t)body[4 * j + 1] << 8 |
                     (uint32_t)body[4 * j + 2] << 16 | (uint32_t)body[4 * j + 3] << 24;
        float as = alpha * hs_cw_float(u);
        acc[i] = acc[i] + (((bits[i / 8] >> (i % 8)) & 1u) ? -as : as);
    }
}

size_t hs__cuda_body_scratch(size_t bytes) { return align256(bytes); }

cudaError_t hs__cuda_qsgd_add(cudaStream_t st, float *acc, const void *body, size_t bytes,
                              size_t d, size_t bucket, uint32_t s, float alpha, void *scratch) {
    if (bucket > d) bucket = d;
    cudaError_t e = cudaMemcpyAsync(scratch, body, bytes, cudaMemcpyHostToDevice, st);
    if (e != cudaSuccess) return e;
    qsgd_add_kernel<<<grid_for(d), CT_THREADS, 0, st>>>(acc, (const uint8_t *)scratch, d, bucket,
                                                        s, hs_cw_qsgd_bits(s),
                                                        (d + bucket - 1) / bucket, alpha);
    return cudaGetLastError();
}

cudaError_t hs__cuda_sign_add(cudaStream_t st, float *acc, const void *body, size_t bytes,
                              size_t d, size_t bucket, float alpha, void *scratch) {
    cudaError_t e = cudaMemcpyAsync(scratch, body, bytes, cudaMemcpyHostToDevice, st);
    if (e != cudaSuccess) return e;
    sign_add_kernel<<<grid_for(d), CT_THREADS, 0, st>>>(acc, (const uint8_t *)scratch, d, bucket,
                                                        (d + bucket - 1) / bucket, alpha);
    return cudaGetLastError();
}
