/*
 * mlp.c - the CPU kernel library "mlp": a classifier with one ReLU hidden
 * layer, trained data-parallel by examples/train.lua, and the loader for the
 * UCI handwritten digits data set (scikit-learn's digits.csv.gz).
 *
 * Tensors are plain f32 (i32 for labels), dense and row-major. The model lives
 * in one flat f32 tensor P so that the controller all-reduces one gradient
 * tensor G of the same layout per step:
 *
 *     P = W1 [in x hidden] | b1 [hidden] | W2 [hidden x out] | b2 [out]
 *
 * The Adam state S is m | v, each laid out like P (2 x numel(P) in all).
 *
 * Determinism is the point of this library: every random choice (the
 * train/test split, the initial weights, the order of each epoch's batches)
 * comes from a counter-based generator keyed by the caller's seed and the
 * position (epoch, rank), never from a clock or from state kept between calls.
 * A proc restarted mid-training therefore recomputes exactly what it would
 * have computed, and every proc that sees the same inputs makes the same
 * update bit for bit. Sums that decide results run in a fixed order.
 *
 * Every error message starts with the kernel name.
 */
#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "mlp_common.h"
#include "monarch_kernel.h"

#define MLP_MAX_FILE (64u << 20)  /* largest data file after decompression, bytes */
#define MLP_READ_CHUNK (1u << 16) /* bytes asked of gzread at a time */
#define MLP_MAX_PATH 4096         /* longest data file path, bytes */
#define MLP_MAX_ROWS (1 << 24)    /* most rows in a data file */
#define MLP_MAX_FEATURES 4096     /* most feature columns per row */
#define MLP_MAX_CLASSES 1024      /* labels must lie in 0 .. MLP_MAX_CLASSES-1 */
#define MLP_MAX_HIDDEN 65536      /* most hidden units */
#define MLP_MAX_BATCH 65536       /* most rows in one batch per proc */
#define MLP_EVAL_CHUNK 256        /* rows evaluated per pass (bounds scratch memory) */
#define MLP_MAX_FUSED 2048        /* most steps of one mlp_train call (two results each, MN_MAX_RESULTS 4096) */



/* ---- argument checks ---------------------------------------------------------- */

/* "f32[359x64]" into buf, for messages that show what a tensor is. */
static const char *desc(const mk_tensor_t *t, char *buf, size_t n) {
  size_t off = (size_t)snprintf(buf, n, "%s[", mk_dtype_name(t->dtype));
  for (int i = 0; i < t->ndim && i < MK_MAX_DIMS && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, i ? "x%lld" : "%lld", (long long)t->shape[i]);
  if (off < n)
    snprintf(buf + off, n - off, "]");
  return buf;
}

#define DESC_BUF 200 /* room for "bf16[" + 8 dims of 20 digits + separators + "]" */
#define ANY -1       /* check_tensor: any size in this dimension */
#define ONE_D -2     /* check_tensor: the tensor is 1-D */

/* One wanted dimension for messages: "*" when any size will do. */
static const char *dim_str(int64_t d, char *buf, size_t n) {
  if (d < 0)
    snprintf(buf, n, "*");
  else
    snprintf(buf, n, "%lld", (long long)d);
  return buf;
}

#define DIM_BUF 24 /* one dimension as text: 20 digits and a sign */

/*
 * Checks that t is a CPU tensor of dtype and shape: a 1-D tensor of d0
 * elements when d1 == ONE_D, otherwise a 2-D d0 x d1 one (ANY accepts any
 * size in that place). Names the tensor and both shapes on failure.
 */
static int check_tensor(mk_ctx_t *ctx, const char *k, const char *name, const mk_tensor_t *t,
                        mk_dtype_t dtype, int64_t d0, int64_t d1) {
  char d[DESC_BUF], w0[DIM_BUF], w1[DIM_BUF];
  if (t->device >= 0)
    return mk_errorf(ctx, "%s: mlp is a CPU library; %s is on cuda:%d", k, name, t->device);
  int want_ndim = d1 == ONE_D ? 1 : 2;
  int ok = t->dtype == dtype && t->ndim == want_ndim && (d0 < 0 || t->shape[0] == d0) &&
           (want_ndim == 1 || d1 < 0 || t->shape[1] == d1);
  if (ok)
    return 0;
  if (want_ndim == 1)
    return mk_errorf(ctx, "%s: %s must be %s[%s], got %s", k, name, mk_dtype_name(dtype),
                     dim_str(d0, w0, sizeof(w0)), desc(t, d, sizeof(d)));
  return mk_errorf(ctx, "%s: %s must be %s[%sx%s], got %s", k, name, mk_dtype_name(dtype),
                   dim_str(d0, w0, sizeof(w0)), dim_str(d1, w1, sizeof(w1)), desc(t, d, sizeof(d)));
}


