/*
 * test_kernels.c - unit tests for the "basic" and "faulty" kernel libraries.
 *
 * The libraries are loaded with dlopen exactly as the proc would load them
 * (directory from MONARCH_KERNEL_DIR, default build/lib/monarch) and called
 * through a small recording mk_api_t, so these tests check the built .so
 * files and their exported table, not a statically linked copy.
 */
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

static rec_t *rec_of(mk_ctx_t *ctx) { return ctx->host; }

static result_t *push(mk_ctx_t *ctx, mk_arg_type_t type) {
  rec_t *r = rec_of(ctx);
  assert_true(r->nres < MAX_RESULTS);
  result_t *res = &r->res[r->nres++];
  memset(res, 0, sizeof(*res));
  res->type = type;
  return res;
}

static int h_nil(mk_ctx_t *ctx) { push(ctx, MK_ARG_NIL); return 0; }
static int h_bool(mk_ctx_t *ctx, int b) { push(ctx, MK_ARG_BOOL)->b = b; return 0; }
static int h_int(mk_ctx_t *ctx, int64_t i) { push(ctx, MK_ARG_INT)->i = i; return 0; }
static int h_number(mk_ctx_t *ctx, double d) { push(ctx, MK_ARG_NUMBER)->num = d; return 0; }

static int h_blob(mk_ctx_t *ctx, mk_arg_type_t type, const void *p, size_t len) {
  result_t *res = push(ctx, type);
  res->str = malloc(len + 1);
  assert_non_null(res->str);
  if (len)
    memcpy(res->str, p, len);
  res->str[len] = '\0';
  res->len = len;
  return 0;
}

static int h_string(mk_ctx_t *ctx, const char *s, size_t len) { return h_blob(ctx, MK_ARG_STRING, s, len); }
static int h_bytes(mk_ctx_t *ctx, const void *p, size_t len) { return h_blob(ctx, MK_ARG_BYTES, p, len); }

static int h_error(mk_ctx_t *ctx, const char *fmt, ...) {
  rec_t *r = rec_of(ctx);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof(r->err), fmt, ap);
  va_end(ap);
  r->nerr++;
  return -1;
}

static void *h_scratch(mk_ctx_t *ctx, size_t n) {
  rec_t *r = rec_of(ctx);
  if (r->nscratch == MAX_SCRATCH)
    return NULL;
  return r->scratch[r->nscratch++] = malloc(n ? n : 1);
}

static int h_cancelled(mk_ctx_t *ctx) {
  rec_t *r = rec_of(ctx);
  r->polls++;
  return r->cancel_after > 0 && r->polls >= r->cancel_after;
}

/* No group is ever passed here: the collectives only have to exist. */
static int h_all_reduce(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int op) { return -1; }
static int h_broadcast(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int root) { return -1; }
static int h_all_gather(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *s, mk_tensor_t *d) { return -1; }
static int h_reduce_scatter(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *s, mk_tensor_t *d, int op) {
  return -1;
}
static int h_barrier(mk_ctx_t *ctx, const mk_group_t *g) { return -1; }

static const mk_api_t api = {
  h_nil, h_bool, h_int, h_number, h_string, h_bytes, h_error, h_scratch, h_cancelled,
  h_all_reduce, h_broadcast, h_all_gather, h_reduce_scatter, h_barrier,
};

