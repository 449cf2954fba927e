/*
 * test_gpt_model.h - test_gpt.c's whole-model tests: the model's gradient
 * against finite differences, tp shards against tp = 1, batches, AdamW, sizes.
 * Included once by test_gpt.c (its helpers: rnd, check_grad).
 */

enum { MB = 2, ML = 2, MH = 2, MC = 8, MT = 5 };

typedef struct {
  gpt_cfg_t c;
  float *P, *mem;
  double scale; /* the loss is scale x the mean (the FD check sums it, for gradients well above float noise) */
  uint8_t x[MB * MT], y[MB * MT];
} model_t;

static double model_loss(void *ud) {
  model_t *m = ud;
  float *logits;
  assert_int_equal(gpt_model_forward(NULL, &m->c, m->P, m->x, MB, m->mem, &logits), 0);
  return gpt_xent_forward(NULL, logits, m->y, MB * MT, GPT_VOCAB, 0.0f) * m->scale / (MB * MT);
}

static void model_make(model_t *m, int tp, int tr) {
  assert_null(gpt_cfg_init(&m->c, ML, MH, MC, MT, tp, tr));
  m->scale = 1.0;
  m->P = malloc((size_t)gpt_numel(&m->c) * sizeof(float));
  m->mem = malloc(gpt_model_floats(&m->c, MB) * sizeof(float));
  assert_non_null(m->P), assert_non_null(m->mem);
  for (int i = 0; i < MB * MT; i++) m->x[i] = (uint8_t)(i * 37 % 256), m->y[i] = (uint8_t)(i * 91 % 256);
}

/* G (numel floats, zeroed here) = the gradient of the mean loss; returns the loss. */
static double model_grad(gpt_comm_t *cm, model_t *m, float *G) {
  float *logits;
  int N = MB * MT;
  memset(G, 0, (size_t)gpt_numel(&m->c) * sizeof(float));
  assert_int_equal(gpt_model_forward(cm, &m->c, m->P, m->x, MB, m->mem, &logits), 0);
  double l = gpt_xent_forward(logits, logits, m->y, N, GPT_VOCAB, (float)m->scale / N) / N;
  assert_int_equal(gpt_model_backward(cm, &m->c, m->P, G, m->x, MB, m->mem, logits), 0);
  return l;
}

/* Every segment of the model (weights scaled up so that gradients are well above float noise). */
static void test_model_backward(void **state) {
  model_t m;
  model_make(&m, 1, 0);
  int64_t n = gpt_numel(&m.c);
  for (int64_t i = 0; i < n; i++) m.P[i] = frand() * 0.4f;
  m.scale = MB * MT;
  float *G = malloc((size_t)n * sizeof(float));
  model_grad(NULL, &m, G);
  gpt_seg_t s[GPT_MAX_SEGS];
  int ns = gpt_segments(&m.c, s);
  assert_int_equal(ns, 4 + 12 * ML);
  for (int k = 0; k < ns; k++) {
    char what[32];
    snprintf(what, sizeof(what), "model segment %d", k);
    size_t len = (size_t)(s[k].rows * s[k].cols), start = k == 0 ? (size_t)m.x[0] * MC : 0;
    check_grad(what, model_loss, &m, m.P + s[k].off + start, G + s[k].off + start, len - start < 64 ? len - start : 64);
  }
  free(m.P), free(m.mem), free(G);
}

/* The full index of shard element (i, j) of segment s (the mapping gpt_init keys its values by). */
static int64_t full_index(const gpt_cfg_t *full, const gpt_seg_t *fs, const gpt_cfg_t *c, const gpt_seg_t *s,
                          int64_t i, int64_t j) {
  if (s->split == SPLIT_COL3) j = (j / c->cl) * full->C + (int64_t)c->tr * c->cl + j % c->cl;
  if (s->split == SPLIT_COL) j += (int64_t)c->tr * s->cols;
  if (s->split == SPLIT_ROW) i += (int64_t)c->tr * s->rows;
  return fs->off + i * fs->cols + j;
}

/* Calls fn(shard value, full value) over every element of tp rank r's shard. */
static void each_shard(const gpt_cfg_t *full, const float *F, const gpt_cfg_t *c, const float *S,
                       void (*fn)(float, float, int)) {
  gpt_seg_t fs[GPT_MAX_SEGS], s[GPT_MAX_SEGS];
  int n = gpt_segments(c, s);
  assert_int_equal(gpt_segments(full, fs), n);
  for (int k = 0; k < n; k++)
    for (int64_t i = 0; i < s[k].rows; i++)
      for (int64_t j = 0; j < s[k].cols; j++) fn(S[s[k].off + i * s[k].cols + j], F[full_index(full, &fs[k], c, &s[k], i, j)], k);
}

static void same(float a, float b, int k) {
  if (a != b) fail_msg("segment %d: shard %.9g, full %.9g", k, (double)a, (double)b);
}

static void test_init_shards(void **state) {
  model_t f, h[2];
  model_make(&f, 1, 0);
  gpt_init(&f.c, f.P, 7);
  for (int r = 0; r < 2; r++) {
    model_make(&h[r], 2, r);
    assert_int_equal(h[r].c.hl, 1), assert_int_equal(h[r].c.fl, 2 * MC);
    gpt_init(&h[r].c, h[r].P, 7);
    each_shard(&f.c, f.P, &h[r].c, h[r].P, same);
    free(h[r].P), free(h[r].mem);
  }
  free(f.P), free(f.mem);
}