static int check_range(mk_ctx_t *ctx, const char *k, const char *name, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return mk_errorf(ctx, "%s: %s must be in %lld..%lld, got %lld", k, name, (long long)lo, (long long)hi,
                     (long long)v);
  return 0;
}

/* ---- the model layout ----------------------------------------------------------- */

typedef struct {
  int in, hidden, out;
  float *w1, *b1, *w2, *b2; /* views into one flat tensor, in this order */
} model_t;

static int64_t model_numel(int64_t in, int64_t hidden, int64_t out) {
  return in * hidden + hidden + hidden * out + out;
}

/* Points m's views into flat (a P- or G-shaped array). */
static void model_view(model_t *m, float *flat) {
  m->w1 = flat;
  m->b1 = m->w1 + (size_t)m->in * (size_t)m->hidden;
  m->w2 = m->b1 + m->hidden;
  m->b2 = m->w2 + (size_t)m->hidden * (size_t)m->out;
}

/* Fills m from the kernel's size arguments and checks that P has the right element count. */
static int model_check(mk_ctx_t *ctx, const char *k, model_t *m, const mk_tensor_t *P, int64_t in,
                       int64_t hidden, int64_t out) {
  if (check_range(ctx, k, "input features", in, 1, MLP_MAX_FEATURES) ||
      check_range(ctx, k, "hidden", hidden, 1, MLP_MAX_HIDDEN) ||
      check_range(ctx, k, "classes", out, 2, MLP_MAX_CLASSES))
    return -1;
  m->in = (int)in, m->hidden = (int)hidden, m->out = (int)out;
  int64_t n = model_numel(in, hidden, out);
  char d[DESC_BUF];
  if (P->device >= 0 || P->dtype != MK_F32 || P->ndim != 1 || P->numel != n)
    return mk_errorf(ctx, "%s: P (parameters) must be a CPU f32[%lld] for %lld inputs, %lld hidden, %lld classes; got %s",
                     k, (long long)n, (long long)in, (long long)hidden, (long long)out, desc(P, d, sizeof(d)));
  model_view(m, P->data);
  return 0;
}

/* ---- data set -------------------------------------------------------------------- */

typedef struct {
  int rows, features, classes;
  float *x;    /* rows x features, scaled into [-1, 1] by the largest |value| */
  int32_t *y;  /* rows labels */
} dataset_t;

static void dataset_free(dataset_t *ds) {
  free(ds->x);
  free(ds->y);
  memset(ds, 0, sizeof(*ds));
}

/*
 * Reads the whole (gzip or plain) file into a NUL-terminated buffer that the
 * caller frees. zlib's gzread passes an uncompressed file through unchanged.
 */
static int read_all(mk_ctx_t *ctx, const char *k, const char *path, char **out, size_t *len) {
  errno = 0;
  gzFile f = gzopen(path, "rb");
  if (f == NULL)
    return mk_errorf(ctx, "%s: cannot open %s: %s", k, path, errno ? strerror(errno) : "out of memory");
  size_t cap = MLP_READ_CHUNK, n = 0;
  char *buf = malloc(cap + 1);
  int rc = 0;
  for (;;) {
    if (buf == NULL) {
      rc = mk_errorf(ctx, "%s: out of memory reading %s", k, path);
      break;
    }
    if (cap - n < MLP_READ_CHUNK) {
      char *nb = cap >= MLP_MAX_FILE ? NULL : realloc(buf, cap * 2 + 1);
      if (nb == NULL) {
        rc = cap >= MLP_MAX_FILE
                 ? mk_errorf(ctx, "%s: %s is larger than %u bytes uncompressed (MLP_MAX_FILE)", k, path, MLP_MAX_FILE)
                 : mk_errorf(ctx, "%s: out of memory reading %s", k, path);
        break;
      }
      buf = nb, cap *= 2;
    }
    int got = gzread(f, buf + n, MLP_READ_CHUNK);
    if (got < 0) {
      int zerr = 0;
      const char *msg = gzerror(f, &zerr);
      rc = mk_errorf(ctx, "%s: cannot read %s: %s", k, path, zerr == Z_ERRNO ? strerror(errno) : msg);
      break;
    }
    if (got == 0)
      break;
    n += (size_t)got;
  }
  int crc = gzclose(f);
  if (rc == 0 && crc != Z_OK)
    rc = mk_errorf(ctx, "%s: %s is truncated or corrupt (zlib error %d)", k, path, crc);
  if (rc != 0) {
    free(buf);
    return rc;
  }
  buf[n] = '\0';
  *out = buf, *len = n;
  return 0;
}

/* Counts the fields of the line starting at p (commas + 1). */
static int count_fields(const char *p) {
  int n = 1;
  for (; *p && *p != '\n'; p++)
    n += *p == ',';
  return n;
}