static void rec_reset(void) {
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

static int letter_ok(char c) { return c && strchr("nisbtBa", c) != NULL; }

static int type_ok(char c, mk_arg_type_t t) {
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
static int sig_valid(const char *sig) {
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
static int sig_accepts(const char *sig, int argc, const mk_arg_t *argv) {
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

static const mk_library_t *load(const char *file, void **handle) {
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

static int group_setup(void **state) {
  (void)state;
  basic = load("basic.so", &basic_handle);
  faulty = load("faulty.so", &faulty_handle);
  rec_reset();
  return basic && faulty ? 0 : -1;
}

static int group_teardown(void **state) {
  (void)state;
  rec_reset();
  if (basic_handle)
    dlclose(basic_handle);
  if (faulty_handle)
    dlclose(faulty_handle);
  return 0;
}

static const mk_kernel_t *find(const mk_library_t *lib, const char *name) {
  for (int i = 0; i < lib->count; i++)
    if (strcmp(lib->kernels[i].name, name) == 0)
      return &lib->kernels[i];
  return NULL;
}

/* Calls lib.name(argv) on a fresh recorder, keeping rank/world/cancel settings. */
static int call(const mk_library_t *lib, const char *name, int argc, const mk_arg_t *argv) {
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
static mk_tensor_t tensor(mk_dtype_t dt, void *data, int64_t d0, int64_t d1) {
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

static void assert_number(int idx, double want) {
  assert_true(idx < rec.nres);
  assert_int_equal(rec.res[idx].type, MK_ARG_NUMBER);
  if (rec.res[idx].num != want)
    fail_msg("result %d: got %.17g, want %.17g", idx, rec.res[idx].num, want);
}

static void assert_floats(const float *got, const float *want, int n) {
  for (int i = 0; i < n; i++)
    if (got[i] != want[i])
      fail_msg("element %d: got %.9g, want %.9g", i, (double)got[i], (double)want[i]);
}

static void assert_doubles(const double *got, const double *want, int n) {
  for (int i = 0; i < n; i++)
    if (got[i] != want[i])
      fail_msg("element %d: got %.17g, want %.17g", i, got[i], want[i]);
}

/* ---- tables ------------------------------------------------------------ */

static void check_table(const mk_library_t *lib, const char *name, const char *const *expect) {
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

static void test_basic_table(void **state) {
  (void)state;
  static const char *const expect[] = {
    "noop", "", "echo", "*", "rank", "", "fill", "tn", "iota", "tn?", "axpy", "ntt",
    "copy", "tt", "scale", "tn", "sum", "t", "dot", "tt", "sgemm", "tttn?nBB", "sleep", "n", NULL,
  };
  check_table(basic, "basic", expect);
  /* The same table comes back on every call (the host may call it more than once). */
  mk_library_fn_t fn;
  void *sym = dlsym(basic_handle, MK_LIBRARY_SYMBOL);
  memcpy(&fn, &sym, sizeof(fn));
  assert_ptr_equal(fn(), basic);
}

static void test_faulty_table(void **state) {
  (void)state;
  static const char *const expect[] = {
    "segv", "", "abort", "", "exit", "i", "fail", "s", "spin", "n",
    "hang", "", "print", "s", "eprint", "s", "bump", "", "bumps", "", NULL,
  };
  check_table(faulty, "faulty", expect);
}

static void test_signature_checker(void **state) {
  (void)state;
  /* The in-test checker guards every other test, so it must itself reject. */
  mk_tensor_t t = tensor(MK_F32, NULL, 0, -1);
  mk_arg_t three[] = { A_T(&t), A_T(&t), A_T(&t) };
  mk_arg_t seven[] = { A_T(&t), A_T(&t), A_T(&t), A_NUM(1), A_NUM(0), A_BOOL(0), A_BOOL(1) };
  assert_true(sig_accepts("tttn?nBB", 3, three));
  assert_true(sig_accepts("tttn?nBB", 7, seven));
  assert_false(sig_accepts("tttn?nBB", 2, three));
  assert_false(sig_accepts("tttn?nBB", 8, seven));
  assert_false(sig_accepts("tn", 2, three));
  assert_true(sig_accepts("tn?", 1, three));
  assert_true(sig_accepts("*", 3, three));
  assert_false(sig_accepts("", 1, three));
  assert_false(sig_valid("tx"));
  assert_false(sig_valid("*t"));
  assert_true(sig_valid("tttn?nBB"));
}

/* ---- basic ------------------------------------------------------------- */

static void test_noop(void **state) {
  (void)state;
  assert_int_equal(CALL0(basic, "noop"), 0);
  assert_int_equal(rec.nres, 0);
}

static void test_echo(void **state) {
  (void)state;
  mk_tensor_t t = tensor(MK_F32, NULL, 0, -1);
  t.id = 0x1234567890ULL;
  static const char s[] = "hi\0there"; /* embedded NUL: lengths, not strlen */
  static const unsigned char bytes[] = { 0x00, 0xff, 0x7f };
  assert_int_equal(CALL(basic, "echo", A_NIL, A_BOOL(1), A_BOOL(0), A_INT(-7), A_NUM(2.5),
                        A_STR(s, 8), A_BYTES((const char *)bytes, 3), A_T(&t), A_INT(INT64_MIN)),
                   0);
  assert_int_equal(rec.nres, 9);
  assert_int_equal(rec.res[0].type, MK_ARG_NIL);
  assert_int_equal(rec.res[1].type, MK_ARG_BOOL);
  assert_true(rec.res[1].b);
  assert_int_equal(rec.res[2].type, MK_ARG_BOOL);
  assert_false(rec.res[2].b);
  assert_int_equal(rec.res[3].type, MK_ARG_INT);
  assert_int_equal(rec.res[3].i, -7);
  assert_number(4, 2.5);
  assert_int_equal(rec.res[5].type, MK_ARG_STRING);
  assert_int_equal(rec.res[5].len, 8);
  assert_memory_equal(rec.res[5].str, s, 8);
  assert_int_equal(rec.res[6].type, MK_ARG_BYTES);
  assert_int_equal(rec.res[6].len, 3);
  assert_memory_equal(rec.res[6].str, bytes, 3);
  assert_int_equal(rec.res[7].type, MK_ARG_INT);
  assert_int_equal(rec.res[7].i, 0x1234567890LL);
  assert_int_equal(rec.res[8].type, MK_ARG_INT);
  assert_true(rec.res[8].i == INT64_MIN);

  assert_int_equal(CALL0(basic, "echo"), 0);
  assert_int_equal(rec.nres, 0);
}

static void test_rank(void **state) {
  (void)state;
  rec.ctx.rank = 3;
  rec.ctx.world = 8;
  assert_int_equal(CALL0(basic, "rank"), 0);
  assert_int_equal(rec.nres, 2);
  assert_int_equal(rec.res[0].type, MK_ARG_INT);
  assert_int_equal(rec.res[0].i, 3);
  assert_int_equal(rec.res[1].type, MK_ARG_INT);
  assert_int_equal(rec.res[1].i, 8);
  rec.ctx.rank = 0;
  rec.ctx.world = 1;
}

static void test_fill_sum_f32(void **state) {
  (void)state;
  float d[6] = { 9, 9, 9, 9, 9, 9 };
  mk_tensor_t t = tensor(MK_F32, d, 2, 3);
  assert_int_equal(CALL(basic, "fill", A_T(&t), A_NUM(1.5)), 0);
  assert_int_equal(rec.nres, 0);
  assert_floats(d, (float[]){ 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f }, 6);
  assert_int_equal(CALL(basic, "sum", A_T(&t)), 0);
  assert_int_equal(rec.nres, 1);
  assert_number(0, 9.0);
}

static void test_fill_sum_f64(void **state) {
  (void)state;
  double d[5] = { 0 };
  mk_tensor_t t = tensor(MK_F64, d, 5, -1);
  assert_int_equal(CALL(basic, "fill", A_T(&t), A_NUM(-0.25)), 0);
  assert_doubles(d, (double[]){ -0.25, -0.25, -0.25, -0.25, -0.25 }, 5);
  assert_int_equal(CALL(basic, "sum", A_T(&t)), 0);
  assert_number(0, -1.25);
  /* f64 keeps what f32 would round away. */
  assert_int_equal(CALL(basic, "fill", A_T(&t), A_NUM(0.1)), 0);
  assert_true(d[4] == 0.1);
}

static void test_fill_sum_ints(void **state) {
  (void)state;
  int32_t a[4];
  int64_t b[3];
  uint8_t c[10];
  mk_tensor_t ta = tensor(MK_I32, a, 2, 2), tb = tensor(MK_I64, b, 3, -1), tc = tensor(MK_U8, c, 10, -1);

  assert_int_equal(CALL(basic, "fill", A_T(&ta), A_NUM(-3)), 0);
  for (int i = 0; i < 4; i++)
    assert_int_equal(a[i], -3);
  assert_int_equal(CALL(basic, "sum", A_T(&ta)), 0);
  assert_number(0, -12.0);

  assert_int_equal(CALL(basic, "fill", A_T(&tb), A_NUM(1e12)), 0);
  for (int i = 0; i < 3; i++)
    assert_true(b[i] == 1000000000000LL);
  assert_int_equal(CALL(basic, "sum", A_T(&tb)), 0);
  assert_number(0, 3e12);

  assert_int_equal(CALL(basic, "fill", A_T(&tc), A_NUM(255)), 0);
  for (int i = 0; i < 10; i++)
    assert_int_equal(c[i], 255);
  assert_int_equal(CALL(basic, "sum", A_T(&tc)), 0);
  assert_number(0, 2550.0);

  /* Values an integer dtype cannot hold are refused, not wrapped. */
  assert_int_equal(CALL(basic, "fill", A_T(&tc), A_NUM(256)), -1);
  assert_string_equal(rec.err, "fill: value 256 does not fit in u8");
  assert_int_equal(c[0], 255);
  assert_int_equal(CALL(basic, "fill", A_T(&ta), A_NUM(1.5)), -1);
  assert_string_equal(rec.err, "fill: value 1.5 does not fit in i32");
  assert_int_equal(CALL(basic, "fill", A_T(&ta), A_NUM(NAN)), -1);
  assert_int_equal(CALL(basic, "fill", A_T(&tb), A_NUM(9223372036854775808.0)), -1);
}

static void test_iota(void **state) {
  (void)state;
  float f[5];
  double d[4];
  int32_t i32[3];
  int64_t i64[3];
  uint8_t u8[7];
  mk_tensor_t tf = tensor(MK_F32, f, 5, -1), td = tensor(MK_F64, d, 2, 2);
  mk_tensor_t ti = tensor(MK_I32, i32, 3, -1), tl = tensor(MK_I64, i64, 3, -1);
  mk_tensor_t tu = tensor(MK_U8, u8, 7, -1);

  assert_int_equal(CALL(basic, "iota", A_T(&tf)), 0);
  assert_floats(f, (float[]){ 0, 1, 2, 3, 4 }, 5);
  assert_int_equal(CALL(basic, "iota", A_T(&td), A_NUM(10.5)), 0);
  assert_doubles(d, (double[]){ 10.5, 11.5, 12.5, 13.5 }, 4);
  assert_int_equal(CALL(basic, "sum", A_T(&td)), 0);
  assert_number(0, 48.0);
  assert_int_equal(CALL(basic, "iota", A_T(&ti), A_NUM(-2)), 0);
  assert_int_equal(i32[0], -2);
  assert_int_equal(i32[1], -1);
  assert_int_equal(i32[2], 0);
  assert_int_equal(CALL(basic, "iota", A_T(&tl), A_NUM(4e15)), 0);
  assert_true(i64[2] == 4000000000000002LL);
  assert_int_equal(CALL(basic, "iota", A_T(&tu), A_NUM(249)), 0);
  assert_int_equal(u8[0], 249);
  assert_int_equal(u8[6], 255);
  /* 250..256 would wrap the last element. */
  assert_int_equal(CALL(basic, "iota", A_T(&tu), A_NUM(250)), -1);
  assert_string_equal(rec.err, "iota: 7 values from 250 do not fit in u8");
  assert_int_equal(u8[0], 249);
}

static void test_copy(void **state) {
  (void)state;
  int32_t a[3] = { 1, -2, 3 }, b[3] = { 0 };
  mk_tensor_t ta = tensor(MK_I32, a, 3, -1), tb = tensor(MK_I32, b, 3, -1);
  assert_int_equal(CALL(basic, "copy", A_T(&ta), A_T(&tb)), 0);
  assert_memory_equal(a, b, sizeof(a));
  float f[3] = { 0 };
  mk_tensor_t tf = tensor(MK_F32, f, 3, -1);
  assert_int_equal(CALL(basic, "copy", A_T(&ta), A_T(&tf)), -1);
  assert_string_equal(rec.err, "copy: src is i32[3] but dst is f32[3] (need the same dtype and element count)");
}

static void test_axpy(void **state) {
  (void)state;
  float xf[3] = { 1, 2, 3 }, yf[3] = { 10, 20, 30 };
  double xd[2] = { 4, -8 }, yd[2] = { 1, 1 };
  mk_tensor_t x = tensor(MK_F32, xf, 3, -1), y = tensor(MK_F32, yf, 3, -1);
  mk_tensor_t x2 = tensor(MK_F64, xd, 2, -1), y2 = tensor(MK_F64, yd, 2, -1);

  assert_int_equal(CALL(basic, "axpy", A_NUM(2), A_T(&x), A_T(&y)), 0);
  assert_int_equal(rec.nres, 0);
  assert_floats(yf, (float[]){ 12, 24, 36 }, 3);
  assert_floats(xf, (float[]){ 1, 2, 3 }, 3);
  assert_int_equal(CALL(basic, "axpy", A_NUM(-0.5), A_T(&x2), A_T(&y2)), 0);
  assert_doubles(yd, (double[]){ -1, 5 }, 2);

  assert_int_equal(CALL(basic, "axpy", A_NUM(1), A_T(&x), A_T(&y2)), -1);
  assert_string_equal(rec.err,
                      "axpy: x is f32[3] but y is f64[2] (need the same dtype and element count)");
  float zf[4] = { 0 };
  mk_tensor_t z = tensor(MK_F32, zf, 2, 2);
  assert_int_equal(CALL(basic, "axpy", A_NUM(1), A_T(&z), A_T(&y)), -1);
  assert_string_equal(rec.err,
                      "axpy: x is f32[2x2] but y is f32[3] (need the same dtype and element count)");
  assert_floats(yf, (float[]){ 12, 24, 36 }, 3);

  int32_t ia[2] = { 1, 2 }, ib[2] = { 3, 4 };
  mk_tensor_t ta = tensor(MK_I32, ia, 2, -1), tb = tensor(MK_I32, ib, 2, -1);
  assert_int_equal(CALL(basic, "axpy", A_NUM(1), A_T(&ta), A_T(&tb)), -1);
  assert_string_equal(rec.err, "axpy: unsupported dtype i32 (supported: f32, f64)");
}

static void test_scale(void **state) {
  (void)state;
  float f[3] = { 1, -2, 4 };
  double d[2] = { 0.5, -3 };
  mk_tensor_t tf = tensor(MK_F32, f, 3, -1), td = tensor(MK_F64, d, 1, 2);
  assert_int_equal(CALL(basic, "scale", A_T(&tf), A_NUM(0.5)), 0);
  assert_floats(f, (float[]){ 0.5f, -1, 2 }, 3);
  assert_int_equal(CALL(basic, "scale", A_T(&td), A_NUM(3)), 0);
  assert_doubles(d, (double[]){ 1.5, -9 }, 2);
  uint8_t u[1] = { 3 };
  mk_tensor_t tu = tensor(MK_U8, u, 1, -1);
  assert_int_equal(CALL(basic, "scale", A_T(&tu), A_NUM(2)), -1);
  assert_string_equal(rec.err, "scale: unsupported dtype u8 (supported: f32, f64)");
  assert_int_equal(u[0], 3);
}

static void test_dot(void **state) {
  (void)state;
  float a[3] = { 1, 2, 3 }, b[3] = { 4, 5, 6 };
  double c[2] = { 0.5, 1.5 }, d[2] = { 2, 4 };
  mk_tensor_t ta = tensor(MK_F32, a, 3, -1), tb = tensor(MK_F32, b, 3, -1);
  mk_tensor_t tc = tensor(MK_F64, c, 2, -1), td = tensor(MK_F64, d, 2, -1);
  assert_int_equal(CALL(basic, "dot", A_T(&ta), A_T(&tb)), 0);
  assert_int_equal(rec.nres, 1);
  assert_number(0, 32.0);
  assert_int_equal(CALL(basic, "dot", A_T(&tc), A_T(&td)), 0);
  assert_number(0, 7.0);
  /* Mixed dtypes are refused rather than silently converted. */
  assert_int_equal(CALL(basic, "dot", A_T(&ta), A_T(&tc)), -1);
  assert_string_equal(rec.err,
                      "dot: x is f32[3] but y is f64[2] (need the same dtype and element count)");
}

/* A = [1 2 3; 4 5 6], B = [7 8; 9 10; 11 12], A@B = [58 64; 139 154]. */
static void test_sgemm(void **state) {
  (void)state;
  float a[6] = { 1, 2, 3, 4, 5, 6 }, b[6] = { 7, 8, 9, 10, 11, 12 };
  float c[4] = { NAN, NAN, NAN, NAN };
  mk_tensor_t A = tensor(MK_F32, a, 2, 3), B = tensor(MK_F32, b, 3, 2), C = tensor(MK_F32, c, 2, 2);

  /* Default beta = 0: C's old contents (NaN) must not leak into the result. */
  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&B), A_T(&C)), 0);
  assert_int_equal(rec.nres, 0);
  assert_floats(c, (float[]){ 58, 64, 139, 154 }, 4);

  /* C = 2*A@B + 1*C */
  c[0] = c[1] = c[2] = c[3] = 1;
  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&B), A_T(&C), A_NUM(2), A_NUM(1)), 0);
  assert_floats(c, (float[]){ 117, 129, 279, 309 }, 4);

  /* Same product from stored transposes: At is 3x2, Bt is 2x3. */
  float at[6] = { 1, 4, 2, 5, 3, 6 }, bt[6] = { 7, 9, 11, 8, 10, 12 };
  mk_tensor_t At = tensor(MK_F32, at, 3, 2), Bt = tensor(MK_F32, bt, 2, 3);
  assert_int_equal(CALL(basic, "sgemm", A_T(&At), A_T(&Bt), A_T(&C), A_NUM(1), A_NUM(0),
                        A_BOOL(1), A_BOOL(1)),
                   0);
  assert_floats(c, (float[]){ 58, 64, 139, 154 }, 4);
  assert_int_equal(CALL(basic, "sgemm", A_T(&At), A_T(&B), A_T(&C), A_NUM(1), A_NUM(0),
                        A_BOOL(1)),
                   0);
  assert_floats(c, (float[]){ 58, 64, 139, 154 }, 4);

  /* B@A is 3x3 from a 3x2 @ 2x3. */
  float c9[9];
  mk_tensor_t C9 = tensor(MK_F32, c9, 3, 3);
  assert_int_equal(CALL(basic, "sgemm", A_T(&B), A_T(&A), A_T(&C9)), 0);
  assert_floats(c9, (float[]){ 39, 54, 69, 49, 68, 87, 59, 82, 105 }, 9);

  /* Empty inner dimension: the product is zero, so C = beta*C (BLAS wants ld >= 1 here). */
  float e[1] = { 0 };
  mk_tensor_t A0 = tensor(MK_F32, e, 2, 0), B0 = tensor(MK_F32, e, 0, 2);
  c[0] = c[1] = c[2] = c[3] = 4;
  assert_int_equal(CALL(basic, "sgemm", A_T(&A0), A_T(&B0), A_T(&C), A_NUM(1), A_NUM(0.5)), 0);
  assert_floats(c, (float[]){ 2, 2, 2, 2 }, 4);
}

static void test_sgemm_errors(void **state) {
  (void)state;
  float a[12] = { 0 }, b[10] = { 0 }, c[6] = { 0 };
  mk_tensor_t A = tensor(MK_F32, a, 3, 4), B = tensor(MK_F32, b, 5, 2), C = tensor(MK_F32, c, 3, 2);

  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&B), A_T(&C)), -1);
  assert_string_equal(rec.err, "sgemm: A is 3x4 but B is 5x2 (inner dimensions differ)");
  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&B), A_T(&C), A_NUM(1), A_NUM(0), A_BOOL(1)),
                   -1);
  assert_string_equal(rec.err, "sgemm: A^T is 4x3 but B is 5x2 (inner dimensions differ)");

  mk_tensor_t B42 = tensor(MK_F32, b, 4, 2), C22 = tensor(MK_F32, c, 2, 2);
  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&B42), A_T(&C22)), -1);
  assert_string_equal(rec.err, "sgemm: C is 2x2 but A@B is 3x2");

  mk_tensor_t A1 = tensor(MK_F32, a, 12, -1);
  assert_int_equal(CALL(basic, "sgemm", A_T(&A1), A_T(&B42), A_T(&C)), -1);
  assert_string_equal(rec.err, "sgemm: A must be a 2-D f32 tensor, got f32[12]");

  double d[8] = { 0 };
  mk_tensor_t Bd = tensor(MK_F64, d, 4, 2);
  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&Bd), A_T(&C)), -1);
  assert_string_equal(rec.err, "sgemm: B must be a 2-D f32 tensor, got f64[4x2]");

  /* In-place products are undefined in BLAS, so they are refused. */
  float sq[4] = { 1, 2, 3, 4 };
  mk_tensor_t S = tensor(MK_F32, sq, 2, 2);
  assert_int_equal(CALL(basic, "sgemm", A_T(&S), A_T(&C22), A_T(&S)), -1);
  assert_string_equal(rec.err, "sgemm: C must not share memory with A or B");
  assert_floats(sq, (float[]){ 1, 2, 3, 4 }, 4);
}

