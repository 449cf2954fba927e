/*
 * test_mlp.c - unit tests for the "mlp" kernel library (kernels/cpu/mlp.c).
 *
 * mlp.so is dlopen'ed from MONARCH_KERNEL_DIR (default build/lib/monarch) as
 * a proc would load it, and its kernels are called through a small recording
 * mk_api_t. The gradient is checked against finite differences on a tiny net;
 * the loader reads small synthetic data files written to /tmp (gzip through
 * the system zlib, which mlp.so links anyway, and plain text).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "monarch_kernel.h"

/* ---- recording host ------------------------------------------------------------ */

#define MAX_RESULTS 8  /* results one call may record */
#define PATH_BUF 256   /* temp file names */

typedef struct {
  mk_arg_type_t type;
  int64_t i;
  double num;
  size_t len; /* bytes results: length; the bytes themselves are not kept */
} result_t;

typedef struct {
  mk_ctx_t ctx;
  result_t res[MAX_RESULTS];
  int nres;
  char err[1024];
  void *scratch; /* one block per call, like the proc's reused buffer */
} rec_t;

static rec_t rec;

static result_t *push(mk_ctx_t *ctx, mk_arg_type_t type) {
  rec_t *r = ctx->host;
  assert_true(r->nres < MAX_RESULTS);
  result_t *res = &r->res[r->nres++];
  memset(res, 0, sizeof(*res));
  res->type = type;
  return res;
}

static int h_nil(mk_ctx_t *ctx) { push(ctx, MK_ARG_NIL); return 0; }
static int h_bool(mk_ctx_t *ctx, int b) { push(ctx, MK_ARG_BOOL)->i = b; return 0; }
static int h_int(mk_ctx_t *ctx, int64_t i) { push(ctx, MK_ARG_INT)->i = i; return 0; }
static int h_number(mk_ctx_t *ctx, double d) { push(ctx, MK_ARG_NUMBER)->num = d; return 0; }
static int h_string(mk_ctx_t *ctx, const char *s, size_t n) { push(ctx, MK_ARG_STRING)->len = n; return 0; }
static int h_bytes(mk_ctx_t *ctx, const void *p, size_t n) { push(ctx, MK_ARG_BYTES)->len = n; return 0; }

static int h_error(mk_ctx_t *ctx, const char *fmt, ...) {
  rec_t *r = ctx->host;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof(r->err), fmt, ap);
  va_end(ap);
  return -1;
}

static void *h_scratch(mk_ctx_t *ctx, size_t n) {
  rec_t *r = ctx->host;
  free(r->scratch);
  r->scratch = malloc(n ? n : 1);
  return r->scratch;
}

static int h_cancelled(mk_ctx_t *ctx) { return 0; }

/* A group of one: every collective leaves its tensor as it is (the fused kernel's single-proc case). */
static int h_all_reduce(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int op) { return g->size == 1 ? 0 : -1; }
static int h_broadcast(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int root) { return -1; }
static int h_all_gather(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *s, mk_tensor_t *d) { return -1; }
static int h_reduce_scatter(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *s, mk_tensor_t *d, int op) {
  return -1;
}
static int h_barrier(mk_ctx_t *ctx, const mk_group_t *g) { return 0; }

static const mk_api_t api = { h_nil, h_bool, h_int, h_number, h_string, h_bytes, h_error, h_scratch, h_cancelled,
                              h_all_reduce, h_broadcast, h_all_gather, h_reduce_scatter, h_barrier };

static void rec_reset(int rank, int world) {
  free(rec.scratch);
  memset(&rec, 0, sizeof(rec));
  rec.ctx.api = &api;
  rec.ctx.rank = rank;
  rec.ctx.world = world;
  rec.ctx.device = -1;
  rec.ctx.host = &rec;
}

/* ---- library, tensors and arguments ------------------------------------------------ */

static void *handle;
static const mk_library_t *lib;

static int group_setup(void **state) {
  const char *dir = getenv("MONARCH_KERNEL_DIR");
  char path[4096];
  snprintf(path, sizeof(path), "%s/mlp.so", dir && *dir ? dir : "build/lib/monarch");
  handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    return -1;
  }
  void *sym = dlsym(handle, MK_LIBRARY_SYMBOL);
  if (sym == NULL)
    return -1;
  mk_library_fn_t fn;
  memcpy(&fn, &sym, sizeof(fn));
  lib = fn();
  rec_reset(0, 1);
  return lib ? 0 : -1;
}

