/*
 * gpt_model.c - the model's sizes, its flat parameter layout, the initial
 * weights and the activation memory of the "gpt" library (gpt.h).
 *
 * Layout of one tp rank's flat tensor (P, and G, m, v alike):
 *   wte [V x C] | wpe [T x C] | L x block | lnf gain [C] | lnf bias [C]
 *   block = ln1 g,b [C] | wqkv [C x 3cl] | bqkv [3cl] | wproj [cl x C] | bproj [C]
 *           | ln2 g,b [C] | wfc [C x fl] | bfc [fl] | wfc2 [fl x C] | bfc2 [C]
 * Every initial value is a function of (seed, segment, global position), so
 * each tp rank draws its own shard and tp = 1 draws the whole of the same model.
 */
#include <math.h>
#include <string.h>

#include "gpt.h"

/* Checks sizes and fills c; NULL or a message naming what does not divide or fit. */
const char *gpt_cfg_init(gpt_cfg_t *c, int64_t L, int64_t H, int64_t C, int64_t T, int tp, int tr) {
  static char msg[160];
  if (L < 1 || L > GPT_MAX_LAYERS) return "layers must be in 1..64";
  if (C < 1 || C > GPT_MAX_WIDTH) return "width must be in 1..8192";
  if (T < 1 || T > GPT_MAX_CONTEXT) return "context must be in 1..4096";
  if (H < 1 || C % H) {
    snprintf(msg, sizeof(msg), "width %lld is not divisible by heads %lld", (long long)C, (long long)H);
    return msg;
  }
  if (tp < 1 || H % tp) {
    snprintf(msg, sizeof(msg), "heads %lld are not divisible by tp %d", (long long)H, tp);
    return msg;
  }
  c->L = (int)L, c->H = (int)H, c->C = (int)C, c->T = (int)T, c->V = GPT_VOCAB;
  c->tp = tp, c->tr = tr, c->hs = (int)(C / H);
  c->hl = (int)H / tp, c->cl = c->hl * c->hs, c->fl = 4 * (int)C / tp;
  return NULL;
}

static int64_t add(gpt_seg_t *s, int *n, int64_t off, int64_t rows, int64_t cols, gpt_seg_kind_t kind,
                   gpt_split_t split) {
  s[*n] = (gpt_seg_t){off, rows, cols, kind, split, *n};
  (*n)++;
  return off + rows * cols;
}

/* Fills s (GPT_MAX_SEGS) with the layout above; returns the number of segments. */
int gpt_segments(const gpt_cfg_t *c, gpt_seg_t *s) {
  int n = 0;
  int64_t o = 0, C = c->C;
  o = add(s, &n, o, c->V, C, SEG_MATRIX, SPLIT_NONE);
  o = add(s, &n, o, c->T, C, SEG_MATRIX, SPLIT_NONE);
  for (int l = 0; l < c->L; l++) {
    o = add(s, &n, o, 1, C, SEG_GAIN, SPLIT_NONE);
    o = add(s, &n, o, 1, C, SEG_BIAS, SPLIT_NONE);
    o = add(s, &n, o, C, 3 * c->cl, SEG_MATRIX, SPLIT_COL3);
    o = add(s, &n, o, 1, 3 * c->cl, SEG_BIAS, SPLIT_COL3);
    o = add(s, &n, o, c->cl, C, SEG_PROJ, SPLIT_ROW);
    o = add(s, &n, o, 1, C, SEG_BIAS, SPLIT_NONE);
    o = add(s, &n, o, 1, C, SEG_GAIN, SPLIT_NONE);
    o = add(s, &n, o, 1, C, SEG_BIAS, SPLIT_NONE);
    o = add(s, &n, o, C, c->fl, SEG_MATRIX, SPLIT_COL);
    o = add(s, &n, o, 1, c->fl, SEG_BIAS, SPLIT_COL);
    o = add(s, &n, o, c->fl, C, SEG_PROJ, SPLIT_ROW);
    o = add(s, &n, o, 1, C, SEG_BIAS, SPLIT_NONE);
  }
  o = add(s, &n, o, 1, C, SEG_GAIN, SPLIT_NONE);
  add(s, &n, o, 1, C, SEG_BIAS, SPLIT_NONE);
  return n;
}

int64_t gpt_numel(const gpt_cfg_t *c) {
  gpt_seg_t s[GPT_MAX_SEGS];
  int n = gpt_segments(c, s);
  return s[n - 1].off + s[n - 1].rows * s[n - 1].cols;
}