static void test_unsupported_dtype(void **state) {
  (void)state;
  uint16_t h[4] = { 0 };
  mk_tensor_t t16 = tensor(MK_F16, h, 4, -1), tb16 = tensor(MK_BF16, h, 2, 2);
  assert_int_equal(CALL(basic, "fill", A_T(&t16), A_NUM(1)), -1);
  assert_string_equal(rec.err, "fill: unsupported dtype f16 (supported: f32, f64, i32, i64, u8)");
  assert_int_equal(CALL(basic, "iota", A_T(&tb16)), -1);
  assert_string_equal(rec.err, "iota: unsupported dtype bf16 (supported: f32, f64, i32, i64, u8)");
  assert_int_equal(CALL(basic, "sum", A_T(&tb16)), -1);
  assert_string_equal(rec.err, "sum: unsupported dtype bf16 (supported: f32, f64, i32, i64, u8)");
  assert_int_equal(CALL(basic, "dot", A_T(&t16), A_T(&t16)), -1);
  assert_string_equal(rec.err, "dot: unsupported dtype f16 (supported: f32, f64)");
  for (int i = 0; i < 4; i++)
    assert_int_equal(h[i], 0);
}

static void test_device_tensor(void **state) {
  (void)state;
  float f[4] = { 0 };
  mk_tensor_t g = tensor(MK_F32, f, 2, 2), h = tensor(MK_F32, f, 2, 2);
  g.device = 0;
  assert_int_equal(CALL(basic, "fill", A_T(&g), A_NUM(1)), -1);
  assert_string_equal(rec.err, "fill: basic is a CPU library; tensor is on cuda:0");
  assert_floats(f, (float[]){ 0, 0, 0, 0 }, 4);
  g.device = 3;
  assert_int_equal(CALL(basic, "sum", A_T(&g)), -1);
  assert_string_equal(rec.err, "sum: basic is a CPU library; tensor is on cuda:3");
  float c[4];
  mk_tensor_t C = tensor(MK_F32, c, 2, 2);
  assert_int_equal(CALL(basic, "sgemm", A_T(&h), A_T(&g), A_T(&C)), -1);
  assert_string_equal(rec.err, "sgemm: basic is a CPU library; tensor is on cuda:3");
  assert_int_equal(CALL(basic, "axpy", A_NUM(1), A_T(&h), A_T(&g)), -1);
  assert_string_equal(rec.err, "axpy: basic is a CPU library; tensor is on cuda:3");
}