static int group_teardown(void **state) {
  rec_reset(0, 1);
  free(rec.scratch);
  rec.scratch = NULL;
  if (handle)
    dlclose(handle);
  return 0;
}

static const mk_kernel_t *find(const char *name) {
  for (int i = 0; i < lib->count; i++)
    if (strcmp(lib->kernels[i].name, name) == 0)
      return &lib->kernels[i];
  fail_msg("mlp has no kernel '%s'", name);
  return NULL;
}

/* Does sig (no '?' or '*' in this library) accept argv as the host would? */
static int sig_accepts(const char *sig, int argc, const mk_arg_t *argv) {
  static const char letters[] = "nisbtBa";
  static const mk_arg_type_t types[] = { MK_ARG_NUMBER, MK_ARG_INT, MK_ARG_STRING, MK_ARG_BYTES,
                                         MK_ARG_TENSOR, MK_ARG_BOOL, MK_ARG_NIL };
  if ((int)strlen(sig) != argc)
    return 0;
  for (int i = 0; i < argc; i++) {
    const char *l = strchr(letters, sig[i]);
    if (l == NULL || (sig[i] != 'a' && types[l - letters] != argv[i].type))
      return 0;
  }
  return 1;
}

/* Calls kernel name with argv as a proc of (rank, world) would; returns its status. */
static int call_as(int rank, int world, const char *name, int argc, const mk_arg_t *argv) {
  const mk_kernel_t *k = find(name);
  assert_true(sig_accepts(k->signature, argc, argv));
  rec_reset(rank, world);
  rec.ctx.kernel = name;
  return k->fn(&rec.ctx, argc, argv);
}

static int call(const char *name, int argc, const mk_arg_t *argv) { return call_as(0, 1, name, argc, argv); }

static mk_tensor_t *tensor(mk_dtype_t dtype, int ndim, int64_t d0, int64_t d1) {
  mk_tensor_t *t = calloc(1, sizeof(*t));
  assert_non_null(t);
  t->dtype = dtype, t->ndim = ndim, t->device = -1;
  t->shape[0] = d0, t->shape[1] = ndim > 1 ? d1 : 0;
  t->numel = ndim > 1 ? d0 * d1 : d0;
  t->nbytes = (size_t)t->numel * mk_dtype_size(dtype);
  t->data = calloc(t->nbytes ? t->nbytes : 1, 1);
  assert_non_null(t->data);
  return t;
}

static void tensor_free(mk_tensor_t *t) {
  if (t)
    free(t->data);
  free(t);
}

static mk_arg_t T(mk_tensor_t *t) { mk_arg_t a = { .type = MK_ARG_TENSOR }; a.v.tensor = t; return a; }
static mk_arg_t I(int64_t i) { mk_arg_t a = { .type = MK_ARG_INT }; a.v.i = i; return a; }
static mk_arg_t N(double d) { mk_arg_t a = { .type = MK_ARG_NUMBER }; a.v.num = d; return a; }
static mk_arg_t S(const char *s) {
  mk_arg_t a = { .type = MK_ARG_STRING };
  a.v.str.ptr = s, a.v.str.len = strlen(s);
  return a;
}

static float *F(mk_tensor_t *t) { return t->data; }
static int32_t *L(mk_tensor_t *t) { return t->data; }

/* ---- synthetic data files ------------------------------------------------------------ */

typedef void *(*gzopen_fn)(const char *, const char *);
typedef int (*gzwrite_fn)(void *, const void *, unsigned);
typedef int (*gzclose_fn)(void *);

/* Writes text to path, gzip-compressed when gz is set. */
static void write_file(const char *path, const char *text, int gz) {
  if (!gz) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    return;
  }
  void *z = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
  assert_non_null(z);
  gzopen_fn zopen;
  gzwrite_fn zwrite;
  gzclose_fn zclose;
  void *s1 = dlsym(z, "gzopen"), *s2 = dlsym(z, "gzwrite"), *s3 = dlsym(z, "gzclose");
  assert_true(s1 && s2 && s3);
  memcpy(&zopen, &s1, sizeof(s1)), memcpy(&zwrite, &s2, sizeof(s2)), memcpy(&zclose, &s3, sizeof(s3));
  void *f = zopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(zwrite(f, text, (unsigned)strlen(text)), (int)strlen(text));
  assert_int_equal(zclose(f), 0);
  assert_int_equal(dlclose(z), 0);
}