/* Parses one number field ending at ',' or end of line; returns the position after it or NULL. */
static const char *parse_field(const char *p, double *v) {
  char *end;
  if (*p == ' ' || *p == '\t' || *p == ',' || *p == '\n' || *p == '\r' || *p == '\0')
    return NULL;
  errno = 0;
  *v = strtod(p, &end);
  if (end == p || errno == ERANGE || !isfinite(*v))
    return NULL;
  while (*end == ' ' || *end == '\t' || *end == '\r')
    end++;
  if (*end != ',' && *end != '\n' && *end != '\0')
    return NULL;
  return end;
}

/* Copies the field at p (up to 16 chars) for an error message. */
static const char *field_text(const char *p, char *buf, size_t n) {
  size_t i = 0;
  while (i + 1 < n && p[i] && p[i] != ',' && p[i] != '\n' && p[i] != '\r')
    i++;
  memcpy(buf, p, i);
  buf[i] = '\0';
  return buf;
}

#define FIELD_BUF 17 /* a field shown in an error message, at most 16 chars */

/*
 * Parses CSV rows of numbers: the features, then an integer label in the last
 * column. Every row must have as many fields as the first; blank lines are
 * skipped. On success ds owns its arrays (free with dataset_free).
 */
static int parse_csv(mk_ctx_t *ctx, const char *k, const char *path, const char *text, dataset_t *ds) {
  int rows = 0, cols = 0;
  for (const char *p = text; *p;) {
    const char *nl = strchr(p, '\n');
    if (*p != '\n' && *p != '\r') {
      if (rows == 0)
        cols = count_fields(p);
      rows++;
    }
    if (nl == NULL)
      break;
    p = nl + 1;
  }
  if (rows == 0)
    return mk_errorf(ctx, "%s: %s has no rows", k, path);
  if (rows > MLP_MAX_ROWS)
    return mk_errorf(ctx, "%s: %s has %d rows; at most %d (MLP_MAX_ROWS)", k, path, rows, MLP_MAX_ROWS);
  if (cols < 2 || cols - 1 > MLP_MAX_FEATURES)
    return mk_errorf(ctx, "%s: %s line 1 has %d fields; want 2 to %d (features, then the label)", k, path, cols,
                     MLP_MAX_FEATURES + 1);
  memset(ds, 0, sizeof(*ds));
  ds->rows = rows, ds->features = cols - 1;
  ds->x = malloc((size_t)rows * (size_t)ds->features * sizeof(float));
  ds->y = malloc((size_t)rows * sizeof(int32_t));
  if (ds->x == NULL || ds->y == NULL) {
    dataset_free(ds);
    return mk_errorf(ctx, "%s: out of memory for %d rows of %s", k, rows, path);
  }
  double vmax = 0.0;
  int r = 0, line = 0;
  char fb[FIELD_BUF];
  for (const char *p = text; *p && r < rows;) {
    line++;
    if (*p == '\n' || *p == '\r') {
      p = strchr(p, '\n');
      p = p ? p + 1 : "";
      continue;
    }
    int n = count_fields(p);
    if (n != cols) {
      dataset_free(ds);
      return mk_errorf(ctx, "%s: %s line %d has %d fields; line 1 has %d", k, path, line, n, cols);
    }
    for (int c = 0; c < cols; c++) {
      double v;
      const char *end = parse_field(p, &v);
      if (end == NULL) {
        dataset_free(ds);
        return mk_errorf(ctx, "%s: %s line %d field %d is not a number: '%s'", k, path, line, c + 1,
                         field_text(p, fb, sizeof(fb)));
      }
      if (c < ds->features) {
        ds->x[(size_t)r * (size_t)ds->features + (size_t)c] = (float)v;
        vmax = fmax(vmax, fabs(v));
      } else if (v != floor(v) || v < 0 || v >= MLP_MAX_CLASSES) {
        dataset_free(ds);
        return mk_errorf(ctx, "%s: %s line %d: the label (last field) must be an integer in 0..%d, got '%s'", k,
                         path, line, MLP_MAX_CLASSES - 1, field_text(p, fb, sizeof(fb)));
      } else {
        ds->y[r] = (int32_t)v;
        ds->classes = ds->y[r] + 1 > ds->classes ? ds->y[r] + 1 : ds->classes;
      }
      p = *end == ',' ? end + 1 : end;
    }
    p = *p == '\n' ? p + 1 : p;
    r++;
  }
  /* Scale by the data set's own largest value: 16 for the digits' 4-bit pixels. */
  float inv = vmax > 0.0 ? (float)(1.0 / vmax) : 1.0f;
  for (size_t i = 0; i < (size_t)rows * (size_t)ds->features; i++)
    ds->x[i] *= inv;
  return 0;
}