/* ---- tp = 2 in two threads, with an in-process all-reduce ------------------------------------------ */

static struct {
  pthread_barrier_t bar;
  float *buf[2];
} tp2;

/* Both members sum rank 0's values then rank 1's, so each gets the same bits. */
static int fake_all_reduce(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int op) {
  tp2.buf[g->rank] = t->data;
  pthread_barrier_wait(&tp2.bar);
  float *sum = malloc((size_t)t->numel * sizeof(float));
  for (int64_t i = 0; i < t->numel; i++) sum[i] = tp2.buf[0][i] + tp2.buf[1][i];
  pthread_barrier_wait(&tp2.bar);
  memcpy(t->data, sum, (size_t)t->numel * sizeof(float));
  free(sum);
  pthread_barrier_wait(&tp2.bar);
  return 0;
}

typedef struct {
  model_t m;
  float *G;
  double loss;
  int rank;
} tp_rank_t;

static void *tp_thread(void *ud) {
  tp_rank_t *t = ud;
  static mk_api_t api;
  api.all_reduce = fake_all_reduce;
  mk_ctx_t ctx = {.api = &api};
  mk_group_t g = {1, t->rank, 2};
  gpt_comm_t cm = {&ctx, &g};
  t->loss = model_grad(&cm, &t->m, t->G);
  return NULL;
}

static void close_enough(float a, float b, int k) {
  if (fabsf(a - b) > 1e-6f + 1e-3f * fabsf(b)) fail_msg("segment %d: tp=2 gradient %.9g, tp=1 %.9g", k, (double)a, (double)b);
}

static void test_tp2_matches_tp1(void **state) {
  model_t f;
  model_make(&f, 1, 0);
  gpt_init(&f.c, f.P, 3);
  float *G = malloc((size_t)gpt_numel(&f.c) * sizeof(float));
  double loss = model_grad(NULL, &f, G);
  tp_rank_t r[2];
  pthread_t th[2];
  pthread_barrier_init(&tp2.bar, NULL, 2);
  for (int i = 0; i < 2; i++) {
    r[i].rank = i;
    model_make(&r[i].m, 2, i);
    gpt_init(&r[i].m.c, r[i].m.P, 3);
    r[i].G = malloc((size_t)gpt_numel(&r[i].m.c) * sizeof(float));
    assert_int_equal(pthread_create(&th[i], NULL, tp_thread, &r[i]), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&tp2.bar);
  for (int i = 0; i < 2; i++) {
    assert_true(fabs(r[i].loss - loss) <= 1e-6 * loss);
    each_shard(&f.c, G, &r[i].m.c, r[i].G, close_enough);
    free(r[i].m.P), free(r[i].m.mem), free(r[i].G);
  }
  free(f.P), free(f.mem), free(G);
}

/* ---- batches, AdamW, sizes ----------------------------------------------------------------------- */

static void test_batch_dp_split(void **state) {
  uint8_t data[1000], x4[4 * 16], y4[4 * 16], x2[2 * 16], y2[2 * 16];
  for (int i = 0; i < 1000; i++) data[i] = (uint8_t)(i * 7 + i / 13);
  gpt_batch(x4, y4, data, 0, 900, 4, 16, 5, 11, 0);
  gpt_batch(x2, y2, data, 0, 900, 2, 16, 5, 11, 2); /* dp rank 1 of 2 */
  assert_memory_equal(x2, x4 + 2 * 16, sizeof(x2));
  assert_memory_equal(y2, y4 + 2 * 16, sizeof(y2));
  for (int i = 0; i + 1 < 16; i++) assert_int_equal(y4[i], x4[i + 1]);
  gpt_batch(x2, y2, data, 0, 900, 2, 16, 5, 12, 0); /* another step, other windows */
  assert_memory_not_equal(x2, x4, sizeof(x2));
}

static void test_adamw_step(void **state) {
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  gpt_adamw(&p, &g, &m, &v, 0, 1, 0.1f, 0.1f, 1, 2.0f); /* gradient 1: p = 0.99 - 0.1 */
  assert_true(fabsf(p - 0.89f) < 1e-6f);
  assert_true(fabsf(m - 0.1f) < 1e-7f && fabsf(v - 0.05f) < 1e-7f);
  assert_true(fabs(gpt_lr_at(0, 1.0, 10, 100) - 0.1) < 1e-12);
  assert_true(fabs(gpt_lr_at(10, 1.0, 10, 100) - 1.0) < 1e-12);
  assert_true(fabs(gpt_lr_at(55, 1.0, 10, 100) - 0.55) < 1e-12);
  assert_true(fabs(gpt_lr_at(500, 1.0, 10, 100) - 0.1) < 1e-12);
}

static void test_cfg_refuses(void **state) {
  gpt_cfg_t c;
  assert_string_equal(gpt_cfg_init(&c, 2, 3, 12, 8, 2, 0), "heads 3 are not divisible by tp 2");
  assert_string_equal(gpt_cfg_init(&c, 2, 4, 10, 8, 1, 0), "width 10 is not divisible by heads 4");
  assert_non_null(gpt_cfg_init(&c, 0, 4, 8, 8, 1, 0));
  assert_null(gpt_cfg_init(&c, 2, 4, 8, 8, 4, 3));
}
