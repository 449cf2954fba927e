/*
 * fake_nvml.c - a stand-in for libnvidia-ml, built as
 * build/tests/libmonarch_fakenvml.so: top_spec.lua starts a host agent with
 * MONARCH_NVML naming it, so the GPU memory column of `monarch-run --top`
 * is tested on machines without a GPU.
 *
 * One device. Its compute processes are the lines "PID BYTES" of the file
 * named by MONARCH_FAKE_NVML, read at every query (the spec writes a proc's
 * pid there once it knows it). The calls follow NVML's ABI: 0 is success,
 * 7 (NVML_ERROR_INSUFFICIENT_SIZE) says the caller's array is too short.
 */
#include <stdio.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))
#define FAKE_DEVICE ((void *)0x1) /* the one device handle */

typedef struct {
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance, compute_instance;
} proc_v2_t;

EXPORT int nvmlInit_v2(void) { return 0; }

EXPORT int nvmlDeviceGetCount_v2(unsigned int *n) {
  *n = 1;
  return 0;
}

EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev) {
  if (i != 0) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *dev = FAKE_DEVICE;
  return 0;
}

EXPORT int nvmlDeviceGetComputeRunningProcesses_v2(void *dev, unsigned int *n, proc_v2_t *out) {
  const char *path = getenv("MONARCH_FAKE_NVML");
  FILE *f = path ? fopen(path, "r") : NULL;
  unsigned int got = 0, cap = *n;
  unsigned long long pid, bytes;
  if (dev != FAKE_DEVICE) return 2;
  while (f != NULL && fscanf(f, "%llu %llu", &pid, &bytes) == 2) {
    if (got < cap) out[got] = (proc_v2_t){(unsigned int)pid, bytes, 0, 0};
    got++;
  }
  if (f != NULL) fclose(f);
  *n = got;
  return got > cap ? 7 : 0;
}
