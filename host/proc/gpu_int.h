/*
 * gpu_int.h - what the GPU module's three files share. gpu_load.c loads the
 * CUDA runtime and NCCL (dlopen, once) and keeps what it loaded; gpu.c has
 * the device-memory built-ins and registers the module; gpu_comm.c has the
 * NCCL communicators, the collective built-ins on them and the collectives
 * kernels call. The public face is gpu.h. Everything runs on the executor
 * thread, so nothing locks.
 */
#ifndef MN_GPU_INT_H
#define MN_GPU_INT_H

#include "gpu.h"

#include "exec.h"

/* ---- CUDA's and NCCL's constants, for all three files ------------------------------- */

/* The few CUDA and NCCL constants used, from their public headers (checked
 * against them by mk/cuda.mk's gpu-abi-check when the toolkit is present). */
#define CUDA_SUCCESS 0
#define CUDA_NOT_READY 600
#define CUDA_H2D 1
#define CUDA_D2H 2
#define CUDA_ATTR_CC_MAJOR 75
#define CUDA_ATTR_CC_MINOR 76
#define NCCL_SUCCESS 0
#define NCCL_IN_PROGRESS 7

#ifdef MN_GPU_ABI_CHECK /* mk/cuda.mk compiles the gpu*.c files once more against the real headers */
#include <cuda_runtime_api.h>
_Static_assert(CUDA_SUCCESS == cudaSuccess && CUDA_NOT_READY == cudaErrorNotReady, "cudaError_t");
_Static_assert(CUDA_H2D == cudaMemcpyHostToDevice && CUDA_D2H == cudaMemcpyDeviceToHost, "cudaMemcpyKind");
_Static_assert(CUDA_ATTR_CC_MAJOR == cudaDevAttrComputeCapabilityMajor &&
               CUDA_ATTR_CC_MINOR == cudaDevAttrComputeCapabilityMinor, "cudaDeviceAttr");
_Static_assert(sizeof(cudaError_t) == sizeof(int) && sizeof(cudaStream_t) == sizeof(void *), "CUDA types");
#if __has_include(<nccl.h>)
#include <nccl.h>
_Static_assert(NCCL_SUCCESS == ncclSuccess && NCCL_IN_PROGRESS == ncclInProgress, "ncclResult_t");
_Static_assert(sizeof(mn_nccl_id_t) == sizeof(ncclUniqueId) && MN_GPU_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "id");
_Static_assert(ncclUint8 == 1 && ncclInt32 == 2 && ncclInt64 == 4 && ncclFloat16 == 6 && ncclFloat32 == 7 &&
               ncclFloat64 == 8 && ncclBfloat16 == 9, "ncclDataType_t");
_Static_assert(ncclSum == 0 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4, "ncclRedOp_t");
_Static_assert(sizeof(ncclDataType_t) == sizeof(int) && sizeof(ncclComm_t) == sizeof(void *), "NCCL types");
#endif
#endif

/* ---- gpu_load.c: the CUDA runtime and NCCL, loaded once ---------------------------- */

#define MN_GPU_WHY 512             /* longest reason CUDA or NCCL cannot be used */

/* What was loaded: one per process (the proc has one executor thread). */
typedef struct {
  int rt_tried;                 /* a load of the runtime was attempted */
  int rt_ok;
  mn_cudart_t rt;
  char rt_why[MN_GPU_WHY];      /* why the runtime or device cannot be used */
  int ndev;
  int cur;                      /* device mn__gpu_use_device last made current, -1 none */
  const mn_cudart_t *fake_rt;   /* tests: use this instead of dlopen */
  int nccl_tried;
  int nccl_ok;
  mn_nccl_t nccl;
  char nccl_why[MN_GPU_WHY];
  const mn_nccl_t *fake_nccl;
} mn__gpu_t;

extern mn__gpu_t mn__gpu;

/* Loads the runtime and counts devices, once. Returns 0, or MN_ENOTFOUND with
 * err set (the same reason every time) and x->err_kind "no_gpu" (x may be NULL). */
int mn__gpu_cuda_ready(mn_exec_t *x, char *err, size_t errlen);
/* Makes `dev` current on this thread; 0, or with err cuda_ready's code, MN_EINVAL (no such device) or MN_EDEVICE. */
int mn__gpu_use_device(mn_exec_t *x, int dev, char *err, size_t errlen);
/* Reports a failed CUDA call: "what failed: <CUDA's message>". Returns MN_EDEVICE. */
int mn__gpu_cuda_fail(mn_exec_t *x, int rc, const char *what, char *err, size_t errlen);
/* Loads NCCL (and the runtime), once. Returns 0, or MN_ENOTFOUND with err and x->err_kind "no_gpu". */
int mn__gpu_nccl_ready(mn_exec_t *x, char *err, size_t errlen);
/* "what failed: ncclInvalidUsage text (NCCL's last error)". Returns MN_EDEVICE. */
int mn__gpu_nccl_fail(mn_exec_t *x, int rc, void *comm, const char *what, char *err, size_t errlen);

/* ---- gpu.c: device memory and the module --------------------------------------------- */

/* The device a proc's GPU work goes to by default: its pinned one (device 0 of what it sees). */
int mn__gpu_proc_device(const mn_exec_t *x);
/* A GPU tensor argument; NULL with err if absent or on the CPU. */
mk_tensor_t *mn__gpu_tensor_arg(mn_exec_t *x, const msgpack_object *args, uint32_t i, const char *who, char *err,
                                size_t errlen);

/* ---- gpu_comm.c: NCCL communicators and collectives ----------------------------------- */

/* The built-ins on communicators; gpu.h documents each one, gpu.c lists them. */
int mn__gpu_b_nccl_id(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                      size_t errlen);
int mn__gpu_b_nccl_init(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                        size_t errlen);
int mn__gpu_b_nccl_free(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                        size_t errlen);
int mn__gpu_b_all_reduce(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                         size_t errlen);
int mn__gpu_b_broadcast(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                        size_t errlen);
int mn__gpu_b_all_gather(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                         size_t errlen);
int mn__gpu_b_reduce_scatter(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                             char *err, size_t errlen);
/* The collectives kernels call (exec.h's GPU hooks), through the communicator of their group's id. */
extern const mn_exec_gpu_coll_t mn__gpu_kernel_colls;
/* Aborts and forgets every communicator, and the cached MONARCH_GPU_TIMEOUT (mn__gpu_reset). */
void mn__gpu_comm_reset(void);

#endif
