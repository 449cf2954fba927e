/*
 * gpt_block.cu - one transformer block and the whole model on the device
 * (gpt_cuda.h), forward and backward, with the tensor-parallel all-reduces;
 * the CUDA twin of kernels/cpu/gpt_block.c, step for step:
 *   x2 = x + allreduce(attn(ln1(x) @ wqkv + bqkv) @ wproj) + bproj
 *   out = x2 + allreduce(gelu(ln2(x2) @ wfc + bfc) @ wfc2) + bfc2
 * and in the backward the input gradients of the column-parallel qkv and fc
 * products are all-reduced. Over a GPU group (mesh:group{dim = "tp",
 * gpu = true}) each all-reduce is NCCL on the call's stream.
 *
 * Model memory (gcu_model_floats floats of device memory), in order: L
 * blocks of activations (gpt_model.c's gpt_acts_view, pointer arithmetic
 * only), then xL, hf [N x C], muf, rsf [N], logits [N x V], then the
 * backward's dx, dh [N x C], dqkv [N x 3cl], dy [N x cl], df [N x fl],
 * datt [hl x T x T] (gpt_block.c's, but datt for all local heads at once).
 */
#include <string.h>

#include "gpt_cuda.h"

/* a->x holds the block's input; xout gets its output. 0 or an error's code. */
static int block_forward(gcu_t *g, const mk_group_t *tp, const gpt_cfg_t *c, const gpt_block_t *p, gpt_acts_t *a,
                         float *xout, int B) {
  int N = B * c->T, C = c->C, rc;
  if ((rc = gcu_norm_forward(g, a->h, a->mu1, a->rs1, a->x, p->ln1g, p->ln1b, N, C)) ||
      (rc = gcu_linear_forward(g, a->qkv, a->h, p->wqkv, p->bqkv, N, C, 3 * c->cl)) ||
      (rc = gcu_attn_forward(g, a->y, a->att, a->qkv, B, c->T, c->hl, c->hs)) ||
      (rc = gcu_linear_forward(g, a->x2, a->y, p->wproj, NULL, N, c->cl, C)) ||
      (rc = gcu_all_reduce(g, tp, a->x2, (int64_t)N * C, MK_F32)) ||
      (rc = gcu_add_residual(g, a->x2, a->x, p->bproj, N, C)))
    return rc;
  if ((rc = gcu_norm_forward(g, a->h2, a->mu2, a->rs2, a->x2, p->ln2g, p->ln2b, N, C)) ||
      (rc = gcu_linear_forward(g, a->f, a->h2, p->wfc, p->bfc, N, C, c->fl)) ||
      (rc = gcu_gelu_forward(g, a->g, a->th, a->f, (int64_t)N * c->fl)) ||
      (rc = gcu_linear_forward(g, xout, a->g, p->wfc2, NULL, N, c->fl, C)) ||
      (rc = gcu_all_reduce(g, tp, xout, (int64_t)N * C, MK_F32)))
    return rc;
  return gcu_add_residual(g, xout, a->x2, p->bfc2, N, C);
}

/* dx holds the gradient of the block's output and gets that of its input; d's gradients are added to. */
static int block_backward(gcu_t *g, const mk_group_t *tp, const gpt_cfg_t *c, const gpt_block_t *p, gpt_block_t *d,
                          const gpt_acts_t *a, float *dx, float *tmp, int B) {
  int N = B * c->T, C = c->C, rc;
  float *dh = tmp, *dqkv = dh + (size_t)N * C, *dy = dqkv + (size_t)N * 3 * c->cl;
  float *df = dy + (size_t)N * c->cl, *datt = df + (size_t)N * c->fl;
  if ((rc = gcu_linear_backward(g, df, d->wfc2, d->bfc2, dx, a->g, p->wfc2, N, c->fl, C, 0.0f)) ||
      (rc = gcu_gelu_backward(g, df, df, a->f, a->th, (int64_t)N * c->fl)) ||
      (rc = gcu_linear_backward(g, dh, d->wfc, d->bfc, df, a->h2, p->wfc, N, C, c->fl, 0.0f)) ||
      (rc = gcu_all_reduce(g, tp, dh, (int64_t)N * C, MK_F32)) ||
      (rc = gcu_norm_backward(g, dx, d->ln2g, d->ln2b, dh, a->x2, a->mu2, a->rs2, p->ln2g, N, C)))
    return rc;
  if ((rc = gcu_linear_backward(g, dy, d->wproj, d->bproj, dx, a->y, p->wproj, N, c->cl, C, 0.0f)) ||
      (rc = gcu_attn_backward(g, dqkv, datt, dy, a->att, a->qkv, B, c->T, c->hl, c->hs)) ||
      (rc = gcu_linear_backward(g, dh, d->wqkv, d->bqkv, dqkv, a->h, p->wqkv, N, C, 3 * c->cl, 0.0f)) ||
      (rc = gcu_all_reduce(g, tp, dh, (int64_t)N * C, MK_F32)))
    return rc;
  return gcu_norm_backward(g, dx, d->ln1g, d->ln1b, dh, a->x, a->mu1, a->rs1, p->ln1g, N, C);
}