static void test_sleep(void **state) {
  (void)state;
  double t0 = mn_now_s();
  assert_int_equal(CALL(basic, "sleep", A_NUM(0)), 0);
  assert_int_equal(rec.nres, 0);
  assert_int_equal(CALL(basic, "sleep", A_NUM(0.05)), 0);
  assert_true(mn_now_s() - t0 >= 0.05);

  /* Already cancelled: a 5 s sleep returns at once (and a broken cancel fails, not hangs). */
  rec.cancel_after = 1;
  t0 = mn_now_s();
  assert_int_equal(CALL(basic, "sleep", A_NUM(5)), -1);
  assert_string_equal(rec.err, "sleep: cancelled");
  assert_true(mn_now_s() - t0 < 0.5);

  /* Cancelled mid-way: noticed within a step or two of 10 ms. */
  rec.cancel_after = 4;
  t0 = mn_now_s();
  assert_int_equal(CALL(basic, "sleep", A_NUM(5)), -1);
  double dt = mn_now_s() - t0;
  assert_string_equal(rec.err, "sleep: cancelled");
  assert_int_equal(rec.polls, 4);
  assert_true(dt >= 0.025);
  assert_true(dt < 1.0);
  rec.cancel_after = 0;

  assert_int_equal(CALL(basic, "sleep", A_NUM(-1)), -1);
  assert_string_equal(rec.err, "sleep: seconds must be in [0, 86400], got -1");
  assert_int_equal(CALL(basic, "sleep", A_NUM(86401)), -1);
  assert_int_equal(CALL(basic, "sleep", A_NUM(NAN)), -1);
}

