/* registry.c - kernel libraries and tensors of one proc; see registry.h. */
#include "registry.h"

#include "ship.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const mn_device_ops_t *device_ops; /* set once by gpu.c before the executor starts */

void mn_registry_set_device_ops(const mn_device_ops_t *ops) { device_ops = ops; }

/* Frees a tensor and its memory, host or device. */
static void tensor_release(mk_tensor_t *t) {
  if (t->device >= 0) {
    if (device_ops != NULL) device_ops->release(t->device, t->data);
  } else {
    free(t->data);
  }
  free(t);
}

struct mn_kentry_s {
  const mk_kernel_t *k;
  size_t len;
  struct mn_kentry_s *next;
};

static uint64_t hash_name(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a: short names, no adversary in the table */
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

void mn_registry_init(mn_registry_t *r, const char *prefix) {
  memset(r, 0, sizeof(*r));
  r->prefix = prefix;
}

void mn_registry_close(mn_registry_t *r) {
  for (size_t i = 0; i < r->nbuckets; i++) {
    mn_kentry_t *e = r->buckets[i];
    while (e != NULL) {
      mn_kentry_t *next = e->next;
      free(e);
      e = next;
    }
  }
  free(r->buckets);
  for (size_t i = 0; i < r->tcap; i++) {
    mk_tensor_t *t = r->tslots[i];
    if (t != NULL && t != (mk_tensor_t *)r) tensor_release(t);
  }
  free(r->tslots);
  for (int i = 0; i < r->nlibs; i++) {
    /* Leave the code mapped: a kernel's static destructors may still be
     * referenced by OpenBLAS threads at exit. Only our bookkeeping goes. */
    free(r->paths[i]);
  }
  memset(r, 0, sizeof(*r));
}

/* ---- kernels ------------------------------------------------------------ */

/* 0, or MN_ENOMEM. */
static int add_kernel(mn_registry_t *r, const mk_kernel_t *k) {
  if (r->nkernels + 1 > r->nbuckets) {
    size_t nb = r->nbuckets ? r->nbuckets * 2 : 64;
    mn_kentry_t **b = calloc(nb, sizeof(*b));
    if (b == NULL) return MN_ENOMEM;
    for (size_t i = 0; i < r->nbuckets; i++) {
      mn_kentry_t *e = r->buckets[i];
      while (e != NULL) {
        mn_kentry_t *next = e->next;
        size_t j = hash_name(e->k->name, e->len) & (nb - 1);
        e->next = b[j];
        b[j] = e;
        e = next;
      }
    }
    free(r->buckets);
    r->buckets = b;
    r->nbuckets = nb;
  }
  mn_kentry_t *e = malloc(sizeof(*e));
  if (e == NULL) return MN_ENOMEM;
  e->k = k;
  e->len = strlen(k->name);
  size_t j = hash_name(k->name, e->len) & (r->nbuckets - 1);
  e->next = r->buckets[j];
  r->buckets[j] = e;
  r->nkernels++;
  return 0;
}

const mk_kernel_t *mn_registry_find(const mn_registry_t *r, const char *name, size_t len) {
  if (r->nbuckets == 0) return NULL;
  for (mn_kentry_t *e = r->buckets[hash_name(name, len) & (r->nbuckets - 1)]; e; e = e->next)
    if (e->len == len && memcmp(e->k->name, name, len) == 0) return e->k;
  return NULL;
}

/* Finds the file for a library name; returns a malloc'd canonical path (so
 * two spellings of one file load it once) or NULL. */
static char *locate(const mn_registry_t *r, const char *name) {
  char path[4096];
  /* ship:<hash>: a library the controller shipped, in the agent's cache (host/agent/agent_ship.c). One whose
   * verification record no longer matches (written to since it was hashed) is not found: the controller then
   * asks the agent again, which hashes it and fetches it anew if it changed (ProcMesh:load). */
  const char *cache = getenv("MONARCH_SHIP_CACHE");
  if (strncmp(name, "ship:", 5) == 0 && strlen(name) == 5 + 64 && strchr(name + 5, '/') == NULL && cache != NULL) {
    /* Its name is canonical already (one per content): no realpath's walk, and the record's stat is the check. */
    snprintf(path, sizeof(path), "%s/%s", cache, name + 5);
    return mn_ship_record_ok(path) ? strdup(path) : NULL;
  }
  if (strchr(name, '/') != NULL) return access(name, R_OK) == 0 ? realpath(name, NULL) : NULL;
  const char *env = getenv("MONARCH_KERNEL_PATH");
  if (env != NULL) {
    const char *p = env;
    while (*p) {
      const char *colon = strchr(p, ':');
      size_t n = colon ? (size_t)(colon - p) : strlen(p);
      if (n > 0) {
        snprintf(path, sizeof(path), "%.*s/%s.so", (int)n, p, name);
        if (access(path, R_OK) == 0) return realpath(path, NULL);
      }
      p += n + (colon ? 1 : 0);
    }
  }
  if (r->prefix != NULL) {
    snprintf(path, sizeof(path), "%s/lib/monarch/%s.so", r->prefix, name);
    if (access(path, R_OK) == 0) return realpath(path, NULL);
  }
  return NULL;
}

const mk_library_t *mn_registry_load(mn_registry_t *r, const char *name, char *err, size_t errlen) {
  char *path = locate(r, name);
  if (path == NULL) {
    snprintf(err, errlen, "kernel library '%s' not found (searched MONARCH_KERNEL_PATH and %s/lib/monarch)",
             name, r->prefix ? r->prefix : "?");
    return NULL;
  }
  for (int i = 0; i < r->nlibs; i++) {
    if (strcmp(r->paths[i], path) == 0) {
      free(path);
      return r->libs[i];
    }
  }
  if (r->nlibs == MN_MAX_LIBS) {
    snprintf(err, errlen, "cannot load '%s': MN_MAX_LIBS (%d) libraries already loaded", name, MN_MAX_LIBS);
    free(path);
    return NULL;
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    snprintf(err, errlen, "cannot load kernel library '%s': %s", name, dlerror());
    free(path);
    return NULL;
  }
  mk_library_fn_t fn = (mk_library_fn_t)dlsym(h, MK_LIBRARY_SYMBOL);
  const mk_library_t *lib = fn ? fn() : NULL;
  if (lib == NULL || lib->abi_version < MK_ABI_VERSION_MIN || lib->abi_version > MK_ABI_VERSION || lib->count < 0) {
    snprintf(err, errlen, "'%s' is not a monarch kernel library (no %s() or ABI %d, want %d..%d)", path,
             MK_LIBRARY_SYMBOL, lib ? lib->abi_version : -1, MK_ABI_VERSION_MIN, MK_ABI_VERSION);
    dlclose(h);
    free(path);
    return NULL;
  }
  for (int i = 0; i < lib->count; i++) {
    const mk_kernel_t *k = &lib->kernels[i];
    if (k->name == NULL || k->fn == NULL || k->signature == NULL ||
        strlen(k->name) == 0 || k->name[0] == '_') {
      snprintf(err, errlen, "library '%s' kernel #%d has no name, function or signature (or a reserved '_' name)",
               name, i);
      dlclose(h);
      free(path);
      return NULL;
    }
  }
  for (int i = 0; i < lib->count; i++) {
    /* A later library's kernel of the same name shadows the earlier one. */
    if (add_kernel(r, &lib->kernels[i]) != 0) {
      snprintf(err, errlen, "out of memory registering kernels of '%s'", name);
      free(path);
      return NULL;
    }
  }
  r->handles[r->nlibs] = h;
  r->libs[r->nlibs] = lib;
  r->paths[r->nlibs] = path;
  r->nlibs++;
  return lib;
}

/* ---- tensors ------------------------------------------------------------ */

/* The registry's own address marks a deleted slot so probing continues past it. */
#define TOMB(r) ((mk_tensor_t *)(r))

static size_t slot_of(uint64_t id, size_t cap) { return (size_t)(id * 0x9E3779B97F4A7C15ull) & (cap - 1); }

/* Rehashes into a table sized for the live tensors, dropping freed slots; 0 or MN_ENOMEM. */
static int grow_tensors(mn_registry_t *r) {
  size_t cap = 256;
  while (cap < (r->ntensors + 1) * 4) cap *= 2;
  mk_tensor_t **s = calloc(cap, sizeof(*s));
  if (s == NULL) return MN_ENOMEM;
  for (size_t i = 0; i < r->tcap; i++) {
    mk_tensor_t *t = r->tslots[i];
    if (t == NULL || t == TOMB(r)) continue;
    size_t j = slot_of(t->id, cap);
    while (s[j] != NULL) j = (j + 1) & (cap - 1);
    s[j] = t;
  }
  free(r->tslots);
  r->tslots = s;
  r->tcap = cap;
  r->ntombs = 0;
  return 0;
}

mk_tensor_t *mn_tensor_get(const mn_registry_t *r, uint64_t id) {
  if (r->tcap == 0) return NULL;
  for (size_t j = slot_of(id, r->tcap), n = 0; n < r->tcap; j = (j + 1) & (r->tcap - 1), n++) {
    mk_tensor_t *t = r->tslots[j];
    if (t == NULL) return NULL;
    if (t != TOMB(r) && t->id == id) return t;
  }
  return NULL;
}

mk_tensor_t *mn_tensor_new(mn_registry_t *r, uint64_t id, mk_dtype_t dtype, int ndim,
                           const int64_t *shape, char *err, size_t errlen) {
  return mn_tensor_new_on(r, id, dtype, ndim, shape, -1, err, errlen);
}

mk_tensor_t *mn_tensor_new_on(mn_registry_t *r, uint64_t id, mk_dtype_t dtype, int ndim,
                              const int64_t *shape, int device, char *err, size_t errlen) {
  int64_t numel = 1;
  if (ndim < 0 || ndim > MK_MAX_DIMS) {
    snprintf(err, errlen, "tensor has %d dimensions; MK_MAX_DIMS is %d", ndim, MK_MAX_DIMS);
    return NULL;
  }
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || (shape[i] > 0 && numel > INT64_MAX / 8 / shape[i])) {
      snprintf(err, errlen, "tensor dimension %d has invalid size %lld", i + 1, (long long)shape[i]);
      return NULL;
    }
    numel *= shape[i];
  }
  if (mn_tensor_get(r, id) != NULL) {
    snprintf(err, errlen, "tensor %llu already exists", (unsigned long long)id);
    return NULL;
  }
  if (device >= 0 && device_ops == NULL) {
    snprintf(err, errlen, "this proc cannot hold tensors on cuda:%d (no device support registered)", device);
    return NULL;
  }
  if (r->ntensors >= MN_MAX_TENSORS) {
    snprintf(err, errlen, "MN_MAX_TENSORS (%d) tensors already live on this proc", MN_MAX_TENSORS);
    return NULL;
  }
  if ((r->ntensors + r->ntombs + 1) * 2 > r->tcap && grow_tensors(r) != 0) goto nomem;
  mk_tensor_t *t = calloc(1, sizeof(*t));
  if (t == NULL) goto nomem;
  t->nbytes = (size_t)numel * mk_dtype_size(dtype);
  if (device >= 0) {
    t->data = device_ops->alloc(device, t->nbytes, err, errlen);
    if (t->data == NULL) {
      free(t);
      return NULL;
    }
  } else {
    /* 64-byte alignment keeps SIMD kernels and later zero-copy sends happy. */
    if (posix_memalign(&t->data, 64, t->nbytes ? t->nbytes : 64) != 0) {
      free(t);
      goto nomem;
    }
    memset(t->data, 0, t->nbytes);
  }
  t->dtype = dtype;
  t->ndim = ndim;
  memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  t->numel = numel;
  t->device = device >= 0 ? device : -1;
  t->id = id;
  size_t j = slot_of(id, r->tcap);
  while (r->tslots[j] != NULL && r->tslots[j] != TOMB(r)) j = (j + 1) & (r->tcap - 1);
  if (r->tslots[j] == TOMB(r)) r->ntombs--;
  r->tslots[j] = t;
  r->ntensors++;
  r->tensor_bytes += t->nbytes;
  return t;
nomem:
  snprintf(err, errlen, "out of memory allocating a %s tensor of %lld elements", mn_dtype_name(dtype),
           (long long)numel);
  return NULL;
}

int mn_tensor_free(mn_registry_t *r, uint64_t id) {
  if (r->tcap == 0) return MN_ENOTFOUND;
  for (size_t j = slot_of(id, r->tcap), n = 0; n < r->tcap; j = (j + 1) & (r->tcap - 1), n++) {
    mk_tensor_t *t = r->tslots[j];
    if (t == NULL) return MN_ENOTFOUND;
    if (t != TOMB(r) && t->id == id) {
      r->tensor_bytes -= t->nbytes;
      tensor_release(t);
      r->tslots[j] = TOMB(r);
      r->ntensors--;
      r->ntombs++;
      return 0;
    }
  }
  return MN_ENOTFOUND;
}