/* Floats of the model memory above for B sequences: datt holds every local head's at once. */
size_t gcu_model_floats(const gpt_cfg_t *c, int B) {
  return gpt_model_floats_with(c, B, (size_t)c->hl * (size_t)c->T * (size_t)c->T);
}

/* Runs the model on tok [B x T] (device memory); *logits points at the [N x V] logits inside mem. */
int gcu_model_forward(gcu_t *g, const mk_group_t *tp, const gpt_cfg_t *c, const float *P, const uint8_t *tok, int B,
                      float *mem, float **logits) {
  gpt_params_t p;
  gpt_model_mem_t m;
  int N = B * c->T, rc;
  gpt_view(c, (float *)P, &p);
  gpt_model_view(c, B, mem, &m);
  if ((rc = gcu_embed_forward(g, m.a[0].x, tok, p.wte, p.wpe, B, c->T, c->C))) return rc;
  for (int l = 0; l < c->L; l++)
    if ((rc = block_forward(g, tp, c, &p.b[l], &m.a[l], l + 1 < c->L ? m.a[l + 1].x : m.xL, B))) return rc;
  if ((rc = gcu_norm_forward(g, m.hf, m.muf, m.rsf, m.xL, p.lnfg, p.lnfb, N, c->C))) return rc;
  *logits = m.logits;
  return gcu_gemm(g, 0, 1, N, c->V, c->C, 1.0f, m.hf, c->C, 0, p.wte, c->C, 0, 0.0f, m.logits, c->V, 0, 1);
}

/*
 * After gcu_model_forward on the same mem: adds the gradient of the loss
 * whose logit gradient is dlogits to G; order and start are the batch's
 * token buckets (gcu_embed_buckets) in device memory.
 */
int gcu_model_backward(gcu_t *g, const mk_group_t *tp, const gpt_cfg_t *c, const float *P, float *G,
                       const int32_t *order, const int32_t *start, int B, float *mem, const float *dlogits) {
  gpt_params_t p, d;
  gpt_model_mem_t m;
  int N = B * c->T, C = c->C, rc;
  gpt_view(c, (float *)P, &p);
  gpt_view(c, G, &d);
  gpt_model_view(c, B, mem, &m);
  if ((rc = gcu_gemm(g, 1, 0, c->V, C, N, 1.0f, dlogits, c->V, 0, m.hf, C, 0, 1.0f, d.wte, C, 0, 1)) ||
      (rc = gcu_gemm(g, 0, 0, N, C, c->V, 1.0f, dlogits, c->V, 0, p.wte, C, 0, 0.0f, m.tmp, C, 0, 1)))
    return rc;
  if ((rc = gcu_cuda(g, "cudaMemsetAsync", cudaMemsetAsync(m.dx, 0, (size_t)N * C * sizeof(float), g->s))) ||
      (rc = gcu_norm_backward(g, m.dx, d.lnfg, d.lnfb, m.tmp, m.xL, m.muf, m.rsf, p.lnfg, N, C)))
    return rc;
  for (int l = c->L - 1; l >= 0; l--)
    if ((rc = block_backward(g, tp, c, &p.b[l], &d.b[l], &m.a[l], m.dx, m.tmp, B))) return rc;
  return gcu_embed_backward(g, d.wte, d.wpe, m.dx, order, start, B, c->T, C);
}
