/*
 * gpu.h - the proc's GPU built-ins: CUDA device memory for tensors and NCCL
 * communicators for collectives.
 *
 * The worker links nothing from CUDA. The first GPU request dlopen()s the
 * CUDA runtime (libcudart), and the first NCCL request dlopen()s libnccl, so
 * a proc on a host without CUDA runs as before and answers GPU requests with
 * a clear error ("no CUDA runtime on this host: ..." or "no CUDA device:
 * ..."). Everything here runs on the executor thread, so nothing locks.
 *
 * Built-ins, registered under "__gpu_" by mn_gpu_register(); `t` is a tensor
 * handle (or id), `comm` a communicator id that the controller chooses:
 *
 *   __gpu_info()                          -> count, name, total bytes, free bytes,
 *                                            "major.minor", runtime version,
 *                                            driver version, device
 *   __gpu_tensor_new(id, dtype, shape, device?)   zeroed, cudaMalloc'd; device
 *                                            defaults to the proc's device
 *   __gpu_fetch(t)                        -> bytes (device to host)
 *   __gpu_put(t, bytes)                   host to device, exactly t's size
 *   __gpu_free(t)                         -> true, or false if there was none
 *   __gpu_sync()                          waits for the device to finish
 *   __gpu_nccl_id()                       -> 128 bytes (ncclGetUniqueId)
 *   __gpu_nccl_init(comm, id, nranks, rank)   ncclCommInitRank, cached as comm
 *   __gpu_nccl_free(comm)                 -> true, or false if there was none
 *   __gpu_all_reduce(comm, t, op)         in place; op: sum, max, min, avg
 *   __gpu_broadcast(comm, t, root)        in place; root is a rank of comm
 *   __gpu_all_gather(comm, send, recv)    recv holds nranks x send
 *   __gpu_reduce_scatter(comm, send, recv, op)   send holds nranks x recv
 *
 * Errors set x->err_kind: "no_gpu" (no runtime, device or NCCL), "gpu" (a
 * CUDA or NCCL call failed) or the default "bad_args".
 */
#ifndef MN_GPU_H
#define MN_GPU_H

#include <stddef.h>

#define MN_GPU_MAX_COMMS 256         /* most NCCL communicators one proc may hold */
#define MN_GPU_NCCL_ID_BYTES 128     /* size of an ncclUniqueId */
#define MN_GPU_COLL_TIMEOUT_S 300.0  /* default wait for a collective before aborting its communicator */

/* Registers the "__gpu_" built-ins (once; later calls do nothing). Returns 0
 * or MN_ELIMIT if the executor has no room for another module. Loads nothing. */
int mn_gpu_register(void);

/*
 * Pins this process to one GPU: sets CUDA_VISIBLE_DEVICES so the process
 * sees only the device-th GPU of what it could see (the device-th entry of
 * an inherited CUDA_VISIBLE_DEVICES, such as "2,3" or GPU UUIDs from a
 * scheduler; otherwise physical device `device`), which CUDA then calls
 * device 0. Call it before any thread starts and before CUDA is loaded.
 * Returns 0, or with err set MN_EINVAL (a negative device, or an inherited
 * list with too few entries) or -errno from setenv.
 */
int mn_gpu_pin(int device, char *err, size_t errlen);
#define MN_GPU_MAX_VISIBLE 4096 /* longest CUDA_VISIBLE_DEVICES value handled */

/* ---- for tests ------------------------------------------------------------------
 * The CUDA runtime and NCCL entry points the module uses, with CUDA's own
 * argument order. Enums are passed as int (the same ABI on every platform
 * CUDA supports); streams and communicators as void *. */
typedef struct {
  char internal[MN_GPU_NCCL_ID_BYTES];
} mn_nccl_id_t;

typedef struct {
  int (*GetDeviceCount)(int *n);
  int (*SetDevice)(int dev);
  int (*Malloc)(void **p, size_t n);
  int (*Free)(void *p);
  int (*Memset)(void *p, int v, size_t n);
  int (*Memcpy)(void *dst, const void *src, size_t n, int kind);
  int (*DeviceSynchronize)(void);
  int (*StreamQuery)(void *stream);
  int (*MemGetInfo)(size_t *free_bytes, size_t *total_bytes);
  int (*GetDeviceProperties)(void *prop, int dev); /* only the name at offset 0 is read */
  int (*DeviceGetAttribute)(int *v, int attr, int dev);
  int (*RuntimeGetVersion)(int *v);
  int (*DriverGetVersion)(int *v);
  const char *(*GetErrorString)(int err);
  int (*GetLastError)(void);
} mn_cudart_t;

typedef struct {
  int (*GetVersion)(int *v);
  int (*GetUniqueId)(mn_nccl_id_t *id);
  int (*CommInitRank)(void **comm, int nranks, mn_nccl_id_t id, int rank);
  int (*CommDestroy)(void *comm);
  int (*CommAbort)(void *comm);
  int (*CommGetAsyncError)(void *comm, int *err);
  int (*AllReduce)(const void *send, void *recv, size_t count, int dtype, int op, void *comm, void *stream);
  int (*Broadcast)(const void *send, void *recv, size_t count, int dtype, int root, void *comm, void *stream);
  int (*AllGather)(const void *send, void *recv, size_t sendcount, int dtype, void *comm, void *stream);
  int (*ReduceScatter)(const void *send, void *recv, size_t recvcount, int dtype, int op, void *comm,
                       void *stream);
  const char *(*GetErrorString)(int rc);
  const char *(*GetLastError)(void *comm); /* may be NULL: NCCL before 2.13 lacks it */
} mn_nccl_t;

/*
 * Forgets what was loaded and every communicator (aborting them), so the
 * next request loads again. If rt / nccl are not NULL, they are used instead
 * of dlopen (the caller keeps them alive); NULL means load the real library.
 */
void mn__gpu_reset(const mn_cudart_t *rt, const mn_nccl_t *nccl);

#endif