/* A temp file name unique to this process. */
static const char *tmp_path(char *buf, const char *suffix) {
  snprintf(buf, PATH_BUF, "/tmp/test_mlp.%d.%s", (int)getpid(), suffix);
  return buf;
}

/* 10 rows, 3 features, labels 0..2: feature 0 of row r is r, so rows can be told apart. */
static const char *TEN_ROWS = "0,1,2,0\n1,2,0,1\n2,0,1,2\n3,1,2,0\n4,2,0,1\n"
                              "5,0,1,2\n6,1,2,0\n7,2,0,1\n8,0,1,2\n9,1,2,0\n";

/* ---- tests: library table ----------------------------------------------------------- */

static void test_table(void **state) {
  assert_int_equal(lib->abi_version, MK_ABI_VERSION);
  assert_string_equal(lib->name, "mlp");
  const char *names[] = { "digits_info", "digits_load", "mlp_init", "mlp_forward_backward", "mlp_adam",
                          "mlp_evaluate", "mlp_bytes" };
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    const mk_kernel_t *k = find(names[i]);
    assert_non_null(k->fn);
    assert_non_null(k->doc);
  }
}

/* ---- tests: loader --------------------------------------------------------------------- */

static void test_loader_counts_rows(void **state) {
  char path[PATH_BUF];
  write_file(tmp_path(path, "ten.csv.gz"), TEN_ROWS, 1);
  mk_arg_t a[] = { S(path), N(0.2) };
  assert_int_equal(call_as(0, 3, "digits_info", 2, a), 0);
  assert_int_equal(rec.nres, 6);
  int64_t want[] = { 10, 3, 3, 8, 2, 2 }; /* rows, features, classes, train, test, shard = 8/3 */
  for (int i = 0; i < 6; i++)
    assert_int_equal(rec.res[i].i, want[i]);
  assert_int_equal(unlink(path), 0);
}

/* Loads rank r of world w; X holds row ids (feature 0 scaled by 1/9) for checking. */
static void load_shard(const char *path, int rank, int world, int64_t seed, int shard, mk_tensor_t **x,
                       mk_tensor_t **y, mk_tensor_t **xt, mk_tensor_t **yt) {
  *x = tensor(MK_F32, 2, shard, 3), *y = tensor(MK_I32, 1, shard, 0);
  *xt = tensor(MK_F32, 2, 2, 3), *yt = tensor(MK_I32, 1, 2, 0);
  mk_arg_t a[] = { S(path), N(0.2), I(seed), T(*x), T(*y), T(*xt), T(*yt) };
  assert_int_equal(call_as(rank, world, "digits_load", 7, a), 0);
  assert_int_equal(rec.res[0].i, shard);
}

static int row_id(const mk_tensor_t *x, int i) { return (int)lrintf(F((mk_tensor_t *)x)[i * 3] * 9.0f); }

static void test_loader_splits_and_shards(void **state) {
  char path[PATH_BUF];
  write_file(tmp_path(path, "ten.csv.gz"), TEN_ROWS, 1);
  mk_tensor_t *x[2], *y[2], *xt[2], *yt[2];
  int seen[10] = { 0 };
  for (int r = 0; r < 2; r++) {
    load_shard(path, r, 2, 7, 4, &x[r], &y[r], &xt[r], &yt[r]);
    for (int i = 0; i < 4; i++) {
      int id = row_id(x[r], i);
      assert_in_range(id, 0, 9);
      seen[id]++;
      /* Rows stay whole: the label follows its features (label = id % 3 in TEN_ROWS). */
      assert_int_equal(L(y[r])[i], id % 3);
      assert_true(F(x[r])[i * 3 + 1] <= 1.0f);
    }
  }
  /* The test split is the same on both ranks and disjoint from both shards. */
  assert_memory_equal(xt[0]->data, xt[1]->data, xt[0]->nbytes);
  assert_memory_equal(yt[0]->data, yt[1]->data, yt[0]->nbytes);
  for (int i = 0; i < 2; i++)
    seen[row_id(xt[0], i)]++;
  for (int i = 0; i < 10; i++)
    assert_int_equal(seen[i], 1);
  /* Features are scaled by the file's largest value (9). */
  assert_float_equal(F(x[0])[0] * 9.0f, (float)row_id(x[0], 0), 1e-5);

  /* Another seed gives another split. */
  mk_tensor_t *x2, *y2, *xt2, *yt2;
  load_shard(path, 0, 2, 8, 4, &x2, &y2, &xt2, &yt2);
  assert_true(memcmp(x2->data, x[0]->data, x2->nbytes) != 0 || memcmp(xt2->data, xt[0]->data, xt2->nbytes) != 0);
  mk_tensor_t *all[] = { x[0], y[0], xt[0], yt[0], x[1], y[1], xt[1], yt[1], x2, y2, xt2, yt2 };
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
    tensor_free(all[i]);
  assert_int_equal(unlink(path), 0);
}

