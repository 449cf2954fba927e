/*
 * gpt_block.c - one transformer block and the whole model (gpt.h), forward
 * and backward, with the tensor-parallel all-reduces:
 *   x2 = x + allreduce(attn(ln1(x) @ wqkv + bqkv) @ wproj) + bproj
 *   out = x2 + allreduce(gelu(ln2(x2) @ wfc + bfc) @ wfc2) + bfc2
 * and in the backward the input gradients of ln1's and ln2's outputs (the
 * column-parallel qkv and fc inputs) are all-reduced.
 *
 * Model memory (gpt_model_floats floats; gpt_model.c lays it out), in order: L blocks of activations
 * (gpt_acts_view), then xL, hf [N x C], muf, rsf [N], logits [N x V], then the
 * backward's dx, dh [N x C], dqkv [N x 3cl], dy [N x cl], df [N x fl], datt [T x T].
 */
#include <cblas.h>
#include <string.h>

#include "gpt.h"

/* dst += a + bias per row (bias [C]) */
static void add_residual(float *dst, const float *a, const float *bias, int N, int C) {
  for (int n = 0; n < N; n++)
    for (int i = 0; i < C; i++) dst[(size_t)n * C + i] += a[(size_t)n * C + i] + bias[i];
}

/* a->x holds the block's input; xout gets its output. 0 or a collective's code. */
int gpt_block_forward(gpt_comm_t *cm, const gpt_cfg_t *c, const gpt_block_t *p, gpt_acts_t *a, float *xout, int B) {
  int N = B * c->T, C = c->C, rc;
  gpt_norm_forward(a->h, a->mu1, a->rs1, a->x, p->ln1g, p->ln1b, N, C);
  gpt_linear_forward(a->qkv, a->h, p->wqkv, p->bqkv, N, C, 3 * c->cl);
  gpt_attn_forward(a->y, a->att, a->qkv, B, c->T, c->hl, c->hs);
  gpt_linear_forward(a->x2, a->y, p->wproj, NULL, N, c->cl, C);
  if ((rc = gpt_all_reduce(cm, a->x2, (int64_t)N * C))) return rc;
  add_residual(a->x2, a->x, p->bproj, N, C);
  gpt_norm_forward(a->h2, a->mu2, a->rs2, a->x2, p->ln2g, p->ln2b, N, C);
  gpt_linear_forward(a->f, a->h2, p->wfc, p->bfc, N, C, c->fl);
  gpt_gelu_forward(a->g, a->th, a->f, (int64_t)N * c->fl);
  gpt_linear_forward(xout, a->g, p->wfc2, NULL, N, c->fl, C);
  if ((rc = gpt_all_reduce(cm, xout, (int64_t)N * C))) return rc;
  add_residual(xout, a->x2, p->bfc2, N, C);
  return 0;
}

/*
 * dx holds the gradient of the block's output and gets that of its input;
 * d's gradients are added to. tmp: dh, dqkv, dy, df, datt as laid out above.
 */
int gpt_block_backward(gpt_comm_t *cm, const gpt_cfg_t *c, const gpt_block_t *p, gpt_block_t *d, const gpt_acts_t *a,
                       float *dx, float *tmp, int B) {
  int N = B * c->T, C = c->C, rc;
  float *dh = tmp, *dqkv = dh + (size_t)N * C, *dy = dqkv + (size_t)N * 3 * c->cl;
  float *df = dy + (size_t)N * c->cl, *datt = df + (size_t)N * c->fl;
  gpt_linear_backward(df, d->wfc2, d->bfc2, dx, a->g, p->wfc2, N, c->fl, C, 0.0f);
  gpt_gelu_backward(df, df, a->f, a->th, (int64_t)N * c->fl);
  gpt_linear_backward(dh, d->wfc, d->bfc, df, a->h2, p->wfc, N, C, c->fl, 0.0f);
  if ((rc = gpt_all_reduce(cm, dh, (int64_t)N * C))) return rc;
  gpt_norm_backward(dx, d->ln2g, d->ln2b, dh, a->x2, a->mu2, a->rs2, p->ln2g, N, C);
  gpt_linear_backward(dy, d->wproj, d->bproj, dx, a->y, p->wproj, N, c->cl, C, 0.0f);
  gpt_attn_backward(dqkv, datt, dy, a->att, a->qkv, B, c->T, c->hl, c->hs);
  gpt_linear_backward(dh, d->wqkv, d->bqkv, dqkv, a->h, p->wqkv, N, C, 3 * c->cl, 0.0f);
  if ((rc = gpt_all_reduce(cm, dh, (int64_t)N * C))) return rc;
  gpt_norm_backward(dx, d->ln1g, d->ln1b, dh, a->x, a->mu1, a->rs1, p->ln1g, N, C);
  return 0;
}

/* Runs the model on tok [B x T]; *logits points at the [N x V] logits inside mem. */
int gpt_model_forward(gpt_comm_t *cm, const gpt_cfg_t *c, const float *P, const uint8_t *tok, int B, float *mem,
                      float **logits) {
  gpt_params_t p;
  gpt_model_mem_t m;
  int N = B * c->T, rc;
  gpt_view(c, (float *)P, &p);
  gpt_model_view(c, B, mem, &m);
  gpt_embed_forward(m.a[0].x, tok, p.wte, p.wpe, B, c->T, c->C);
  for (int l = 0; l < c->L; l++)
    if ((rc = gpt_block_forward(cm, c, &p.b[l], &m.a[l], l + 1 < c->L ? m.a[l + 1].x : m.xL, B))) return rc;
  gpt_norm_forward(m.hf, m.muf, m.rsf, m.xL, p.lnfg, p.lnfb, N, c->C);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, c->V, c->C, 1.0f, m.hf, c->C, p.wte, c->C, 0.0f, m.logits,
              c->V);
  *logits = m.logits;
  return 0;
}

/* After gpt_model_forward on the same mem: adds the gradient of the loss whose logit gradient is dlogits to G. */
int gpt_model_backward(gpt_comm_t *cm, const gpt_cfg_t *c, const float *P, float *G, const uint8_t *tok, int B,
                       float *mem, const float *dlogits) {
  gpt_params_t p, d;
  gpt_model_mem_t m;
  int N = B * c->T, C = c->C, rc;
  gpt_view(c, (float *)P, &p);
  gpt_view(c, G, &d);
  gpt_model_view(c, B, mem, &m);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c->V, C, N, 1.0f, dlogits, c->V, m.hf, C, 1.0f, d.wte, C);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, c->V, 1.0f, dlogits, c->V, p.wte, C, 0.0f, m.tmp, C);
  memset(m.dx, 0, (size_t)N * C * sizeof(float));
  gpt_norm_backward(m.dx, d.lnfg, d.lnfb, m.tmp, m.xL, m.muf, m.rsf, p.lnfg, N, C);
  for (int l = c->L - 1; l >= 0; l--)
    if ((rc = gpt_block_backward(cm, c, &p.b[l], &d.b[l], &m.a[l], m.dx, m.tmp, B))) return rc;
  gpt_embed_backward(d.wte, d.wpe, m.dx, tok, B, c->T, C);
  return 0;
}