/* Copies the kernel's path argument into a NUL-terminated buffer of MLP_MAX_PATH. */
static int path_arg(mk_ctx_t *ctx, const char *k, const mk_arg_t *a, char *buf) {
  if (a->v.str.len == 0 || a->v.str.len >= MLP_MAX_PATH || memchr(a->v.str.ptr, '\0', a->v.str.len))
    return mk_errorf(ctx, "%s: the data path must be 1 to %d bytes without NUL, got %zu bytes", k,
                     MLP_MAX_PATH - 1, a->v.str.len);
  memcpy(buf, a->v.str.ptr, a->v.str.len);
  buf[a->v.str.len] = '\0';
  return 0;
}

static int dataset_load(mk_ctx_t *ctx, const char *k, const mk_arg_t *patharg, dataset_t *ds) {
  char path[MLP_MAX_PATH];
  char *text = NULL;
  size_t len = 0;
  if (path_arg(ctx, k, patharg, path) || read_all(ctx, k, path, &text, &len))
    return -1;
  if (memchr(text, '\0', len)) {
    free(text);
    return mk_errorf(ctx, "%s: %s is not a text CSV file (it holds NUL bytes)", k, path);
  }
  int rc = parse_csv(ctx, k, path, text, ds);
  free(text);
  return rc;
}

/* How the rows divide: the first n_test of the shuffled order are the test split. */
typedef struct {
  int n_test, n_train, shard;
} split_t;

static int split_sizes(mk_ctx_t *ctx, const char *k, const dataset_t *ds, double frac, split_t *s) {
  if (!(frac >= 0.0 && frac < 1.0))
    return mk_errorf(ctx, "%s: test_fraction must be in [0, 1), got %g", k, frac);
  s->n_test = (int)floor(frac * ds->rows + 0.5);
  s->n_train = ds->rows - s->n_test;
  /* Equal shards keep every proc at the same step count; up to world-1 rows sit out. */
  s->shard = s->n_train / ctx->world;
  if (s->shard < 1)
    return mk_errorf(ctx, "%s: %d training rows cannot be shared by %d procs", k, s->n_train, ctx->world);
  return 0;
}

/* digits_info(path, test_fraction): rows, features, classes, n_train, n_test, shard (rows per proc). */
static int k_digits_info(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const char *k = "digits_info";
  dataset_t ds;
  split_t s;
  if (dataset_load(ctx, k, &argv[0], &ds))
    return -1;
  int rc = split_sizes(ctx, k, &ds, mk_arg_number(&argv[1]), &s);
  int64_t vals[6] = { ds.rows, ds.features, ds.classes, s.n_train, s.n_test, s.shard };
  dataset_free(&ds);
  for (int i = 0; rc == 0 && i < 6; i++)
    rc = mk_return_int(ctx, vals[i]);
  return rc;
}

static void copy_rows(const dataset_t *ds, const int32_t *idx, int n, float *x, int32_t *y) {
  size_t f = (size_t)ds->features;
  for (int i = 0; i < n; i++) {
    memcpy(x + (size_t)i * f, ds->x + (size_t)idx[i] * f, f * sizeof(float));
    y[i] = ds->y[idx[i]];
  }
}

/*
 * digits_load(path, test_fraction, seed, X, Y, Xtest, Ytest): shuffles the
 * rows by seed (the same order on every proc), puts the first n_test in
 * Xtest/Ytest and this rank's equal share of the rest in X/Y. Returns the
 * shard's row count. Shapes must match what digits_info reported.
 */
static int k_digits_load(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const char *k = "digits_load";
  int64_t seed = argv[2].v.i;
  mk_tensor_t *X = argv[3].v.tensor, *Y = argv[4].v.tensor, *Xt = argv[5].v.tensor, *Yt = argv[6].v.tensor;
  dataset_t ds;
  split_t s;
  if (dataset_load(ctx, k, &argv[0], &ds))
    return -1;
  int32_t *perm = NULL;
  int rc = split_sizes(ctx, k, &ds, mk_arg_number(&argv[1]), &s);
  if (rc == 0)
    rc = check_tensor(ctx, k, "X", X, MK_F32, s.shard, ds.features) ||
         check_tensor(ctx, k, "Y", Y, MK_I32, s.shard, ONE_D) ||
         check_tensor(ctx, k, "Xtest", Xt, MK_F32, s.n_test, ds.features) ||
         check_tensor(ctx, k, "Ytest", Yt, MK_I32, s.n_test, ONE_D);
  if (rc == 0 && (perm = mk_scratch(ctx, (size_t)ds.rows * sizeof(int32_t))) == NULL)
    rc = mk_errorf(ctx, "%s: no scratch memory for %d row indices", k, ds.rows);
  if (rc == 0) {
    rng_t r = rng_make(seed, TAG_SPLIT, 0, 0);
    shuffle(&r, perm, ds.rows);
    copy_rows(&ds, perm, s.n_test, Xt->data, Yt->data);
    copy_rows(&ds, perm + s.n_test + (size_t)ctx->rank * (size_t)s.shard, s.shard, X->data, Y->data);
  }
  dataset_free(&ds);
  return rc ? -1 : mk_return_int(ctx, s.shard);
}

