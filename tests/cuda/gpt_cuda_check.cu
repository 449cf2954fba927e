/*
 * gpt_cuda_check.cu - cuda_gpt against gpt on one GPU (build/tests/gpt_cuda_check, built by mk/cuda.mk where
 * nvcc and OpenBLAS are; bench/gpu_check.sh runs it). Every layer of kernels/cuda/gpt_*.cu and its twin of
 * kernels/cpu/gpt_*.c get the same inputs; then the whole model's logits and gradient; then the kernels
 * gpt_train, gpt_eval and gpt_sample of both libraries, called as a proc calls them (a small mk_ctx_t of our
 * own), from the same initial weights on the same text. One line per check ("ok" or "FAIL", the largest
 * difference relative to the largest reference value, and the tolerance); the last line is
 * "gpt_cuda_check: PASS (n checks)" or "gpt_cuda_check: FAIL (k of n)", and the exit status says the same.
 *
 * Tolerances: FP32 on both sides, other summation orders and fused multiply-adds on the GPU: 1e-5 of the
 * largest value for a forward, 1e-4 for a backward (column sums over rows), 2e-3 for a loss after 30 steps
 * of AdamW (whose early steps are close to sign(g) and so pass small differences on at full size).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_cuda.h"

#define CK_SEED 1234       /* the generator key of every random input */
#define CK_STEPS 30        /* training steps of the kernel comparison */
#define CK_TEXT 65536      /* bytes of the synthetic text */
#define CK_MAX_RESULTS 256 /* numbers one kernel call may return here */

static int checks, failures;

#define CUDA_OK(call)                                                                       \
  do {                                                                                      \
    cudaError_t rc_ = (call);                                                               \
    if (rc_ != cudaSuccess) {                                                               \
      fprintf(stderr, "gpt_cuda_check: %s: %s\n", #call, cudaGetErrorString(rc_));          \
      exit(2);                                                                              \
    }                                                                                       \
  } while (0)

/* ---- a proc's services, enough for the kernels ------------------------------------------ */

static char err_msg[1024];
static double results[CK_MAX_RESULTS];
static int nresults;
static char text_result[64]; /* gpt_sample's bytes (32 here), newlines shown as '|' */
static void *scratch_blocks[64];
static int nscratch;

static int c_nil(mk_ctx_t *) { return 0; }
static int c_bool(mk_ctx_t *, int) { return 0; }
static int c_int(mk_ctx_t *, int64_t i) { return nresults < CK_MAX_RESULTS ? (results[nresults++] = (double)i, 0) : -1; }
static int c_num(mk_ctx_t *, double d) { return nresults < CK_MAX_RESULTS ? (results[nresults++] = d, 0) : -1; }
static int c_str(mk_ctx_t *, const char *s, size_t n) {
  size_t i = 0;
  for (; i < n && i + 1 < sizeof(text_result); i++) text_result[i] = s[i] >= 32 && s[i] < 127 ? s[i] : '|';
  text_result[i] = '\0';
  return 0;
}
static int c_bytes(mk_ctx_t *, const void *, size_t) { return 0; }
static int c_error(mk_ctx_t *, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_msg, sizeof(err_msg), fmt, ap);
  va_end(ap);
  return -1;
}
static void *c_scratch(mk_ctx_t *, size_t n) {
  return nscratch < 64 ? (scratch_blocks[nscratch++] = calloc(1, n ? n : 1)) : NULL;
}
static int c_cancelled(mk_ctx_t *) { return 0; }
static int c_no_group(mk_ctx_t *ctx, const mk_group_t *, mk_tensor_t *, int) {
  return mk_error(ctx, "gpt_cuda_check: groups of one only");
}

static mk_api_t api;
static mk_ctx_t ctx;

static void ctx_init(void) {
  api.ret_nil = c_nil, api.ret_bool = c_bool, api.ret_int = c_int, api.ret_number = c_num;
  api.ret_string = c_str, api.ret_bytes = c_bytes, api.error = c_error, api.scratch = c_scratch;
  api.cancelled = c_cancelled, api.all_reduce = c_no_group;
  ctx.api = &api, ctx.rank = 0, ctx.world = 1, ctx.device = 0, ctx.stream = NULL, ctx.kernel = "check";
}