static void test_loader_reads_plain_text(void **state) {
  char path[PATH_BUF];
  write_file(tmp_path(path, "ten.csv"), "1,2,0\r\n\r\n3,4,1\r\n", 0);
  mk_arg_t a[] = { S(path), N(0.0) };
  assert_int_equal(call_as(0, 2, "digits_info", 2, a), 0);
  assert_int_equal(rec.res[0].i, 2);  /* blank line skipped */
  assert_int_equal(rec.res[1].i, 2);  /* features */
  assert_int_equal(rec.res[2].i, 2);  /* classes */
  assert_int_equal(rec.res[5].i, 1);  /* shard */
  assert_int_equal(unlink(path), 0);
}

/* Expects digits_info on text to fail with a message containing want. */
static void expect_bad_file(const char *text, const char *want) {
  char path[PATH_BUF];
  write_file(tmp_path(path, "bad.csv.gz"), text, 1);
  mk_arg_t a[] = { S(path), N(0.2) };
  assert_int_not_equal(call("digits_info", 2, a), 0);
  if (strstr(rec.err, want) == NULL)
    fail_msg("error '%s' does not mention '%s'", rec.err, want);
  assert_non_null(strstr(rec.err, path));
  assert_int_equal(unlink(path), 0);
}

static void test_loader_rejects_bad_files(void **state) {
  expect_bad_file("1,2,3\n4,x,5\n", "line 2 field 2 is not a number: 'x'");
  expect_bad_file("1,2,3\n4,5\n", "line 2 has 2 fields; line 1 has 3");
  expect_bad_file("1,2,3\n4,5,1.5\n", "line 2: the label (last field) must be an integer");
  expect_bad_file("1,2,-1\n", "line 1: the label (last field) must be an integer");
  expect_bad_file("", "has no rows");
  expect_bad_file("5\n", "line 1 has 1 fields");
  expect_bad_file("1,,2\n", "line 1 field 2 is not a number: ''");

  mk_arg_t a[] = { S("/nonexistent/digits.csv.gz"), N(0.2) };
  assert_int_not_equal(call("digits_info", 2, a), 0);
  assert_non_null(strstr(rec.err, "digits_info: cannot open /nonexistent/digits.csv.gz"));

  char path[PATH_BUF];
  write_file(tmp_path(path, "ten.csv.gz"), TEN_ROWS, 1);
  mk_arg_t f[] = { S(path), N(1.0) };
  assert_int_not_equal(call("digits_info", 2, f), 0);
  assert_string_equal(rec.err, "digits_info: test_fraction must be in [0, 1), got 1");
  mk_arg_t w[] = { S(path), N(0.2) };
  assert_int_not_equal(call_as(0, 9, "digits_info", 2, w), 0);
  assert_string_equal(rec.err, "digits_info: 8 training rows cannot be shared by 9 procs");

  /* A shard tensor of the wrong shape is named with both shapes. */
  mk_tensor_t *x = tensor(MK_F32, 2, 5, 3), *y = tensor(MK_I32, 1, 4, 0);
  mk_tensor_t *xt = tensor(MK_F32, 2, 2, 3), *yt = tensor(MK_I32, 1, 2, 0);
  mk_arg_t l[] = { S(path), N(0.2), I(1), T(x), T(y), T(xt), T(yt) };
  assert_int_not_equal(call_as(0, 2, "digits_load", 7, l), 0);
  assert_string_equal(rec.err, "digits_load: X must be f32[4x3], got f32[5x3]");
  tensor_free(x), tensor_free(y), tensor_free(xt), tensor_free(yt);
  assert_int_equal(unlink(path), 0);
}