/* ---- model kernels ------------------------------------------------------------------ */

/*
 * mlp_init(P, in, hidden, out, seed): uniform He initialisation of W1 (for
 * ReLU), Glorot of W2, zero biases; a function of seed only, so every proc
 * starts from the same weights.
 */
static int k_mlp_init(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  model_t m;
  mk_tensor_t *P = argv[0].v.tensor;
  if (model_check(ctx, "mlp_init", &m, P, argv[1].v.i, argv[2].v.i, argv[3].v.i))
    return -1;
  rng_t r = rng_make(argv[4].v.i, TAG_INIT, 0, 0);
  float a1 = sqrtf(6.0f / (float)m.in), a2 = sqrtf(6.0f / (float)(m.hidden + m.out));
  for (size_t i = 0; i < (size_t)m.in * (size_t)m.hidden; i++)
    m.w1[i] = a1 * rng_sym(&r);
  for (size_t i = 0; i < (size_t)m.hidden * (size_t)m.out; i++)
    m.w2[i] = a2 * rng_sym(&r);
  memset(m.b1, 0, (size_t)m.hidden * sizeof(float));
  memset(m.b2, 0, (size_t)m.out * sizeof(float));
  return 0;
}

/* Row-major C[m x n] = op(A) @ op(B) + beta*C; a thin wrapper that names the leading dimensions. */
static void gemm(int ta, int tb, int m, int n, int k, const float *A, const float *B, float beta, float *C) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, A,
              ta ? m : k, B, tb ? k : n, beta, C, n);
}

/* Hidden activations A1 = relu(X @ W1 + b1) and logits Z = A1 @ W2 + b2 for b rows. */
static void forward(const model_t *m, int b, const float *x, float *a1, float *z) {
  gemm(0, 0, b, m->hidden, m->in, x, m->w1, 0.0f, a1);
  for (int i = 0; i < b; i++) {
    float *row = a1 + (size_t)i * (size_t)m->hidden;
    for (int j = 0; j < m->hidden; j++) {
      float v = row[j] + m->b1[j];
      row[j] = v > 0.0f ? v : 0.0f;
    }
  }
  gemm(0, 0, b, m->out, m->hidden, a1, m->w2, 0.0f, z);
  for (int i = 0; i < b; i++)
    for (int j = 0; j < m->out; j++)
      z[(size_t)i * (size_t)m->out + (size_t)j] += m->b2[j];
}

/*
 * Cross-entropy of one row of logits against label y. When prob is not NULL
 * it receives softmax(z) - onehot(y), scaled by g (the row's share of the
 * mean). Adds to *loss and *correct (argmax == y, first maximum wins).
 */
static void softmax_xent(const float *z, int n, int y, float g, float *prob, double *loss, int64_t *correct) {
  int arg = 0;
  for (int j = 1; j < n; j++)
    arg = z[j] > z[arg] ? j : arg;
  double zmax = z[arg], sum = 0.0;
  for (int j = 0; j < n; j++)
    sum += exp((double)z[j] - zmax);
  *loss += log(sum) - ((double)z[y] - zmax);
  *correct += arg == y;
  if (prob == NULL)
    return;
  for (int j = 0; j < n; j++)
    prob[j] = g * ((float)(exp((double)z[j] - zmax) / sum) - (j == y ? 1.0f : 0.0f));
}

/* Column sums of a b x n matrix into out[n], in row order (a fixed order, so reproducible). */
static void col_sums(const float *a, int b, int n, float *out) {
  for (int j = 0; j < n; j++)
    out[j] = 0.0f;
  for (int i = 0; i < b; i++)
    for (int j = 0; j < n; j++)
      out[j] += a[(size_t)i * (size_t)n + (size_t)j];
}

static int check_labels(mk_ctx_t *ctx, const char *k, const int32_t *y, const int32_t *rows, int n, int out) {
  for (int i = 0; i < n; i++) {
    int r = rows ? rows[i] : i;
    if (y[r] < 0 || y[r] >= out)
      return mk_errorf(ctx, "%s: label %d of row %d is outside 0..%d (rank %d)", k, (int)y[r], r, out - 1, ctx->rank);
  }
  return 0;
}

/* Bytes of scratch one step needs: the epoch's order of n rows, then the batch, activations, logits and hidden gradients. */
static size_t step_scratch(const model_t *m, int n, int b) {
  return (size_t)n * sizeof(int32_t) + (size_t)b * ((size_t)m->in + 2 * (size_t)m->hidden + (size_t)m->out) * sizeof(float);
}

/*
 * The gradient of batch `step` of `epoch` of this rank's shard X/Y (n rows)
 * into G, laid out like m; adds the batch's summed loss and correct count.
 * mem holds step_scratch bytes. Arguments were checked by the caller.
 */
