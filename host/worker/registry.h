/*
 * registry.h - what a proc holds: loaded kernel libraries and tensors.
 * Owned by the proc's executor thread alone, so nothing here locks.
 */
#ifndef MN_REGISTRY_H
#define MN_REGISTRY_H

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
mk_tensor_t *mn_tensor_get(const mn_registry_t *r, uint64_t id);
/* Frees a tensor; returns 0, or -1 if there was none with that id. */
int mn_tensor_free(mn_registry_t *r, uint64_t id);
/* Parses "f32" etc; returns -1 if unknown. */
int mn_dtype_parse(const char *s, size_t n);
const char *mn_dtype_name(mk_dtype_t d);

#endif
