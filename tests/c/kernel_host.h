/*
 * kernel_host.h - what test_kernels.c and test_faulty.c share: a small
 * recording host (an mk_api_t that keeps what a kernel returned or said),
 * the signature check the proc makes before a call, and the "basic" and
 * "faulty" libraries loaded with dlopen exactly as the proc loads them
 * (directory from MONARCH_KERNEL_DIR, default build/lib/monarch), so the
 * tests check the built .so files and their exported tables.
 */
#ifndef MN_TEST_KERNEL_HOST_H
#define MN_TEST_KERNEL_HOST_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "monarch_kernel.h"

/* ---- recording host ---------------------------------------------------- */

#define MAX_RESULTS 32
#define MAX_SCRATCH 16

typedef struct {
  mk_arg_type_t type;
  int b;
  int64_t i;
  double num;
  char *str; /* malloc'd copy for strings and bytes */
  size_t len;
} result_t;

typedef struct {
  mk_ctx_t ctx;
  result_t res[MAX_RESULTS];
  int nres;
  char err[1024];
  int nerr;
  int cancel_after; /* cancelled() turns 1 on this poll (1 = first); 0: never */
  int polls;
  void *scratch[MAX_SCRATCH];
  int nscratch;
} rec_t;

static rec_t rec;

static inline rec_t *rec_of(mk_ctx_t *ctx) { return ctx->host; }

static inline result_t *push(mk_ctx_t *ctx, mk_arg_type_t type) {
  rec_t *r = rec_of(ctx);
  assert_true(r->nres < MAX_RESULTS);
  result_t *res = &r->res[r->nres++];
  memset(res, 0, sizeof(*res));
  res->type = type;
  return res;
}

static inline int h_nil(mk_ctx_t *ctx) { push(ctx, MK_ARG_NIL); return 0; }
static inline int h_bool(mk_ctx_t *ctx, int b) { push(ctx, MK_ARG_BOOL)->b = b; return 0; }
static inline int h_int(mk_ctx_t *ctx, int64_t i) { push(ctx, MK_ARG_INT)->i = i; return 0; }
static inline int h_number(mk_ctx_t *ctx, double d) { push(ctx, MK_ARG_NUMBER)->num = d; return 0; }

static inline int h_blob(mk_ctx_t *ctx, mk_arg_type_t type, const void *p, size_t len) {
  result_t *res = push(ctx, type);
  res->str = malloc(len + 1);
  assert_non_null(res->str);
  if (len)
    memcpy(res->str, p, len);
  res->str[len] = '\0';
  res->len = len;
  return 0;
}

static inline int h_string(mk_ctx_t *ctx, const char *s, size_t len) { return h_blob(ctx, MK_ARG_STRING, s, len); }
static inline int h_bytes(mk_ctx_t *ctx, const void *p, size_t len) { return h_blob(ctx, MK_ARG_BYTES, p, len); }

static inline int h_error(mk_ctx_t *ctx, const char *fmt, ...) {
  rec_t *r = rec_of(ctx);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof(r->err), fmt, ap);
  va_end(ap);
  r->nerr++;
  return -1;
}

static inline void *h_scratch(mk_ctx_t *ctx, size_t n) {
  rec_t *r = rec_of(ctx);
  if (r->nscratch == MAX_SCRATCH)
    return NULL;
  return r->scratch[r->nscratch++] = malloc(n ? n : 1);
}

static inline int h_cancelled(mk_ctx_t *ctx) {
  rec_t *r = rec_of(ctx);
  r->polls++;
  return r->cancel_after > 0 && r->polls >= r->cancel_after;
}

/* No group is ever passed here: the collectives only have to exist. */
static inline int h_all_reduce(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int op) { return -1; }
static inline int h_broadcast(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int root) { return -1; }
static inline int h_all_gather(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *s, mk_tensor_t *d) { return -1; }
static inline int h_reduce_scatter(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *s, mk_tensor_t *d, int op) {
  return -1;
}
static inline int h_barrier(mk_ctx_t *ctx, const mk_group_t *g) { return -1; }

static const mk_api_t api = {
  h_nil, h_bool, h_int, h_number, h_string, h_bytes, h_error, h_scratch, h_cancelled,
  h_all_reduce, h_broadcast, h_all_gather, h_reduce_scatter, h_barrier,
};