/* ---- faulty ------------------------------------------------------------ */

static void test_faulty_fail(void **state) {
  (void)state;
  static const char msg[] = "boom: disk on fire (50%)";
  assert_int_equal(CALL(faulty, "fail", A_STR(msg, strlen(msg))), -1);
  assert_string_equal(rec.err, msg);
  /* Only len bytes count: the string need not be NUL-terminated. */
  assert_int_equal(CALL(faulty, "fail", A_STR("abcdef", 3)), -1);
  assert_string_equal(rec.err, "abc");
}

static void test_faulty_spin(void **state) {
  (void)state;
  rec.cancel_after = 1; /* spin ignores it */
  double t0 = mn_now_s();
  assert_int_equal(CALL(faulty, "spin", A_NUM(0.02)), 0);
  assert_true(mn_now_s() - t0 >= 0.02);
  assert_int_equal(rec.polls, 0);
  assert_int_equal(rec.nres, 1);
  assert_int_equal(rec.res[0].type, MK_ARG_INT);
  assert_true(rec.res[0].i > 0);
  rec.cancel_after = 0;
  assert_int_equal(CALL(faulty, "spin", A_NUM(-1)), -1);
  assert_string_equal(rec.err, "spin: seconds must be in [0, 86400], got -1");
}

/* Runs faulty.<name>("hi there") with fd redirected to a temp file; returns what was written. */
static void captured_print(const char *name, FILE *stream, int fd, char *out, size_t outsz) {
  char path[] = "/tmp/test_kernels.XXXXXX";
  int tmp = mkstemp(path);
  assert_true(tmp >= 0);
  unlink(path);
  fflush(stream);
  int saved = dup(fd);
  assert_true(saved >= 0);
  assert_true(dup2(tmp, fd) == fd);
  int rc = CALL(faulty, name, A_STR("hi there!", 8));
  fflush(stream);
  assert_true(dup2(saved, fd) == fd);
  close(saved);
  assert_int_equal(rc, 0);
  assert_int_equal(rec.nres, 0);
  ssize_t n = pread(tmp, out, outsz - 1, 0);
  close(tmp);
  assert_true(n >= 0);
  out[n] = '\0';
}