/* Runs a kernel as a proc would: fresh results and scratch; exits on its failure. */
static void call(const char *name, mk_fn_t fn, const mk_arg_t *argv, int argc) {
  nresults = 0, err_msg[0] = '\0', ctx.kernel = name;
  int rc = fn(&ctx, argc, argv);
  for (int i = 0; i < nscratch; i++) free(scratch_blocks[i]);
  nscratch = 0;
  if (rc != 0) {
    fprintf(stderr, "gpt_cuda_check: %s failed: %s\n", name, err_msg);
    exit(2);
  }
}

/* ---- inputs, device copies, comparisons ---------------------------------------------- */

static rng_t rng;

static float *rnd(size_t n, float scale, float offset) {
  float *p = (float *)malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = offset + scale * rng_sym(&rng);
  return p;
}

static void *to_dev(const void *p, size_t bytes) {
  void *d = NULL;
  CUDA_OK(cudaMalloc(&d, bytes ? bytes : 1));
  if (p != NULL) CUDA_OK(cudaMemcpy(d, p, bytes, cudaMemcpyHostToDevice));
  else CUDA_OK(cudaMemset(d, 0, bytes));
  return d;
}

static float *dev(const float *p, size_t n) { return (float *)to_dev(p, n * sizeof(float)); }

/* Reports how far got (device, n floats) is from ref (host), relative to ref's largest magnitude. */
static double compare(const char *what, const float *ref, const float *got_dev, size_t n, double tol) {
  float *got = (float *)malloc(n * sizeof(float));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(got, got_dev, n * sizeof(float), cudaMemcpyDeviceToHost));
  double diff = 0.0, big = 0.0;
  int finite = 1;
  for (size_t i = 0; i < n; i++) {
    finite &= isfinite(got[i]);
    diff = fmax(diff, fabs((double)got[i] - ref[i]));
    big = fmax(big, fabs((double)ref[i]));
  }
  double rel = diff / (big > 0 ? big : 1.0);
  int ok = finite && rel <= tol;
  checks++, failures += !ok;
  printf("%s %-34s max |diff| %.3g = %.3g of max |ref| (tolerance %.0e)%s\n", ok ? "ok  " : "FAIL", what, diff, rel,
         tol, finite ? "" : "; not finite");
  free(got);
  return rel;
}

static void verdict(const char *what, int ok, const char *detail) {
  checks++, failures += !ok;
  printf("%s %-34s %s\n", ok ? "ok  " : "FAIL", what, detail);
}

static gcu_t gpu;

#define FWD_TOL 1e-5 /* a forward's outputs */
#define BWD_TOL 1e-4 /* a backward's outputs */

/* ---- the layers ------------------------------------------------------------------------ */

enum { B_ = 2, T_ = 16, C_ = 32, NH_ = 4, HS_ = 8, N_ = B_ * T_, F_ = 4 * C_ };

static void check_norm(void) {
  float *x = rnd(N_ * C_, 2.0f, 0.5f), *g = rnd(C_, 0.5f, 1.0f), *b = rnd(C_, 0.5f, 0.0f), *dy = rnd(N_ * C_, 1, 0);
  float *y = rnd(N_ * C_, 0, 0), *mu = rnd(N_, 0, 0), *rs = rnd(N_, 0, 0);
  float *dx = rnd(N_ * C_, 1, 0), *dg = rnd(C_, 1, 0), *db = rnd(C_, 1, 0);
  float *Dx = dev(x, N_ * C_), *Dg = dev(g, C_), *Db = dev(b, C_), *Dy = dev(NULL, N_ * C_), *Dmu = dev(NULL, N_);
  float *Drs = dev(NULL, N_), *Ddy = dev(dy, N_ * C_), *Ddx = dev(dx, N_ * C_), *Ddg = dev(dg, C_), *Ddb = dev(db, C_);
  gpt_norm_forward(y, mu, rs, x, g, b, N_, C_);
  if (gcu_norm_forward(&gpu, Dy, Dmu, Drs, Dx, Dg, Db, N_, C_)) exit(2);
  compare("gpt_norm_forward y", y, Dy, N_ * C_, FWD_TOL);
  compare("gpt_norm_forward mu", mu, Dmu, N_, FWD_TOL);
  compare("gpt_norm_forward rs", rs, Drs, N_, FWD_TOL);
  gpt_norm_backward(dx, dg, db, dy, x, mu, rs, g, N_, C_);
  if (gcu_norm_backward(&gpu, Ddx, Ddg, Ddb, Ddy, Dx, Dmu, Drs, Dg, N_, C_)) exit(2);
  compare("gpt_norm_backward dx (added to)", dx, Ddx, N_ * C_, BWD_TOL);
  compare("gpt_norm_backward dg", dg, Ddg, C_, BWD_TOL);
  compare("gpt_norm_backward db", db, Ddb, C_, BWD_TOL);
}