/* ---- tests: model ----------------------------------------------------------------------- */

enum { IN = 3, HID = 4, OUT = 3, ROWS = 6 };
#define NPARAMS (IN * HID + HID + HID * OUT + OUT)

static mk_tensor_t *init_params(int64_t seed) {
  mk_tensor_t *p = tensor(MK_F32, 1, NPARAMS, 0);
  mk_arg_t a[] = { T(p), I(IN), I(HID), I(OUT), I(seed) };
  assert_int_equal(call("mlp_init", 5, a), 0);
  return p;
}

static void test_init_is_a_function_of_the_seed(void **state) {
  mk_tensor_t *a = init_params(1), *b = init_params(1), *c = init_params(2);
  assert_memory_equal(a->data, b->data, a->nbytes);
  assert_memory_not_equal(a->data, c->data, a->nbytes);
  float bound = sqrtf(6.0f / IN);
  for (int i = 0; i < IN * HID; i++)
    assert_true(fabsf(F(a)[i]) <= bound);
  for (int i = 0; i < HID; i++)
    assert_true(F(a)[IN * HID + i] == 0.0f); /* b1 */
  for (int i = 0; i < OUT; i++)
    assert_true(F(a)[NPARAMS - OUT + i] == 0.0f); /* b2 */
  mk_tensor_t *wrong = tensor(MK_F32, 1, NPARAMS + 1, 0);
  mk_arg_t w[] = { T(wrong), I(IN), I(HID), I(OUT), I(1) };
  assert_int_not_equal(call("mlp_init", 5, w), 0);
  assert_string_equal(rec.err, "mlp_init: P (parameters) must be a CPU f32[31] for 3 inputs, 4 hidden, 3 "
                               "classes; got f32[32]");
  tensor_free(a), tensor_free(b), tensor_free(c), tensor_free(wrong);
}

/* A small fixed data set. */
static void make_data(mk_tensor_t **x, mk_tensor_t **y) {
  static const float xs[ROWS * IN] = { 0.9f, 0.1f, 0.3f, 0.2f, 0.8f, 0.5f, 0.4f, 0.4f, 0.9f,
                                       0.7f, 0.2f, 0.1f, 0.1f, 0.9f, 0.6f, 0.3f, 0.5f, 0.8f };
  static const int32_t ys[ROWS] = { 0, 1, 2, 0, 1, 2 };
  *x = tensor(MK_F32, 2, ROWS, IN), *y = tensor(MK_I32, 1, ROWS, 0);
  memcpy((*x)->data, xs, sizeof(xs));
  memcpy((*y)->data, ys, sizeof(ys));
}

/* Summed loss of all rows, from mlp_evaluate. */
static double eval_loss(mk_tensor_t *p, mk_tensor_t *x, mk_tensor_t *y, int64_t *correct) {
  mk_arg_t a[] = { T(p), T(x), T(y), I(HID), I(OUT) };
  assert_int_equal(call("mlp_evaluate", 5, a), 0);
  assert_int_equal(rec.nres, 3);
  assert_int_equal(rec.res[2].i, y->numel);
  if (correct)
    *correct = rec.res[1].i;
  return rec.res[0].num;
}

/* Runs forward_backward; returns the summed loss, fills G. */
static double fb(int rank, mk_tensor_t *p, mk_tensor_t *x, mk_tensor_t *y, mk_tensor_t *g, int batch, int epoch,
                 int step) {
  mk_arg_t a[] = { T(p), T(x), T(y), T(g), I(HID), I(OUT), I(batch), I(5), I(epoch), I(step) };
  assert_int_equal(call_as(rank, 2, "mlp_forward_backward", 10, a), 0);
  assert_int_equal(rec.nres, 2);
  return rec.res[0].num;
}