static inline void rec_reset(void) {
  for (int i = 0; i < rec.nres; i++)
    free(rec.res[i].str);
  for (int i = 0; i < rec.nscratch; i++)
    free(rec.scratch[i]);
  memset(&rec, 0, sizeof(rec));
  rec.ctx.api = &api;
  rec.ctx.rank = 0;
  rec.ctx.world = 1;
  rec.ctx.device = -1;
  rec.ctx.host = &rec;
}

/* ---- signature checking, as the host does before a call --------------- */

static inline int letter_ok(char c) { return c && strchr("nisbtBa", c) != NULL; }

static inline int type_ok(char c, mk_arg_type_t t) {
  switch (c) {
  case 'n': return t == MK_ARG_NUMBER;
  case 'i': return t == MK_ARG_INT;
  case 's': return t == MK_ARG_STRING;
  case 'b': return t == MK_ARG_BYTES;
  case 't': return t == MK_ARG_TENSOR;
  case 'B': return t == MK_ARG_BOOL;
  case 'a': return 1;
  default: return 0;
  }
}

/* Letters, each optionally followed by '?', then an optional final '*'. */
static inline int sig_valid(const char *sig) {
  for (const char *p = sig; *p; p++) {
    if (*p == '*')
      return p[1] == '\0';
    if (!letter_ok(*p))
      return 0;
    if (p[1] == '?')
      p++;
  }
  return 1;
}

/* Would the host let argv through? Guards the tests against calling a kernel
 * in a way it could never be called for real. */
static inline int sig_accepts(const char *sig, int argc, const mk_arg_t *argv) {
  int i = 0, optional = 0;
  for (const char *p = sig; *p; p++) {
    if (*p == '*')
      return 1;
    if (p[1] == '?')
      optional = 1;
    if (i == argc)
      return optional;
    if (!type_ok(*p, argv[i].type))
      return 0;
    i++;
    if (p[1] == '?')
      p++;
  }
  return i == argc;
}

/* ---- library loading and calling -------------------------------------- */

static void *basic_handle, *faulty_handle;
static const mk_library_t *basic, *faulty;

static inline const mk_library_t *load(const char *file, void **handle) {
  const char *dir = getenv("MONARCH_KERNEL_DIR");
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir && *dir ? dir : "build/lib/monarch", file);
  *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (*handle == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    return NULL;
  }
  mk_library_fn_t fn;
  /* POSIX blesses this conversion for dlsym results; the memcpy keeps -Wpedantic quiet too. */
  void *sym = dlsym(*handle, MK_LIBRARY_SYMBOL);
  if (sym == NULL) {
    fprintf(stderr, "dlsym %s in %s: %s\n", MK_LIBRARY_SYMBOL, path, dlerror());
    return NULL;
  }
  memcpy(&fn, &sym, sizeof(fn));
  return fn();
}

static inline int group_setup(void **state) {
  (void)state;
  basic = load("basic.so", &basic_handle);
  faulty = load("faulty.so", &faulty_handle);
  rec_reset();
  return basic && faulty ? 0 : -1;
}

static inline int group_teardown(void **state) {
  (void)state;
  rec_reset();
  if (basic_handle)
    dlclose(basic_handle);
  if (faulty_handle)
    dlclose(faulty_handle);
  return 0;
}

static inline const mk_kernel_t *find(const mk_library_t *lib, const char *name) {
  for (int i = 0; i < lib->count; i++)
    if (strcmp(lib->kernels[i].name, name) == 0)
      return &lib->kernels[i];
  return NULL;
}

/* Calls lib.name(argv) on a fresh recorder, keeping rank/world/cancel settings. */
static inline int call(const mk_library_t *lib, const char *name, int argc, const mk_arg_t *argv) {
  int rank = rec.ctx.rank, world = rec.ctx.world, cancel_after = rec.cancel_after;
  rec_reset();
  rec.ctx.rank = rank;
  rec.ctx.world = world;
  rec.cancel_after = cancel_after;
  rec.ctx.kernel = name;

  const mk_kernel_t *k = find(lib, name);
  assert_non_null(k);
  assert_true(sig_accepts(k->signature, argc, argv));
  int rc = k->fn(&rec.ctx, argc, argv);
  if (rc == 0) {
    assert_int_equal(rec.nerr, 0);
  } else {
    assert_int_equal(rc, -1);
    assert_int_equal(rec.nerr, 1);
    /* basic promises that every message names the kernel first. */
    if (lib == basic) {
      size_t n = strlen(name);
      assert_true(strncmp(rec.err, name, n) == 0 && rec.err[n] == ':');
    }
  }
  return rc;
}