static void check_linear(void) {
  float *x = rnd(N_ * C_, 1, 0), *W = rnd(C_ * F_, 0.2f, 0), *b = rnd(F_, 0.5f, 0), *dy = rnd(N_ * F_, 1, 0);
  float *y = rnd(N_ * F_, 0, 0), *dx = rnd(N_ * C_, 0, 0), *dW = rnd(C_ * F_, 1, 0), *db = rnd(F_, 1, 0);
  float *Dx = dev(x, N_ * C_), *DW = dev(W, C_ * F_), *Db = dev(b, F_), *Dy = dev(NULL, N_ * F_);
  float *Ddy = dev(dy, N_ * F_), *Ddx = dev(NULL, N_ * C_), *DdW = dev(dW, C_ * F_), *Ddb = dev(db, F_);
  gpt_linear_forward(y, x, W, b, N_, C_, F_);
  if (gcu_linear_forward(&gpu, Dy, Dx, DW, Db, N_, C_, F_)) exit(2);
  compare("gpt_linear_forward y (bias)", y, Dy, N_ * F_, FWD_TOL);
  gpt_linear_forward(y, x, W, NULL, N_, C_, F_);
  if (gcu_linear_forward(&gpu, Dy, Dx, DW, NULL, N_, C_, F_)) exit(2);
  compare("gpt_linear_forward y (no bias)", y, Dy, N_ * F_, FWD_TOL);
  gpt_linear_backward(dx, dW, db, dy, x, W, N_, C_, F_, 0.0f);
  if (gcu_linear_backward(&gpu, Ddx, DdW, Ddb, Ddy, Dx, DW, N_, C_, F_, 0.0f)) exit(2);
  compare("gpt_linear_backward dx", dx, Ddx, N_ * C_, BWD_TOL);
  compare("gpt_linear_backward dW (added to)", dW, DdW, C_ * F_, BWD_TOL);
  compare("gpt_linear_backward db (added to)", db, Ddb, F_, BWD_TOL);
}

static void check_attn(void) {
  size_t nq = (size_t)N_ * 3 * C_, ny = (size_t)N_ * C_, na = (size_t)B_ * NH_ * T_ * T_;
  float *qkv = rnd(nq, 1, 0), *dy = rnd(ny, 1, 0), *y = rnd(ny, 0, 0), *att = rnd(na, 0, 0), *dqkv = rnd(nq, 0, 0);
  float *datt = rnd((size_t)T_ * T_, 0, 0);
  float *Dq = dev(qkv, nq), *Ddy = dev(dy, ny), *Dy = dev(NULL, ny), *Datt = dev(NULL, na), *Ddq = dev(NULL, nq);
  float *Ddatt = dev(NULL, (size_t)NH_ * T_ * T_);
  gpt_attn_forward(y, att, qkv, B_, T_, NH_, HS_);
  if (gcu_attn_forward(&gpu, Dy, Datt, Dq, B_, T_, NH_, HS_)) exit(2);
  compare("gpt_attn_forward y", y, Dy, ny, FWD_TOL);
  compare("gpt_attn_forward att", att, Datt, na, FWD_TOL);
  gpt_attn_backward(dqkv, datt, dy, att, qkv, B_, T_, NH_, HS_);
  if (gcu_attn_backward(&gpu, Ddq, Ddatt, Ddy, Datt, Dq, B_, T_, NH_, HS_)) exit(2);
  compare("gpt_attn_backward dqkv", dqkv, Ddq, nq, BWD_TOL);
}

