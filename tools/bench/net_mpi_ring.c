/* The MPI reference of the 8-peer ring round (tools/bench/net): every rank exchanges its
 * vector of N floats (default 235146, the MLP's 0.94 MB) with both ring neighbours through
 * MPI_Sendrecv, then averages (x + left + right) / 3, as netpeer does. Prints the median and
 * mean round time across ranks as one JSON line. Built by tools/bench/net with mpicc. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rounds = argc > 1 ? atoi(argv[1]) : 300, n = argc > 2 ? atoi(argv[2]) : 235146;
    float *x = malloc((size_t)n * 4), *l = malloc((size_t)n * 4), *r = malloc((size_t)n * 4);
    double *t = malloc((size_t)rounds * sizeof(double));
    for (int i = 0; i < n; i++)
        x[i] = (float)rank;
    int left = (rank + size - 1) % size, right = (rank + 1) % size;
    MPI_Barrier(MPI_COMM_WORLD);
    double t_all = MPI_Wtime();
    for (int k = 0; k < rounds; k++) {
        double t0 = MPI_Wtime();
        MPI_Sendrecv(x, n, MPI_FLOAT, right, 0, l, n, MPI_FLOAT, left, 0, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        MPI_Sendrecv(x, n, MPI_FLOAT, left, 1, r, n, MPI_FLOAT, right, 1, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        for (int i = 0; i < n; i++)
            x[i] = (x[i] + l[i] + r[i]) / 3.0f;
        t[k] = (MPI_Wtime() - t0) * 1e3;
    }
    t_all = (MPI_Wtime() - t_all) * 1e3 / rounds;
    qsort(t, (size_t)rounds, sizeof(double), cmp);
    double med = t[rounds / 2], all[2] = {med, t_all}, *g = NULL;
    if (rank == 0)
        g = malloc((size_t)size * 2 * sizeof(double));
    MPI_Gather(all, 2, MPI_DOUBLE, g, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        double *m = malloc((size_t)size * sizeof(double)), mean = 0;
        for (int i = 0; i < size; i++) {
            m[i] = g[2 * i];
            mean += g[2 * i + 1] / size;
        }
        qsort(m, (size_t)size, sizeof(double), cmp);
        printf("{\"bench\":\"ring\",\"kind\":\"mpi-tcp\",\"ranks\":%d,\"floats\":%d,\"rounds\":%d,"
               "\"round_ms_median\":%.4f,\"round_ms_mean\":%.4f,\"x0\":%.6f}\n",
               size, n, rounds, m[size / 2], mean, (double)x[0]);
        free(m);
        free(g);
    }
    free(x);
    free(l);
    free(r);
    free(t);
    MPI_Finalize();
    return 0;
}