static void test_faulty_print(void **state) {
  (void)state;
  char buf[64];
  captured_print("print", stdout, STDOUT_FILENO, buf, sizeof(buf));
  assert_string_equal(buf, "hi there\n");
  captured_print("eprint", stderr, STDERR_FILENO, buf, sizeof(buf));
  assert_string_equal(buf, "hi there\n");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_basic_table),
    cmocka_unit_test(test_faulty_table),
    cmocka_unit_test(test_signature_checker),
    cmocka_unit_test(test_noop),
    cmocka_unit_test(test_echo),
    cmocka_unit_test(test_rank),
    cmocka_unit_test(test_fill_sum_f32),
    cmocka_unit_test(test_fill_sum_f64),
    cmocka_unit_test(test_fill_sum_ints),
    cmocka_unit_test(test_iota),
    cmocka_unit_test(test_copy),
    cmocka_unit_test(test_axpy),
    cmocka_unit_test(test_scale),
    cmocka_unit_test(test_dot),
    cmocka_unit_test(test_sgemm),
    cmocka_unit_test(test_sgemm_errors),
    cmocka_unit_test(test_unsupported_dtype),
    cmocka_unit_test(test_device_tensor),
    cmocka_unit_test(test_sleep),
    cmocka_unit_test(test_faulty_fail),
    cmocka_unit_test(test_faulty_spin),
    cmocka_unit_test(test_faulty_print),
  };
  return cmocka_run_group_tests_name("kernels", tests, group_setup, group_teardown);
}