static void check_gelu(void) {
  size_t n = (size_t)N_ * F_;
  float *f = rnd(n, 4, 0), *dg = rnd(n, 1, 0), *g = rnd(n, 0, 0), *th = rnd(n, 0, 0), *df = rnd(n, 0, 0);
  float *Df = dev(f, n), *Ddg = dev(dg, n), *Dg = dev(NULL, n), *Dth = dev(NULL, n), *Ddf = dev(NULL, n);
  gpt_gelu_forward(g, th, f, (int64_t)n);
  if (gcu_gelu_forward(&gpu, Dg, Dth, Df, (int64_t)n)) exit(2);
  compare("gpt_gelu_forward", g, Dg, n, FWD_TOL);
  gpt_gelu_backward(df, dg, f, th, (int64_t)n);
  if (gcu_gelu_backward(&gpu, Ddf, Ddg, Df, Dth, (int64_t)n)) exit(2);
  compare("gpt_gelu_backward", df, Ddf, n, BWD_TOL);
}

static void check_xent(void) {
  size_t n = (size_t)N_ * GPT_VOCAB;
  float *z = rnd(n, 3, 0), *d = rnd(n, 0, 0);
  uint8_t tgt[N_];
  for (int i = 0; i < N_; i++) tgt[i] = (uint8_t)rng_below(&rng, GPT_VOCAB);
  float *Dz = dev(z, n);
  uint8_t *Dt = (uint8_t *)to_dev(tgt, N_);
  double *Drow = (double *)to_dev(NULL, N_ * sizeof(double)), *Dsum = (double *)to_dev(NULL, sizeof(double)), sum;
  double ref = gpt_xent_forward(d, z, tgt, N_, GPT_VOCAB, 1.0f / N_);
  if (gcu_xent_forward(&gpu, Dz, Dz, Dt, N_, GPT_VOCAB, 1.0f / N_, Drow) || gcu_sum_rows(&gpu, Drow, N_, Dsum, NULL))
    exit(2);
  CUDA_OK(cudaMemcpy(&sum, Dsum, sizeof(sum), cudaMemcpyDeviceToHost));
  char line[128];
  snprintf(line, sizeof(line), "summed loss %.9g, gpt's %.9g (tolerance 1e-9 relative)", sum, ref);
  verdict("gpt_xent_forward loss", fabs(sum - ref) <= 1e-9 * fabs(ref), line);
  compare("gpt_xent_forward dlogits (in place)", d, Dz, n, FWD_TOL);
}

static void check_embed(void) {
  uint8_t tok[N_];
  int32_t order[N_], start[GPT_VOCAB + 1];
  for (int i = 0; i < N_; i++) tok[i] = (uint8_t)(rng_below(&rng, 6) * 40); /* repeats: buckets of several rows */
  size_t nte = (size_t)GPT_VOCAB * C_, npe = (size_t)T_ * C_, nx = (size_t)N_ * C_;
  float *wte = rnd(nte, 1, 0), *wpe = rnd(npe, 1, 0), *x = rnd(nx, 0, 0), *dx = rnd(nx, 1, 0);
  float *dwte = rnd(nte, 1, 0), *dwpe = rnd(npe, 1, 0);
  gcu_embed_buckets(tok, N_, order, start);
  float *Dte = dev(wte, nte), *Dpe = dev(wpe, npe), *Dx = dev(NULL, nx), *Ddx = dev(dx, nx);
  float *Ddte = dev(dwte, nte), *Ddpe = dev(dwpe, npe);
  uint8_t *Dtok = (uint8_t *)to_dev(tok, N_);
  int32_t *Dord = (int32_t *)to_dev(order, sizeof(order)), *Dst = (int32_t *)to_dev(start, sizeof(start));
  gpt_embed_forward(x, tok, wte, wpe, B_, T_, C_);
  if (gcu_embed_forward(&gpu, Dx, Dtok, Dte, Dpe, B_, T_, C_)) exit(2);
  compare("gpt_embed_forward", x, Dx, nx, 0.0);
  gpt_embed_backward(dwte, dwpe, dx, tok, B_, T_, C_);
  if (gcu_embed_backward(&gpu, Ddte, Ddpe, Ddx, Dord, Dst, B_, T_, C_)) exit(2);
  compare("gpt_embed_backward dwte (same order)", dwte, Ddte, nte, 0.0);
  compare("gpt_embed_backward dwpe (same order)", dwpe, Ddpe, npe, 0.0);
}