static void test_gradient_matches_finite_differences(void **state) {
  mk_tensor_t *x, *y, *p = init_params(3), *g = tensor(MK_F32, 1, NPARAMS, 0);
  make_data(&x, &y);
  /* A whole-data batch: G is the gradient of the mean loss over all rows. */
  double loss = fb(0, p, x, y, g, ROWS, 0, 0);
  assert_float_equal(loss, eval_loss(p, x, y, NULL), 1e-5);
  const float h = 1e-3f;
  int checked = 0;
  for (int i = 0; i < NPARAMS; i++) {
    float keep = F(p)[i];
    F(p)[i] = keep + h;
    double up = eval_loss(p, x, y, NULL) / ROWS;
    F(p)[i] = keep - h;
    double down = eval_loss(p, x, y, NULL) / ROWS;
    F(p)[i] = keep;
    double numeric = (up - down) / (2.0 * h), analytic = F(g)[i];
    if (fabs(numeric - analytic) > 2e-3 + 2e-2 * fabs(analytic))
      fail_msg("parameter %d: analytic %.6g, numeric %.6g", i, analytic, numeric);
    checked += analytic != 0.0;
  }
  assert_true(checked > NPARAMS / 2); /* most of the net took part */
  tensor_free(x), tensor_free(y), tensor_free(p), tensor_free(g);
}

static void test_each_epoch_visits_every_row_once(void **state) {
  mk_tensor_t *x, *y, *p = init_params(4), *g = tensor(MK_F32, 1, NPARAMS, 0);
  make_data(&x, &y);
  double total = eval_loss(p, x, y, NULL);
  double order[2][ROWS];
  for (int e = 0; e < 2; e++) {
    double sum = 0.0;
    for (int s = 0; s < ROWS; s++)
      sum += order[e][s] = fb(0, p, x, y, g, 1, e, s);
    /* Batches of one row over a whole epoch add up to the loss of every row. */
    assert_float_equal(sum, total, 1e-5);
  }
  assert_memory_not_equal(order[0], order[1], sizeof(order[0])); /* a new order each epoch */
  /* The same (seed, epoch, step, rank) gives the same batch, bit for bit; another rank another one. */
  mk_tensor_t *g2 = tensor(MK_F32, 1, NPARAMS, 0);
  fb(0, p, x, y, g, 2, 1, 1);
  fb(0, p, x, y, g2, 2, 1, 1);
  assert_memory_equal(g->data, g2->data, g->nbytes);
  double r0[3], r1[3];
  for (int s = 0; s < 3; s++)
    r0[s] = fb(0, p, x, y, g, 2, 0, s), r1[s] = fb(1, p, x, y, g, 2, 0, s);
  assert_memory_not_equal(r0, r1, sizeof(r0));
  tensor_free(x), tensor_free(y), tensor_free(p), tensor_free(g), tensor_free(g2);
}

static void test_forward_backward_rejects_bad_arguments(void **state) {
  mk_tensor_t *x, *y, *p = init_params(1), *g = tensor(MK_F32, 1, NPARAMS, 0);
  make_data(&x, &y);
  mk_arg_t past[] = { T(p), T(x), T(y), T(g), I(HID), I(OUT), I(4), I(1), I(0), I(1) };
  assert_int_not_equal(call("mlp_forward_backward", 10, past), 0);
  assert_string_equal(rec.err, "mlp_forward_backward: step must be in 0..0, got 1");
  mk_arg_t big[] = { T(p), T(x), T(y), T(g), I(HID), I(OUT), I(7), I(1), I(0), I(0) };
  assert_int_not_equal(call("mlp_forward_backward", 10, big), 0);
  assert_string_equal(rec.err, "mlp_forward_backward: batch must be in 1..6, got 7");
  mk_arg_t gp[] = { T(p), T(x), T(y), T(x), I(HID), I(OUT), I(2), I(1), I(0), I(0) };
  assert_int_not_equal(call("mlp_forward_backward", 10, gp), 0);
  assert_string_equal(rec.err, "mlp_forward_backward: G (gradients) must be f32[31], got f32[6x3]");
  L(y)[2] = 3; /* outside 0..OUT-1 */
  mk_arg_t lab[] = { T(p), T(x), T(y), T(g), I(HID), I(OUT), I(6), I(1), I(0), I(0) };
  assert_int_not_equal(call("mlp_forward_backward", 10, lab), 0);
  assert_string_equal(rec.err, "mlp_forward_backward: label 3 of row 2 is outside 0..2 (rank 0)");
  tensor_free(x), tensor_free(y), tensor_free(p), tensor_free(g);
}

