/*
 * mpi_allreduce.c - the OpenMPI baseline for bench/allreduce.lua: MPI_Allreduce
 * (sum of floats) bus bandwidth by the nccl-tests formula, printed in the same
 * line format so bench/collective.sh can set the two side by side.
 *
 *   mpicc -O2 bench/mpi_allreduce.c -o build/bench/mpi_allreduce
 *   mpirun --allow-run-as-root --oversubscribe -np 4 build/bench/mpi_allreduce [max_bytes]
 *
 * Each size runs as batches of back-to-back calls (time / calls), after a
 * barrier; the median batch is reported. Output, one line per size:
 *   allreduce <procs> <bytes> <time_us> <algbw_GBps> <busbw_GBps>
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIN_BYTES 1024u              /* smallest size measured */
#define MAX_BYTES (256u << 20)       /* largest size measured (argv[1] may lower it) */
#define BATCH_BYTES (64u << 20)      /* a batch moves about this much, at least one call */
#define MAX_BATCH 100                /* most calls in one batch */
#define BATCHES_SMALL 7              /* batches per size up to 16 MiB */
#define BATCHES_BIG 3                /* batches per larger size, to finish in minutes */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int rank, n;
  size_t max = argc > 1 ? strtoull(argv[1], NULL, 10) : MAX_BYTES;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  float *buf = malloc(max > MIN_BYTES ? max : MIN_BYTES);
  if (buf == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  for (size_t i = 0; i < max / sizeof(float); i++) buf[i] = (float)(rank + 1);
  for (size_t bytes = MIN_BYTES; bytes <= max; bytes *= 4) {
    int count = (int)(bytes / sizeof(float));
    int batch = (int)(BATCH_BYTES / bytes);
    if (batch < 1) batch = 1;
    if (batch > MAX_BATCH) batch = MAX_BATCH;
    int nb = bytes > (16u << 20) ? BATCHES_BIG : BATCHES_SMALL;
    double t[BATCHES_SMALL];
    MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* warm up */
    for (int b = 0; b < nb; b++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < batch; i++)
        MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      t[b] = (MPI_Wtime() - t0) / batch;
      /* Keep values finite: sums of rank+1 would overflow over many calls. */
      for (int i = 0; i < count; i++) buf[i] = (float)(rank + 1);
    }
    qsort(t, (size_t)nb, sizeof(double), cmp_double);
    double med = t[nb / 2], algbw = (double)bytes / med / 1e9;
    if (rank == 0) {
      printf("allreduce %d %zu %.1f %.3f %.3f\n", n, bytes, med * 1e6, algbw, algbw * 2.0 * (n - 1) / n);
      fflush(stdout);
    }
  }
  free(buf);
  MPI_Finalize();
  return 0;
}