/* AdamW and the norm's squares over the layout of a small model: every segment, its decay by kind. */
static void check_adamw(void) {
  gpt_cfg_t c;
  gcu_seg_t seg[GPT_MAX_SEGS];
  gpt_seg_t s[GPT_MAX_SEGS];
  if (gpt_cfg_init(&c, 2, 4, 32, 16, 2, 1)) exit(2); /* a tp = 2 shard: sharded and replicated segments */
  size_t n = (size_t)gpt_numel(&c);
  float *p = rnd(n, 0.1f, 0), *g = rnd(n, 1, 0), *m = rnd(n, 0.1f, 0), *v = rnd(n, 0.01f, 0.02f);
  float lr = 3e-3f, wd = 0.1f, gscale = 0.7f;
  int ns = gcu_segments(&c, lr, wd, seg), ks = gpt_segments(&c, s);
  int64_t maxn = 0;
  for (int k = 0; k < ns; k++) maxn = seg[k].n > maxn ? seg[k].n : maxn;
  float *Dp = dev(p, n), *Dg = dev(g, n), *Dm = dev(m, n), *Dv = dev(v, n);
  gcu_seg_t *Dseg = (gcu_seg_t *)to_dev(seg, (size_t)ns * sizeof(gcu_seg_t));
  double *Dpart = (double *)to_dev(NULL, (size_t)ns * GCU_NORM_BLOCKS * sizeof(double)), rep = 0, shd = 0, drep;
  float *Dshd = dev(NULL, 1), dshd;
  double *Drep = (double *)to_dev(NULL, sizeof(double));
  for (int k = 0; k < ks; k++) {
    double a = 0;
    for (int64_t i = s[k].off; i < s[k].off + s[k].rows * s[k].cols; i++) a += (double)g[i] * g[i];
    if (s[k].split == SPLIT_NONE) rep += a; else shd += a;
    float d = s[k].kind == SEG_MATRIX || s[k].kind == SEG_PROJ ? wd : 0.0f;
    gpt_adamw(p, g, m, v, s[k].off, s[k].off + s[k].rows * s[k].cols, lr, d, 3, gscale);
  }
  if (gcu_sumsq(&gpu, Dg, Dseg, ns, Dpart, Drep, Dshd) || gcu_adamw(&gpu, Dp, Dg, Dm, Dv, Dseg, ns, maxn, lr, 3, gscale))
    exit(2);
  CUDA_OK(cudaMemcpy(&drep, Drep, sizeof(double), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&dshd, Dshd, sizeof(float), cudaMemcpyDeviceToHost));
  char line[160];
  snprintf(line, sizeof(line), "replicated %.9g (gpt's way %.9g), sharded %.7g (%.7g)", drep, rep, dshd, shd);
  verdict("gradient squares by kind", ns == ks && fabs(drep - rep) <= 1e-9 * rep && fabs(dshd - shd) <= 1e-6 * shd, line);
  compare("gpt_adamw p", p, Dp, n, FWD_TOL);
  compare("gpt_adamw m", m, Dm, n, FWD_TOL);
  compare("gpt_adamw v", v, Dv, n, FWD_TOL);
}