static void test_adam_step(void **state) {
  mk_tensor_t *p = tensor(MK_F32, 1, 2, 0), *g = tensor(MK_F32, 1, 2, 0), *s = tensor(MK_F32, 1, 4, 0);
  F(p)[0] = 1.0f, F(p)[1] = -1.0f;
  F(g)[0] = 2.0f, F(g)[1] = -4.0f;
  mk_arg_t a[] = { T(p), T(g), T(s), N(0.1), I(1), N(0.5) };
  assert_int_equal(call("mlp_adam", 6, a), 0);
  /* Step 1 of Adam moves each weight by lr against the gradient's sign. */
  assert_float_equal(F(p)[0], 0.9f, 1e-6);
  assert_float_equal(F(p)[1], -0.9f, 1e-6);
  assert_float_equal(F(s)[0], 0.1f, 1e-7);   /* m = (1-b1) * g * scale */
  assert_float_equal(F(s)[2], 0.001f, 1e-7); /* v = (1-b2) * (g * scale)^2 */
  mk_arg_t bad[] = { T(p), T(g), T(p), N(0.1), I(1), N(1.0) };
  assert_int_not_equal(call("mlp_adam", 6, bad), 0);
  assert_string_equal(rec.err, "mlp_adam: S (Adam state) must be f32[4], got f32[2]");
  mk_arg_t t0[] = { T(p), T(g), T(s), N(0.1), I(0), N(1.0) };
  assert_int_not_equal(call("mlp_adam", 6, t0), 0);
  assert_string_equal(rec.err, "mlp_adam: t (step) must be in 1..2147483647, got 0");
  tensor_free(p), tensor_free(g), tensor_free(s);
}

static void test_training_reduces_the_loss(void **state) {
  /* Seed 3: the gradient test shows its ReLUs are alive (with 4 units, some seeds start dead). */
  mk_tensor_t *x, *y, *p = init_params(3), *g = tensor(MK_F32, 1, NPARAMS, 0);
  mk_tensor_t *s = tensor(MK_F32, 1, 2 * NPARAMS, 0);
  make_data(&x, &y);
  int64_t correct = 0;
  double before = eval_loss(p, x, y, NULL);
  for (int t = 1; t <= 300; t++) {
    fb(0, p, x, y, g, 3, t / 2, t % 2);
    mk_arg_t a[] = { T(p), T(g), T(s), N(0.05), I(t), N(1.0) };
    assert_int_equal(call("mlp_adam", 6, a), 0);
  }
  double after = eval_loss(p, x, y, &correct);
  assert_true(after < before / 4);
  assert_int_equal(correct, ROWS); /* six points, three classes: learnt by heart */
  mk_arg_t b[] = { T(p) };
  assert_int_equal(call("mlp_bytes", 1, b), 0);
  assert_int_equal(rec.res[0].type, MK_ARG_BYTES);
  assert_int_equal(rec.res[0].len, p->nbytes);
  tensor_free(x), tensor_free(y), tensor_free(p), tensor_free(g), tensor_free(s);
}

static void test_device_tensors_are_refused(void **state) {
  mk_tensor_t *p = init_params(1);
  p->device = 0;
  mk_arg_t a[] = { T(p) };
  assert_int_not_equal(call("mlp_bytes", 1, a), 0);
  assert_string_equal(rec.err, "mlp_bytes: mlp is a CPU library; tensor is on cuda:0");
  tensor_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_table),
    cmocka_unit_test(test_loader_counts_rows),
    cmocka_unit_test(test_loader_splits_and_shards),
    cmocka_unit_test(test_loader_reads_plain_text),
    cmocka_unit_test(test_loader_rejects_bad_files),
    cmocka_unit_test(test_init_is_a_function_of_the_seed),
    cmocka_unit_test(test_gradient_matches_finite_differences),
    cmocka_unit_test(test_each_epoch_visits_every_row_once),
    cmocka_unit_test(test_forward_backward_rejects_bad_arguments),
    cmocka_unit_test(test_adam_step),
    cmocka_unit_test(test_training_reduces_the_loss),
    cmocka_unit_test(test_device_tensors_are_refused),
  };
  return cmocka_run_group_tests_name("mlp", tests, group_setup, group_teardown);
}