static int grad_step(mk_ctx_t *ctx, const char *k, const model_t *m, const mk_tensor_t *X, const mk_tensor_t *Y,
                     mk_tensor_t *G, int b, int64_t seed, int64_t epoch, int64_t step, char *mem, double *loss,
                     int64_t *correct) {
  int n = (int)X->shape[0];
  model_t g = *m;
  model_view(&g, G->data);
  int32_t *perm = (int32_t *)mem;
  float *xb = (float *)(mem + (size_t)n * sizeof(int32_t)), *a1 = xb + (size_t)b * (size_t)m->in;
  float *z = a1 + (size_t)b * (size_t)m->hidden, *d1 = z + (size_t)b * (size_t)m->out;
  rng_t r = rng_make(seed, TAG_BATCH, epoch, ctx->rank);
  shuffle(&r, perm, n);
  const int32_t *rows = perm + (size_t)step * (size_t)b;
  const float *x = X->data;
  const int32_t *y = Y->data;
  if (check_labels(ctx, k, y, rows, b, m->out))
    return -1;
  for (int i = 0; i < b; i++)
    memcpy(xb + (size_t)i * (size_t)m->in, x + (size_t)rows[i] * (size_t)m->in, (size_t)m->in * sizeof(float));
  forward(m, b, xb, a1, z);
  for (int i = 0; i < b; i++) {
    float *zi = z + (size_t)i * (size_t)m->out;
    softmax_xent(zi, m->out, y[rows[i]], 1.0f / (float)b, zi, loss, correct); /* z becomes dL/dz */
  }
  gemm(1, 0, m->hidden, m->out, b, a1, z, 0.0f, g.w2); /* dW2 = A1^T dZ */
  col_sums(z, b, m->out, g.b2);
  gemm(0, 1, b, m->hidden, m->out, z, m->w2, 0.0f, d1); /* dA1 = dZ W2^T */
  for (size_t i = 0; i < (size_t)b * (size_t)m->hidden; i++)
    d1[i] = a1[i] > 0.0f ? d1[i] : 0.0f; /* through the ReLU */
  gemm(1, 0, m->in, m->hidden, b, xb, d1, 0.0f, g.w1); /* dW1 = X^T dA1 */
  col_sums(d1, b, m->hidden, g.b1);
  return 0;
}

/* Checks the tensors and sizes forward/backward takes (argv from P on: P, X, Y, G, hidden, classes, batch) into m. */
static int check_fb(mk_ctx_t *ctx, const char *k, const mk_arg_t *a, model_t *m, int *n) {
  mk_tensor_t *P = a[0].v.tensor, *X = a[1].v.tensor, *Y = a[2].v.tensor, *G = a[3].v.tensor;
  int64_t batch = a[6].v.i;
  if (check_tensor(ctx, k, "X", X, MK_F32, ANY, ANY) || model_check(ctx, k, m, P, X->shape[1], a[4].v.i, a[5].v.i))
    return -1;
  *n = X->shape[0] > INT_MAX ? INT_MAX : (int)X->shape[0];
  return check_tensor(ctx, k, "Y", Y, MK_I32, X->shape[0], ONE_D) ||
         check_tensor(ctx, k, "G (gradients)", G, MK_F32, P->numel, ONE_D) ||
         check_range(ctx, k, "batch", batch, 1, *n < MLP_MAX_BATCH ? *n : MLP_MAX_BATCH);
}

/*
 * mlp_forward_backward(P, X, Y, G, hidden, classes, batch, seed, epoch, step):
 * takes batch `step` of `epoch` from this proc's shard X/Y (the epoch's order
 * is a shuffle keyed by seed, epoch and rank; a partial last batch is
 * dropped), writes the gradient of the batch's mean cross-entropy into G
 * (laid out like P) and returns the batch's summed loss and its number of
 * correct predictions.
 */
static int k_mlp_forward_backward(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const char *k = "mlp_forward_backward";
  int64_t batch = argv[6].v.i, seed = argv[7].v.i, epoch = argv[8].v.i, step = argv[9].v.i;
  model_t m;
  int n;
  if (check_fb(ctx, k, argv, &m, &n) || check_range(ctx, k, "epoch", epoch, 0, INT32_MAX) ||
      check_range(ctx, k, "step", step, 0, n / batch - 1))
    return -1;
  char *mem = mk_scratch(ctx, step_scratch(&m, n, (int)batch));
  if (mem == NULL)
    return mk_errorf(ctx, "%s: no scratch memory for a batch of %d", k, (int)batch);
  double loss = 0.0;
  int64_t correct = 0;
  if (grad_step(ctx, k, &m, argv[1].v.tensor, argv[2].v.tensor, argv[3].v.tensor, (int)batch, seed, epoch, step, mem,
                &loss, &correct))
    return -1;
  int rc = mk_return_number(ctx, loss);
  return rc ? rc : mk_return_int(ctx, correct);
}