/* The model at gpt_init's weights: logits, then the gradient of the mean loss, each segment compared. */
static void check_model(void) {
  gpt_cfg_t c;
  gpt_seg_t s[GPT_MAX_SEGS];
  if (gpt_cfg_init(&c, 2, NH_, C_, T_, 1, 0)) exit(2);
  size_t np = (size_t)gpt_numel(&c), N = (size_t)N_;
  float *P = rnd(np, 0, 0), *G = rnd(np, 0, 0), *logits;
  float *mem = (float *)calloc(gpt_model_floats(&c, B_), sizeof(float)), *Dlogits;
  gpt_init(&c, P, 7);
  uint8_t tok[N_], tgt[N_];
  int32_t order[N_], start[GPT_VOCAB + 1];
  for (int i = 0; i < N_; i++) tok[i] = (uint8_t)rng_below(&rng, 64), tgt[i] = (uint8_t)rng_below(&rng, 64);
  gcu_embed_buckets(tok, N_, order, start);
  float *DP = dev(P, np), *DG = dev(NULL, np), *Dmem = dev(NULL, gcu_model_floats(&c, B_));
  uint8_t *Dtok = (uint8_t *)to_dev(tok, N), *Dtgt = (uint8_t *)to_dev(tgt, N);
  int32_t *Dord = (int32_t *)to_dev(order, sizeof(order)), *Dst = (int32_t *)to_dev(start, sizeof(start));
  double *Drow = (double *)to_dev(NULL, N * sizeof(double));
  if (gpt_model_forward(NULL, &c, P, tok, B_, mem, &logits) ||
      gcu_model_forward(&gpu, NULL, &c, DP, Dtok, B_, Dmem, &Dlogits))
    exit(2);
  compare("model forward: logits", logits, Dlogits, N * GPT_VOCAB, FWD_TOL);
  gpt_xent_forward(logits, logits, tgt, N_, GPT_VOCAB, 1.0f / N_);
  if (gcu_xent_forward(&gpu, Dlogits, Dlogits, Dtgt, N_, GPT_VOCAB, 1.0f / N_, Drow) ||
      gpt_model_backward(NULL, &c, P, G, tok, B_, mem, logits) ||
      gcu_model_backward(&gpu, NULL, &c, DP, DG, Dord, Dst, B_, Dmem, Dlogits))
    exit(2);
  static const char *block[12] = {"ln1 gain", "ln1 bias", "wqkv", "bqkv", "wproj", "bproj",
                                  "ln2 gain", "ln2 bias", "wfc", "bfc", "wfc2", "bfc2"};
  static const char *ends[4] = {"wte", "wpe", "lnf gain", "lnf bias"};
  int ns = gpt_segments(&c, s);
  for (int k = 0; k < ns; k++) {
    char what[64];
    if (k < 2 || k >= ns - 2) snprintf(what, sizeof(what), "gradient of %s", ends[k < 2 ? k : k - ns + 4]);
    else snprintf(what, sizeof(what), "gradient of block %d %s", (k - 2) / 12, block[(k - 2) % 12]);
    compare(what, G + s[k].off, DG + s[k].off, (size_t)(s[k].rows * s[k].cols), BWD_TOL);
  }
  compare("model backward: whole gradient", G, DG, np, BWD_TOL);
}

/* ---- the kernels, called as a proc calls them -------------------------------------------- */

static mk_arg_t a_int(int64_t v) { mk_arg_t a; a.type = MK_ARG_INT, a.v.i = v; return a; }
static mk_arg_t a_num(double v) { mk_arg_t a; a.type = MK_ARG_NUMBER, a.v.num = v; return a; }
static mk_arg_t a_ten(mk_tensor_t *t) { mk_arg_t a; a.type = MK_ARG_TENSOR, a.v.tensor = t; return a; }
static mk_arg_t a_grp(const mk_group_t *g) { mk_arg_t a; a.type = MK_ARG_GROUP, a.v.group = g; return a; }
static mk_arg_t a_str(const char *s) {
  mk_arg_t a;
  a.type = MK_ARG_STRING, a.v.str.ptr = s, a.v.str.len = strlen(s);
  return a;
}

static mk_tensor_t tensor(void *data, mk_dtype_t dt, int64_t n, int device) {
  mk_tensor_t t;
  memset(&t, 0, sizeof(t));
  t.data = data, t.dtype = dt, t.ndim = 1, t.shape[0] = n, t.numel = n, t.nbytes = (size_t)n * mk_dtype_size(dt);
  t.device = device;
  return t;
}

