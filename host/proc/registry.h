/*
 * registry.h - what a proc holds: loaded kernel libraries and tensors.
 * Owned by the proc's executor thread alone, so nothing here locks.
 */
#ifndef MN_REGISTRY_H
#define MN_REGISTRY_H

#include "dtype.h"
#include "err.h"
#include "monarch_kernel.h"

#include <stddef.h>
#include <stdint.h>

#define MN_MAX_LIBS 64          /* most kernel libraries one proc may load */
#define MN_MAX_TENSORS (1 << 20) /* most live tensors one proc may hold */

typedef struct mn_kentry_s mn_kentry_t;

typedef struct {
  void *handles[MN_MAX_LIBS];
  const mk_library_t *libs[MN_MAX_LIBS];
  char *paths[MN_MAX_LIBS];
  int nlibs;
  mn_kentry_t **buckets; /* name -> kernel, chained */
  size_t nbuckets;
  size_t nkernels;
  mk_tensor_t **tslots;  /* id -> tensor, open addressing keyed by id */
  size_t tcap;
  size_t ntensors;
  size_t ntombs;         /* freed slots, counted so lookups never scan a full table */
  size_t tensor_bytes;
  const char *prefix;    /* install prefix, for lib/monarch */
} mn_registry_t;

void mn_registry_init(mn_registry_t *r, const char *prefix);
void mn_registry_close(mn_registry_t *r);

/*
 * Loads a kernel library by name ("basic": searched in MONARCH_KERNEL_PATH,
 * then <prefix>/lib/monarch) or by path (a name with '/'). Loading a
 * library twice is a no-op. Returns the library or NULL with err set.
 */
const mk_library_t *mn_registry_load(mn_registry_t *r, const char *name, char *err, size_t errlen);
const mk_kernel_t *mn_registry_find(const mn_registry_t *r, const char *name, size_t len);

/* Creates a zeroed CPU tensor; returns it or NULL with err set. */
mk_tensor_t *mn_tensor_new(mn_registry_t *r, uint64_t id, mk_dtype_t dtype, int ndim,
                           const int64_t *shape, char *err, size_t errlen);

/*
 * Device memory. The module that drives devices (gpu.c) installs these hooks
 * once, before the executor starts; tensors with device >= 0 are allocated
 * and released through them, so the registry never free()s device memory.
 * Without hooks, device tensors cannot be created.
 */
#define MN_DEVICE_HOOKS 1 /* this registry has mn_device_ops_t and mn_tensor_new_on */
typedef struct {
  /* Returns nbytes (may be 0) of zeroed memory on `device`, or NULL with err set. */
  void *(*alloc)(int device, size_t nbytes, char *err, size_t errlen);
  /* Releases what alloc returned; must not fail loudly (the tensor is gone either way). */
  void (*release)(int device, void *p);
} mn_device_ops_t;
/* Installs the hooks for every registry of this process (NULL removes them). */
void mn_registry_set_device_ops(const mn_device_ops_t *ops);
/* Like mn_tensor_new, on CUDA device `device` (-1: host memory, exactly mn_tensor_new). */
mk_tensor_t *mn_tensor_new_on(mn_registry_t *r, uint64_t id, mk_dtype_t dtype, int ndim,
                              const int64_t *shape, int device, char *err, size_t errlen);
mk_tensor_t *mn_tensor_get(const mn_registry_t *r, uint64_t id);
/* Frees a tensor; returns 0, or MN_ENOTFOUND if there was none with that id. */
int mn_tensor_free(mn_registry_t *r, uint64_t id);

#endif
