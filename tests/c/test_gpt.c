/*
 * test_gpt.c - unit tests for the "gpt" kernel library's layers
 * (kernels/cpu/gpt_*.c, linked in directly): every backward against central
 * finite differences of its forward, the whole model's gradient likewise, the
 * tp = 2 shards (two threads with an in-process all-reduce) against tp = 1,
 * the sharded initial weights, the dp split of batches, and AdamW's arithmetic.
 *
 * A layer's check uses the loss sum(r * out) with r fixed and random, so its
 * backward gets dy = r. Differences are in float with step FD_H; the
 * tolerance allows for that.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"

#define FD_H 1e-2f     /* finite-difference step */
#define FD_ABS 2e-3    /* absolute tolerance of a gradient element */
#define FD_REL 2e-2    /* relative tolerance */
#define FD_SAMPLES 48  /* elements checked per tensor (all when fewer) */

static uint64_t seed_state = 42;

static float frand(void) { /* uniform [-1, 1) */
  seed_state = seed_state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((seed_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static float *rnd(size_t n, float scale) {
  float *p = malloc(n * sizeof(float));
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
  return p;
}

static double dot(const float *a, const float *b, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

typedef double (*loss_fn)(void *ud);

/* Compares grad with central differences of f at FD_SAMPLES elements of x (n floats). */
static void check_grad(const char *what, loss_fn f, void *ud, float *x, const float *grad, size_t n) {
  size_t step = n > FD_SAMPLES ? n / FD_SAMPLES : 1;
  for (size_t i = 0; i < n; i += step) {
    float s = x[i];
    x[i] = s + FD_H;
    double lp = f(ud);
    x[i] = s - FD_H;
    double lm = f(ud);
    x[i] = s;
    double num = (lp - lm) / (2.0 * FD_H);
    if (fabs(num - grad[i]) > FD_ABS + FD_REL * fabs(num))
      fail_msg("%s[%zu]: backward %.6g, finite differences %.6g", what, i, (double)grad[i], num);
  }
}

/* ---- layer norm ------------------------------------------------------------------------ */

enum { N_ = 6, C_ = 8 };

typedef struct {
  float *x, *g, *b, *r, y[N_ * C_], mu[N_], rs[N_];
} norm_t;

static double norm_loss(void *ud) {
  norm_t *t = ud;
  gpt_norm_forward(t->y, t->mu, t->rs, t->x, t->g, t->b, N_, C_);
  return dot(t->y, t->r, N_ * C_);
}

static void test_norm_backward(void **state) {
  norm_t t = {rnd(N_ * C_, 2.0f), rnd(C_, 1.0f), rnd(C_, 1.0f), rnd(N_ * C_, 1.0f), {0}, {0}, {0}};
  float dx[N_ * C_] = {0}, dg[C_] = {0}, db[C_] = {0};
  norm_loss(&t);
  gpt_norm_backward(dx, dg, db, t.r, t.x, t.mu, t.rs, t.g, N_, C_);
  check_grad("norm dx", norm_loss, &t, t.x, dx, N_ * C_);
  check_grad("norm dg", norm_loss, &t, t.g, dg, C_);
  check_grad("norm db", norm_loss, &t, t.b, db, C_);
  free(t.x), free(t.g), free(t.b), free(t.r);
}

/* ---- linear ------------------------------------------------------------------------------ */

enum { IN_ = 5, OUT_ = 7 };

typedef struct {
  float *x, *W, *b, *r, y[N_ * OUT_];
} lin_t;

static double lin_loss(void *ud) {
  lin_t *t = ud;
  gpt_linear_forward(t->y, t->x, t->W, t->b, N_, IN_, OUT_);
  return dot(t->y, t->r, N_ * OUT_);
}

static void test_linear_backward(void **state) {
  lin_t t = {rnd(N_ * IN_, 1.0f), rnd(IN_ * OUT_, 1.0f), rnd(OUT_, 1.0f), rnd(N_ * OUT_, 1.0f), {0}};
  float dx[N_ * IN_], dW[IN_ * OUT_] = {0}, db[OUT_] = {0};
  for (int i = 0; i < N_ * IN_; i++) dx[i] = 100.0f; /* beta_dx = 0 must overwrite */
  gpt_linear_backward(dx, dW, db, t.r, t.x, t.W, N_, IN_, OUT_, 0.0f);
  check_grad("linear dx", lin_loss, &t, t.x, dx, N_ * IN_);
  check_grad("linear dW", lin_loss, &t, t.W, dW, IN_ * OUT_);
  check_grad("linear db", lin_loss, &t, t.b, db, OUT_);
  free(t.x), free(t.W), free(t.b), free(t.r);
}

/* ---- attention ------------------------------------------------------------------------- */

enum { AB = 2, AT = 5, ANH = 2, AHS = 3, AW = ANH * AHS };

typedef struct {
  float *qkv, *r, y[AB * AT * AW], att[AB * ANH * AT * AT];
} attn_t;

static double attn_loss(void *ud) {
  attn_t *t = ud;
  gpt_attn_forward(t->y, t->att, t->qkv, AB, AT, ANH, AHS);
  return dot(t->y, t->r, AB * AT * AW);
}

static void test_attn_backward(void **state) {
  attn_t t = {rnd(AB * AT * 3 * AW, 1.5f), rnd(AB * AT * AW, 1.0f), {0}, {0}};
  float dqkv[AB * AT * 3 * AW], datt[AT * AT];
  attn_loss(&t);
  for (int i = 0; i < AT; i++) /* causal: nothing above the diagonal */
    for (int j = i + 1; j < AT; j++) assert_true(t.att[i * AT + j] == 0.0f);
  gpt_attn_backward(dqkv, datt, t.r, t.att, t.qkv, AB, AT, ANH, AHS);
  check_grad("attn dqkv", attn_loss, &t, t.qkv, dqkv, AB * AT * 3 * AW);
  free(t.qkv), free(t.r);
}

/* ---- GELU, embeddings, cross-entropy --------------------------------------------------------------- */

typedef struct {
  float *f, *r, g[64], th[64];
} gelu_t;

static double gelu_loss(void *ud) {
  gelu_t *t = ud;
  gpt_gelu_forward(t->g, t->th, t->f, 64);
  return dot(t->g, t->r, 64);
}

static void test_gelu_backward(void **state) {
  gelu_t t = {rnd(64, 4.0f), rnd(64, 1.0f), {0}, {0}};
  float df[64];
  gelu_loss(&t);
  for (int i = 0; i < 64; i++) /* the tanh of exp agrees with tanhf */
    assert_true(fabsf(t.th[i] - tanhf(0.7978845608f * (t.f[i] + 0.044715f * t.f[i] * t.f[i] * t.f[i]))) < 1e-6f);
  gpt_gelu_backward(df, t.r, t.f, t.th, 64);
  check_grad("gelu df", gelu_loss, &t, t.f, df, 64);
  free(t.f), free(t.r);
}

enum { EB = 2, ET = 3, EC = 4 };

typedef struct {
  float *wte, *wpe, *r, x[EB * ET * EC];
  uint8_t tok[EB * ET];
} emb_t;

static double emb_loss(void *ud) {
  emb_t *t = ud;
  gpt_embed_forward(t->x, t->tok, t->wte, t->wpe, EB, ET, EC);
  return dot(t->x, t->r, EB * ET * EC);
}

static void test_embed_backward(void **state) {
  emb_t t = {rnd(GPT_VOCAB * EC, 1.0f), rnd(ET * EC, 1.0f), rnd(EB * ET * EC, 1.0f), {0}, {7, 3, 7, 255, 0, 3}};
  float *dwte = calloc(GPT_VOCAB * EC, sizeof(float)), dwpe[ET * EC] = {0};
  gpt_embed_backward(dwte, dwpe, t.r, t.tok, EB, ET, EC);
  check_grad("embed dwpe", emb_loss, &t, t.wpe, dwpe, ET * EC);
  check_grad("embed dwte (row 7)", emb_loss, &t, t.wte + 7 * EC, dwte + 7 * EC, EC);
  check_grad("embed dwte (row 255)", emb_loss, &t, t.wte + 255 * EC, dwte + 255 * EC, EC);
  free(t.wte), free(t.wpe), free(t.r), free(dwte);
}

typedef struct {
  float *z;
  uint8_t y[4];
} xent_t;

static double xent_loss(void *ud) {
  xent_t *t = ud;
  return gpt_xent_forward(NULL, t->z, t->y, 4, GPT_VOCAB, 0.0f) / 4.0;
}

static void test_xent_backward(void **state) {
  xent_t t = {rnd(4 * GPT_VOCAB, 3.0f), {1, 200, 1, 77}};
  float *d = malloc(4 * GPT_VOCAB * sizeof(float));
  double l = gpt_xent_forward(d, t.z, t.y, 4, GPT_VOCAB, 0.25f) / 4.0;
  assert_true(fabs(l - xent_loss(&t)) < 1e-9);
  check_grad("xent dlogits", xent_loss, &t, t.z, d, 4 * GPT_VOCAB);
  free(t.z), free(d);
}

#include "test_gpt_model.h"

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_norm_backward),  cmocka_unit_test(test_linear_backward),
    cmocka_unit_test(test_attn_backward),  cmocka_unit_test(test_gelu_backward),
    cmocka_unit_test(test_embed_backward), cmocka_unit_test(test_xent_backward),
    cmocka_unit_test(test_model_backward), cmocka_unit_test(test_init_shards),
    cmocka_unit_test(test_tp2_matches_tp1), cmocka_unit_test(test_batch_dp_split),
    cmocka_unit_test(test_adamw_step),     cmocka_unit_test(test_cfg_refuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