/* English-like text: words of a fixed list in an order the generator picks, so a model has something to learn. */
static uint8_t *make_text(void) {
  static const char *words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat, ", "and ", "then ", "it ", "ran.\n"};
  uint8_t *t = (uint8_t *)malloc(CK_TEXT);
  for (size_t at = 0; at < CK_TEXT;) {
    const char *w = words[rng_below(&rng, 10)];
    for (size_t i = 0; w[i] && at < CK_TEXT; i++) t[at++] = (uint8_t)w[i];
  }
  return t;
}

enum { KL = 2, KH = 4, KC = 32, KT = 16, KB = 4 }; /* the model of the kernel comparison */
static const mk_group_t one = {1, 0, 1};         /* tp and dp groups of one member */

/* gpt_train(tpg, dpg, P, G, S, D, ntrain, L, H, C, T, B, seed, first, K, lr, warmup, total, wd, clip) */
static void train(mk_fn_t fn, const char *lib, mk_tensor_t *P, mk_tensor_t *G, mk_tensor_t *S, mk_tensor_t *D,
                  double *out) {
  mk_arg_t a[20] = {a_grp(&one), a_grp(&one), a_ten(P), a_ten(G), a_ten(S), a_ten(D), a_int(CK_TEXT * 9 / 10),
                    a_int(KL), a_int(KH), a_int(KC), a_int(KT), a_int(KB), a_int(5), a_int(0), a_int(CK_STEPS),
                    a_num(3e-3), a_int(5), a_int(CK_STEPS), a_num(0.1), a_num(1.0)};
  call(lib, fn, a, 20);
  memcpy(out, results, 2 * CK_STEPS * sizeof(double));
}