void gpt_view(const gpt_cfg_t *c, float *flat, gpt_params_t *p) {
  gpt_seg_t s[GPT_MAX_SEGS];
  int n = gpt_segments(c, s), k = 0;
  p->wte = flat + s[k++].off;
  p->wpe = flat + s[k++].off;
  for (int l = 0; l < c->L; l++) {
    float **f[] = {&p->b[l].ln1g, &p->b[l].ln1b, &p->b[l].wqkv, &p->b[l].bqkv, &p->b[l].wproj, &p->b[l].bproj,
                   &p->b[l].ln2g, &p->b[l].ln2b, &p->b[l].wfc, &p->b[l].bfc, &p->b[l].wfc2, &p->b[l].bfc2};
    for (int j = 0; j < 12; j++) *f[j] = flat + s[k++].off;
  }
  p->lnfg = flat + s[n - 2].off;
  p->lnfb = flat + s[n - 1].off;
}

/* The global (unsharded) element index of local (i, j) of segment s. */
static int64_t global_index(const gpt_cfg_t *c, const gpt_seg_t *s, int64_t i, int64_t j) {
  int64_t cols = s->cols;
  switch (s->split) {
  case SPLIT_COL3: cols = 3 * (int64_t)c->C, j = (j / c->cl) * c->C + (int64_t)c->tr * c->cl + j % c->cl; break;
  case SPLIT_COL: cols = s->cols * c->tp, j = (int64_t)c->tr * s->cols + j; break;
  case SPLIT_ROW: i = (int64_t)c->tr * s->rows + i; break;
  default: break;
  }
  return i * cols + j;
}

/* Uniform values of GPT-2's std (0.02; residual projections 0.02 / sqrt(2L)); biases 0, gains 1. */
void gpt_init(const gpt_cfg_t *c, float *flat, int64_t seed) {
  gpt_seg_t s[GPT_MAX_SEGS];
  int n = gpt_segments(c, s);
  for (int k = 0; k < n; k++) {
    float *p = flat + s[k].off;
    float a = GPT_INIT_STD * sqrtf(3.0f);
    if (s[k].kind == SEG_PROJ) a /= sqrtf(2.0f * (float)c->L);
    for (int64_t i = 0; i < s[k].rows; i++)
      for (int64_t j = 0; j < s[k].cols; j++) {
        float v = s[k].kind == SEG_GAIN ? 1.0f : 0.0f;
        if (s[k].kind == SEG_MATRIX || s[k].kind == SEG_PROJ) {
          rng_t r = rng_make(seed, TAG_GPT_INIT, s[k].id, global_index(c, &s[k], i, j));
          v = a * rng_sym(&r);
        }
        p[i * s[k].cols + j] = v;
      }
  }
}

/* Floats of activations per block for B sequences. */
static size_t block_floats(const gpt_cfg_t *c, int B) {
  size_t N = (size_t)B * (size_t)c->T, C = (size_t)c->C;
  return N * (4 * C + 4 + 3 * (size_t)c->cl + (size_t)c->cl + 3 * (size_t)c->fl) +
         (size_t)B * (size_t)c->hl * (size_t)c->T * (size_t)c->T;
}

size_t gpt_acts_floats(const gpt_cfg_t *c, int B) { return block_floats(c, B); }

/* Points a at one block's activations in mem; returns the float after them. */
float *gpt_acts_view(const gpt_cfg_t *c, int B, float *mem, gpt_acts_t *a) {
  size_t N = (size_t)B * (size_t)c->T, C = (size_t)c->C;
  float *p = mem;
  a->x = p, p += N * C;
  a->h = p, p += N * C;
  a->mu1 = p, p += N;
  a->rs1 = p, p += N;
  a->qkv = p, p += N * 3 * (size_t)c->cl;
  a->att = p, p += (size_t)B * (size_t)c->hl * (size_t)c->T * (size_t)c->T;
  a->y = p, p += N * (size_t)c->cl;
  a->x2 = p, p += N * C;
  a->h2 = p, p += N * C;
  a->mu2 = p, p += N;
  a->rs2 = p, p += N;
  a->f = p, p += N * (size_t)c->fl;
  a->th = p, p += N * (size_t)c->fl;
  a->g = p, p += N * (size_t)c->fl;
  return p;
}

size_t gpt_model_floats_with(const gpt_cfg_t *c, int B, size_t datt) {
  size_t N = (size_t)B * (size_t)c->T, C = (size_t)c->C;
  return (size_t)c->L * gpt_acts_floats(c, B) + N * (2 * C + 2 + (size_t)c->V) +
         N * (2 * C + 4 * (size_t)c->cl + (size_t)c->fl) + datt;
}

size_t gpt_model_floats(const gpt_cfg_t *c, int B) { return gpt_model_floats_with(c, B, (size_t)c->T * (size_t)c->T); }

void gpt_model_view(const gpt_cfg_t *c, int B, float *mem, gpt_model_mem_t *m) {
  size_t N = (size_t)B * (size_t)c->T, C = (size_t)c->C;
  for (int l = 0; l < c->L; l++) mem = gpt_acts_view(c, B, mem, &m->a[l]);
  m->xL = mem, m->hf = m->xL + N * C, m->muf = m->hf + N * C, m->rsf = m->muf + N;
  m->logits = m->rsf + N, m->dx = m->logits + N * (size_t)c->V, m->tmp = m->dx + N * C;
}