/* One Adam step t (1-based) on p with gradient scale*gr; mo and v are the moments. Elementwise. */
static void adam_step(float *p, const float *gr, float *mo, float *v, int64_t count, float lrf, int64_t t, float sc) {
  float b1 = (float)MLP_ADAM_BETA1, b2 = (float)MLP_ADAM_BETA2;
  float c1 = (float)(1.0 - pow(MLP_ADAM_BETA1, (double)t)), c2 = (float)(1.0 - pow(MLP_ADAM_BETA2, (double)t));
  float eps = (float)MLP_ADAM_EPS;
  for (int64_t i = 0; i < count; i++) {
    float gi = gr[i] * sc;
    mo[i] = b1 * mo[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    p[i] -= lrf * (mo[i] / c1) / (sqrtf(v[i] / c2) + eps);
  }
}

static int check_lr(mk_ctx_t *ctx, const char *k, double lr, double scale) {
  if (!(lr > 0.0 && lr < 1e3) || !isfinite(scale))
    return mk_errorf(ctx, "%s: want 0 < lr < 1000 and a finite grad_scale, got lr=%g grad_scale=%g", k, lr, scale);
  return 0;
}

/*
 * mlp_adam(P, G, S, lr, t, grad_scale): one Adam step t (1-based) on P with
 * gradient grad_scale*G (1/world turns an all-reduced sum into the mean);
 * S holds the moments m | v. Elementwise, so identical inputs give
 * identical outputs on every proc.
 */
static int k_mlp_adam(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const char *k = "mlp_adam";
  mk_tensor_t *P = argv[0].v.tensor, *G = argv[1].v.tensor, *S = argv[2].v.tensor;
  double lr = mk_arg_number(&argv[3]), scale = mk_arg_number(&argv[5]);
  int64_t t = argv[4].v.i;
  if (check_tensor(ctx, k, "P (parameters)", P, MK_F32, ANY, ONE_D) ||
      check_tensor(ctx, k, "G (gradients)", G, MK_F32, P->numel, ONE_D) ||
      check_tensor(ctx, k, "S (Adam state)", S, MK_F32, 2 * P->numel, ONE_D) ||
      check_range(ctx, k, "t (step)", t, 1, INT32_MAX) || check_lr(ctx, k, lr, scale))
    return -1;
  float *mo = S->data;
  adam_step(P->data, G->data, mo, mo + P->numel, P->numel, (float)lr, t, (float)scale);
  return 0;
}

/*
 * mlp_train(g, P, X, Y, G, hidden, classes, batch, S, seed, lr, first, K,
 * steps_per_epoch): K whole data-parallel steps first .. first+K-1 in one
 * call. Each is mlp_forward_backward of batch (s % steps_per_epoch) of
 * epoch (s / steps_per_epoch), an in-kernel all_reduce(sum) of G over the
 * group g, and mlp_adam with t = s + 1 and grad_scale 1 / size of g: the
 * same arithmetic in the same order as those three calls, so the weights
 * are bitwise the same as the step-by-step loop's. Returns K pairs: each
 * step's summed loss and correct count on this proc.
 */
static int k_mlp_train(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const char *k = "mlp_train";
  const mk_group_t *grp = argv[0].v.group;
  mk_tensor_t *P = argv[1].v.tensor, *G = argv[4].v.tensor, *S = argv[8].v.tensor;
  int64_t batch = argv[7].v.i, seed = argv[9].v.i, first = argv[11].v.i, K = argv[12].v.i, spe = argv[13].v.i;
  double lr = mk_arg_number(&argv[10]), scale = 1.0 / (double)grp->size;
  model_t m;
  int n;
  if (check_fb(ctx, k, argv + 1, &m, &n) || check_tensor(ctx, k, "S (Adam state)", S, MK_F32, 2 * P->numel, ONE_D) ||
      check_lr(ctx, k, lr, scale) || check_range(ctx, k, "steps_per_epoch", spe, 1, n / batch) ||
      check_range(ctx, k, "K", K, 1, MLP_MAX_FUSED) || check_range(ctx, k, "first", first, 0, INT32_MAX - K))
    return -1;
  char *mem = mk_scratch(ctx, step_scratch(&m, n, (int)batch));
  if (mem == NULL)
    return mk_errorf(ctx, "%s: no scratch memory for a batch of %d", k, (int)batch);
  float *mo = S->data;
  for (int64_t s = first; s < first + K; s++) {
    double loss = 0.0;
    int64_t correct = 0;
    if (mk_cancelled(ctx))
      return mk_errorf(ctx, "%s: cancelled at step %lld", k, (long long)s);
    if (grad_step(ctx, k, &m, argv[2].v.tensor, argv[3].v.tensor, G, (int)batch, seed, s / spe, s % spe, mem, &loss,
                  &correct))
      return -1;
    int rc = mk_all_reduce(ctx, grp, G, MK_SUM);
    if (rc)
      return rc;
    adam_step(P->data, G->data, mo, mo + P->numel, P->numel, (float)lr, s + 1, (float)scale);
    if ((rc = mk_return_number(ctx, loss)) || (rc = mk_return_int(ctx, correct)))
      return rc;
  }
  return 0;
}

/*
 * mlp_evaluate(P, X, Y, hidden, classes): summed cross-entropy, number of
 * correct predictions and number of rows over all of X/Y (in chunks of
 * MLP_EVAL_CHUNK rows).
 */
static int k_mlp_evaluate(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const char *k = "mlp_evaluate";
  mk_tensor_t *P = argv[0].v.tensor, *X = argv[1].v.tensor, *Y = argv[2].v.tensor;
  model_t m;
  if (check_tensor(ctx, k, "X", X, MK_F32, ANY, ANY) ||
      model_check(ctx, k, &m, P, X->shape[1], argv[3].v.i, argv[4].v.i) ||
      check_tensor(ctx, k, "Y", Y, MK_I32, X->shape[0], ONE_D))
    return -1;
  if (X->shape[0] > INT_MAX)
    return mk_errorf(ctx, "%s: X has %lld rows; at most %d", k, (long long)X->shape[0], INT_MAX);
  int n = (int)X->shape[0];
  float *a1 = mk_scratch(ctx, (size_t)MLP_EVAL_CHUNK * ((size_t)m.hidden + (size_t)m.out) * sizeof(float));
  if (a1 == NULL)
    return mk_errorf(ctx, "%s: no scratch memory for %d rows", k, MLP_EVAL_CHUNK);
  float *z = a1 + (size_t)MLP_EVAL_CHUNK * (size_t)m.hidden;
  const float *x = X->data;
  const int32_t *y = Y->data;
  if (check_labels(ctx, k, y, NULL, n, m.out))
    return -1;
  double loss = 0.0;
  int64_t correct = 0;
  for (int i0 = 0; i0 < n; i0 += MLP_EVAL_CHUNK) {
    int b = n - i0 < MLP_EVAL_CHUNK ? n - i0 : MLP_EVAL_CHUNK;
    if (mk_cancelled(ctx))
      return mk_error(ctx, "mlp_evaluate: cancelled");
    forward(&m, b, x + (size_t)i0 * (size_t)m.in, a1, z);
    for (int i = 0; i < b; i++)
      softmax_xent(z + (size_t)i * (size_t)m.out, m.out, y[i0 + i], 0.0f, NULL, &loss, &correct);
  }
  int rc = mk_return_number(ctx, loss);
  rc = rc ? rc : mk_return_int(ctx, correct);
  return rc ? rc : mk_return_int(ctx, n);
}

/* mlp_bytes(t): the raw bytes of a CPU tensor, so that one proc's copy can be fetched alone. */
static int k_mlp_bytes(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const mk_tensor_t *t = argv[0].v.tensor;
  if (t->device >= 0)
    return mk_errorf(ctx, "mlp_bytes: mlp is a CPU library; tensor is on cuda:%d", t->device);
  return mk_return_bytes(ctx, t->data, t->nbytes);
}

static const mk_kernel_t kernels[] = {
  { "digits_info", k_digits_info, "sn",
    "digits_info(path, test_fraction): rows, features, classes, n_train, n_test, shard (rows per proc)." },
  { "digits_load", k_digits_load, "snitttt",
    "digits_load(path, test_fraction, seed, X, Y, Xtest, Ytest): this rank's shard and the shared test split." },
  { "mlp_init", k_mlp_init, "tiiii", "mlp_init(P, in, hidden, classes, seed): deterministic initial weights." },
  { "mlp_forward_backward", k_mlp_forward_backward, "ttttiiiiii",
    "mlp_forward_backward(P, X, Y, G, hidden, classes, batch, seed, epoch, step): G = mean gradient of the "
    "batch; returns summed loss, correct count." },
  { "mlp_adam", k_mlp_adam, "tttnin", "mlp_adam(P, G, S, lr, t, grad_scale): one Adam step with grad_scale*G." },
  { "mlp_train", k_mlp_train, "gttttiiitiniii",
    "mlp_train(g, P, X, Y, G, hidden, classes, batch, S, seed, lr, first, K, steps_per_epoch): K fused steps with an "
    "in-kernel all_reduce over g; returns each step's summed loss and correct count." },
  { "mlp_evaluate", k_mlp_evaluate, "tttii",
    "mlp_evaluate(P, X, Y, hidden, classes): summed loss, correct count, rows." },
  { "mlp_bytes", k_mlp_bytes, "t", "mlp_bytes(t): the tensor's raw bytes." },
};

MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {
    MK_ABI_VERSION, "mlp", (int)(sizeof(kernels) / sizeof(kernels[0])), kernels,
  };
  return &lib;
}