/* The same steps on both libraries from gpt_init's weights; the losses, norms and weights compared. */
static void check_train(mk_tensor_t *D, float **cpu_P) {
  gpt_cfg_t c;
  if (gpt_cfg_init(&c, KL, KH, KC, KT, 1, 0)) exit(2);
  int64_t np = gpt_numel(&c);
  float *P = rnd((size_t)np, 0, 0), *G = rnd((size_t)np + 1, 0, 0), *S = rnd(2 * (size_t)np, 0, 0);
  gpt_init(&c, P, 11);
  memset(S, 0, 2 * (size_t)np * sizeof(float));
  float *DP = dev(P, (size_t)np), *DP2 = dev(P, (size_t)np), *DG = dev(NULL, (size_t)np + 1);
  float *DS = dev(NULL, 2 * (size_t)np), *DS2 = dev(NULL, 2 * (size_t)np);
  mk_tensor_t tP = tensor(P, MK_F32, np, -1), tG = tensor(G, MK_F32, np + 1, -1), tS = tensor(S, MK_F32, 2 * np, -1);
  mk_tensor_t gP = tensor(DP, MK_F32, np, 0), gG = tensor(DG, MK_F32, np + 1, 0), gS = tensor(DS, MK_F32, 2 * np, 0);
  static double cpu[2 * CK_STEPS], gpu_r[2 * CK_STEPS], again[2 * CK_STEPS];
  train(gpt_k_train, "gpt_train (gpt)", &tP, &tG, &tS, D, cpu);
  train(gcu_k_train, "gpt_train (cuda_gpt)", &gP, &gG, &gS, D, gpu_r);
  double dl = 0, dn = 0;
  for (int i = 0; i < CK_STEPS; i++) {
    dl = fmax(dl, fabs(gpu_r[2 * i] - cpu[2 * i]) / cpu[2 * i]);
    dn = fmax(dn, fabs(gpu_r[2 * i + 1] - cpu[2 * i + 1]) / cpu[2 * i + 1]);
  }
  char line[200];
  snprintf(line, sizeof(line), "step 1 %.7f / gpt %.7f, step %d %.7f / %.7f; worst %.2g (tolerance 2e-3)", gpu_r[0],
           cpu[0], CK_STEPS, gpu_r[2 * CK_STEPS - 2], cpu[2 * CK_STEPS - 2], dl);
  verdict("gpt_train losses", dl <= 2e-3 && gpu_r[2 * CK_STEPS - 2] < gpu_r[0], line);
  snprintf(line, sizeof(line), "worst %.2g (tolerance 1e-2)", dn);
  verdict("gpt_train gradient norms", dn <= 1e-2, line);
  /* Loose: AdamW's first steps move every weight by about lr whatever the gradient's size, small ones included. */
  compare("gpt_train weights after the steps", P, DP, (size_t)np, 0.1);
  gP.data = DP2, gS.data = DS2;
  train(gcu_k_train, "gpt_train (cuda_gpt, again)", &gP, &gG, &gS, D, again);
  float *w1 = (float *)malloc((size_t)np * 4), *w2 = (float *)malloc((size_t)np * 4);
  CUDA_OK(cudaMemcpy(w1, DP, (size_t)np * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(w2, DP2, (size_t)np * 4, cudaMemcpyDeviceToHost));
  int same = memcmp(w1, w2, (size_t)np * 4) == 0 && memcmp(gpu_r, again, sizeof(again)) == 0;
  verdict("gpt_train twice: bitwise the same", same, same ? "weights and losses identical" : "they differ");
  *cpu_P = P;
}

/* gpt_eval and gpt_sample of both libraries on the same weights (gpt's, after its steps). */
static void check_eval_sample(mk_tensor_t *D, float *P) {
  gpt_cfg_t c;
  if (gpt_cfg_init(&c, KL, KH, KC, KT, 1, 0)) exit(2);
  int64_t np = gpt_numel(&c);
  mk_tensor_t tP = tensor(P, MK_F32, np, -1), gP = tensor(dev(P, (size_t)np), MK_F32, np, 0);
  mk_arg_t e[11] = {a_grp(&one), a_grp(&one), a_ten(&tP), a_ten(D), a_int(CK_TEXT * 9 / 10), a_int(KL), a_int(KH),
                    a_int(KC), a_int(KT), a_int(KB), a_int(16)};
  call("gpt_eval (gpt)", gpt_k_eval, e, 11);
  double cl = results[0], ct = results[1];
  e[2] = a_ten(&gP);
  call("gpt_eval (cuda_gpt)", gcu_k_eval, e, 11);
  char line[256], want[sizeof(text_result)];
  snprintf(line, sizeof(line), "loss %.9g / gpt %.9g over %.0f / %.0f tokens (tolerance 1e-5)", results[0], cl,
           results[1], ct);
  verdict("gpt_eval", fabs(results[0] - cl) <= 1e-5 * cl && results[1] == ct, line);
  mk_arg_t s[10] = {a_grp(&one), a_ten(&tP), a_int(KL), a_int(KH), a_int(KC), a_int(KT), a_str("the "), a_int(32),
                    a_int(3), a_num(0.0)};
  call("gpt_sample (gpt)", gpt_k_sample, s, 10);
  memcpy(want, text_result, sizeof(want));
  s[1] = a_ten(&gP);
  call("gpt_sample (cuda_gpt)", gcu_k_sample, s, 10);
  int same = 0;
  while (same < 32 && want[same] == text_result[same]) same++;
  snprintf(line, sizeof(line), "%d of 32 greedy bytes agree before any differs: \"%.32s\" / \"%.32s\"", same, text_result,
           want);
  verdict("gpt_sample (temperature 0)", same >= 8, line);
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    printf("gpt_cuda_check: no CUDA device here; nothing checked\n");
    return 2;
  }
  ctx_init();
  rng = rng_make(CK_SEED, 99, 0, 0);
  if (gcu_open(&gpu, &ctx, "gpt_cuda_check", 0)) {
    fprintf(stderr, "%s\n", err_msg);
    return 2;
  }
  check_norm(), check_linear(), check_attn(), check_gelu(), check_xent(), check_embed(), check_adamw();
  check_model();
  uint8_t *text = make_text();
  mk_tensor_t D = tensor(text, MK_U8, CK_TEXT, -1);
  float *P;
  check_train(&D, &P);
  check_eval_sample(&D, P);
  if (failures) printf("gpt_cuda_check: FAIL (%d of %d)\n", failures, checks);
  else printf("gpt_cuda_check: PASS (%d checks)\n", checks);
  return failures ? 1 : 0;
}