#define CALL(lib, name, ...) \
  call((lib), (name), (int)(sizeof((mk_arg_t[]){ __VA_ARGS__ }) / sizeof(mk_arg_t)), \
       (mk_arg_t[]){ __VA_ARGS__ })
#define CALL0(lib, name) call((lib), (name), 0, NULL)

#define A_NIL ((mk_arg_t){ .type = MK_ARG_NIL })
#define A_BOOL(x) ((mk_arg_t){ .type = MK_ARG_BOOL, .v.b = (x) })
#define A_INT(x) ((mk_arg_t){ .type = MK_ARG_INT, .v.i = (x) })
#define A_NUM(x) ((mk_arg_t){ .type = MK_ARG_NUMBER, .v.num = (x) })
#define A_STR(s, n) ((mk_arg_t){ .type = MK_ARG_STRING, .v.str = { (s), (n) } })
#define A_BYTES(s, n) ((mk_arg_t){ .type = MK_ARG_BYTES, .v.str = { (s), (n) } })
#define A_T(t) ((mk_arg_t){ .type = MK_ARG_TENSOR, .v.tensor = (t) })

static uint64_t next_id = 100;

/* A CPU tensor over caller-owned data; d1 < 0 makes it 1-D. */
static inline mk_tensor_t tensor(mk_dtype_t dt, void *data, int64_t d0, int64_t d1) {
  mk_tensor_t t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dt;
  t.ndim = d1 < 0 ? 1 : 2;
  t.shape[0] = d0;
  t.shape[1] = d1 < 0 ? 0 : d1;
  t.numel = d1 < 0 ? d0 : d0 * d1;
  t.nbytes = (size_t)t.numel * mk_dtype_size(dt);
  t.device = -1;
  t.id = next_id++;
  return t;
}

static inline void assert_number(int idx, double want) {
  assert_true(idx < rec.nres);
  assert_int_equal(rec.res[idx].type, MK_ARG_NUMBER);
  if (rec.res[idx].num != want)
    fail_msg("result %d: got %.17g, want %.17g", idx, rec.res[idx].num, want);
}

static inline void assert_floats(const float *got, const float *want, int n) {
  for (int i = 0; i < n; i++)
    if (got[i] != want[i])
      fail_msg("element %d: got %.9g, want %.9g", i, (double)got[i], (double)want[i]);
}

static inline void assert_doubles(const double *got, const double *want, int n) {
  for (int i = 0; i < n; i++)
    if (got[i] != want[i])
      fail_msg("element %d: got %.17g, want %.17g", i, got[i], want[i]);
}

/* ---- tables ------------------------------------------------------------ */

static inline void check_table(const mk_library_t *lib, const char *name, const char *const *expect) {
  assert_non_null(lib);
  assert_int_equal(lib->abi_version, MK_ABI_VERSION);
  assert_string_equal(lib->name, name);
  assert_non_null(lib->kernels);
  int nexpect = 0;
  while (expect[nexpect * 2])
    nexpect++;
  assert_int_equal(lib->count, nexpect);
  for (int i = 0; i < lib->count; i++) {
    const mk_kernel_t *k = &lib->kernels[i];
    assert_non_null(k->name);
    assert_non_null(k->fn);
    assert_non_null(k->signature);
    assert_non_null(k->doc);
    assert_true(k->name[0] != '\0');
    assert_true(k->doc[0] != '\0');
    assert_null(strchr(k->doc, '\n'));
    if (!sig_valid(k->signature))
      fail_msg("%s.%s: bad signature \"%s\"", name, k->name, k->signature);
    for (int j = 0; j < i; j++)
      assert_string_not_equal(k->name, lib->kernels[j].name);
  }
  for (int i = 0; i < nexpect; i++) {
    const mk_kernel_t *k = find(lib, expect[2 * i]);
    if (k == NULL)
      fail_msg("%s has no kernel %s", name, expect[2 * i]);
    assert_string_equal(k->signature, expect[2 * i + 1]);
  }
}


#endif
