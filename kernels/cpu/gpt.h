/*
 * gpt.h - what the files of the "gpt" kernel library share (kernels/cpu/gpt_*.c):
 * the model's sizes, its flat parameter layout, the activations kept for the
 * backward pass, and each layer's forward and backward.
 *
 * The model is GPT-2's form: token and position embeddings, L pre-norm blocks
 * of causal multi-head attention and a GELU MLP, a final layer norm, logits
 * through the token embedding (tied). Tensor parallel (Megatron): each of the
 * tp ranks holds H/tp heads and 4C/tp hidden units; qkv and fc split by output
 * column, proj and fc2 by input row, one all-reduce over the tp group after
 * each row-parallel product (forward) and for the input gradient of each
 * column-parallel one (backward). Everything else is replicated and computed
 * the same on every tp rank.
 *
 * Matrices are row-major [in x out] so that y = x @ W is one sgemm; the token
 * embedding is [V x C]. Activations are [B*T x width] rows.
 */
#ifndef GPT_H
#define GPT_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "mlp_common.h"
#include "monarch_kernel.h"

#define GPT_VOCAB 256          /* byte-level: no tokenizer */
#define GPT_MAX_LAYERS 64      /* most blocks */
#define GPT_MAX_WIDTH 8192     /* largest C */
#define GPT_MAX_CONTEXT 4096   /* largest T */
#define GPT_MAX_BATCH 4096     /* most sequences per rank and step */
#define GPT_LN_EPS 1e-5f       /* layer norm's variance guard (torch's default) */
#define GPT_INIT_STD 0.02f     /* GPT-2's weight scale */
#define GPT_BETA1 0.9f         /* AdamW first-moment decay */
#define GPT_BETA2 0.95f        /* AdamW second-moment decay */
#define GPT_ADAM_EPS 1e-8f     /* AdamW denominator guard */

enum { TAG_GPT_INIT = 11, TAG_GPT_BATCH = 12, TAG_GPT_SAMPLE = 13 }; /* generator purposes (mlp_common.h) */

typedef struct {
  int L, H, C, T, V; /* blocks, heads, width, context, vocabulary */
  int tp, tr;        /* tensor-parallel size and this rank's position */
  int hs;            /* head size C/H */
  int hl, cl, fl;    /* local heads H/tp, local width C/tp, local MLP hidden 4C/tp */
} gpt_cfg_t;

/* One block's parameters (views into a flat tensor), in layout order. */
typedef struct {
  float *ln1g, *ln1b, *wqkv, *bqkv, *wproj, *bproj, *ln2g, *ln2b, *wfc, *bfc, *wfc2, *bfc2;
} gpt_block_t;

typedef struct {
  float *wte, *wpe;
  gpt_block_t b[GPT_MAX_LAYERS];
  float *lnfg, *lnfb;
} gpt_params_t;

/* What a block's forward keeps for its backward, [BT x width] each. */
typedef struct {
  float *x, *h, *mu1, *rs1, *qkv, *att, *y, *x2, *h2, *mu2, *rs2, *f, *th, *g;
} gpt_acts_t;

/* A segment of the flat layout: kind decides the initial value and whether AdamW decays it (matrices only). */
typedef enum { SEG_MATRIX, SEG_PROJ, SEG_BIAS, SEG_GAIN } gpt_seg_kind_t;

/* How a segment is split over tp: replicated, by column (qkv: within each of q, k, v), or by row. */
typedef enum { SPLIT_NONE, SPLIT_COL3, SPLIT_COL, SPLIT_ROW } gpt_split_t;

#define GPT_MAX_SEGS (4 + 12 * GPT_MAX_LAYERS) /* wte, wpe, 12 per block, lnf gain and bias */

typedef struct {
  int64_t off, rows, cols; /* this rank's shard: rows x cols floats at off */
  gpt_seg_kind_t kind;
  gpt_split_t split;
  int id; /* unique per segment: keys its initial values */
} gpt_seg_t;

/* The tp group a forward or backward all-reduces over; g NULL (or size 1): no collective. */
typedef struct {
  mk_ctx_t *ctx;
  const mk_group_t *g;
} gpt_comm_t;

/* gpt_model.c: sizes, layout, views, initial weights, activation memory. */
const char *gpt_cfg_init(gpt_cfg_t *c, int64_t L, int64_t H, int64_t C, int64_t T, int tp, int tr);
int64_t gpt_numel(const gpt_cfg_t *c);
void gpt_view(const gpt_cfg_t *c, float *flat, gpt_params_t *p);
void gpt_init(const gpt_cfg_t *c, float *flat, int64_t seed);
int gpt_segments(const gpt_cfg_t *c, gpt_seg_t *s);
size_t gpt_acts_floats(const gpt_cfg_t *c, int B);
float *gpt_acts_view(const gpt_cfg_t *c, int B, float *mem, gpt_acts_t *a);

/* The whole model's memory for B sequences (gpt_block.c's order; cuda_gpt's the same, on the device). */
typedef struct {
  gpt_acts_t a[GPT_MAX_LAYERS];
  float *xL, *hf, *muf, *rsf, *logits, *dx, *tmp;
} gpt_model_mem_t;
size_t gpt_model_floats_with(const gpt_cfg_t *c, int B, size_t datt); /* datt: the attention backward's scratch */
size_t gpt_model_floats(const gpt_cfg_t *c, int B);                    /* datt of [T x T] */
void gpt_model_view(const gpt_cfg_t *c, int B, float *mem, gpt_model_mem_t *m);

/* gpt_embed.c */
void gpt_embed_forward(float *x, const uint8_t *tok, const float *wte, const float *wpe, int B, int T, int C);
void gpt_embed_backward(float *dwte, float *dwpe, const float *dx, const uint8_t *tok, int B, int T, int C);

/* gpt_norm.c */
void gpt_norm_forward(float *y, float *mu, float *rs, const float *x, const float *g, const float *b, int N, int C);
void gpt_norm_backward(float *dx, float *dg, float *db, const float *dy, const float *x, const float *mu,
                       const float *rs, const float *g, int N, int C);

/* gpt_linear.c: y = x @ W + b, and its backward (accumulates dW, db; writes or adds dx). */
void gpt_linear_forward(float *y, const float *x, const float *W, const float *b, int N, int in, int out);
void gpt_linear_backward(float *dx, float *dW, float *db, const float *dy, const float *x, const float *W, int N,
                         int in, int out, float beta_dx);
int gpt_all_reduce(gpt_comm_t *cm, float *data, int64_t n);

/* gpt_attn.c: causal attention of nh heads of size hs; qkv rows [q | k | v], each nh*hs wide. */
void gpt_attn_forward(float *y, float *att, const float *qkv, int B, int T, int nh, int hs);
void gpt_attn_backward(float *dqkv, float *datt, const float *dy, const float *att, const float *qkv, int B, int T,
                       int nh, int hs);

/* gpt_mlp.c: GELU (tanh form) and the MLP half of a block. */
void gpt_gelu_forward(float *g, float *th, const float *f, int64_t n);
void gpt_gelu_backward(float *df, const float *dg, const float *f, const float *th, int64_t n);

/* gpt_block.c: one block, and the whole model. */
int gpt_block_forward(gpt_comm_t *cm, const gpt_cfg_t *c, const gpt_block_t *p, gpt_acts_t *a, float *xout, int B);
int gpt_block_backward(gpt_comm_t *cm, const gpt_cfg_t *c, const gpt_block_t *p, gpt_block_t *d, const gpt_acts_t *a,
                       float *dx, float *tmp, int B);
int gpt_model_forward(gpt_comm_t *cm, const gpt_cfg_t *c, const float *P, const uint8_t *tok, int B, float *mem,
                      float **logits);
int gpt_model_backward(gpt_comm_t *cm, const gpt_cfg_t *c, const float *P, float *G, const uint8_t *tok, int B,
                       float *mem, const float *dlogits);

/* gpt_loss.c: logits through the tied embedding, and softmax cross-entropy. */
double gpt_xent_forward(float *dlogits, const float *logits, const uint8_t *target, int N, int V, float dscale);

/* gpt_adamw.c */
double gpt_lr_at(int64_t step, double lr, int64_t warmup, int64_t total);
void gpt_adamw(float *p, const float *g, float *m, float *v, int64_t i0, int64_t i1, float lr, float wd, int64_t t,
               float gscale);

/* gpt_data.c */
void gpt_batch(uint8_t *x, uint8_t *y, const uint8_t *data, int64_t lo, int64_t hi, int B, int T, int64_t seed, int64_t step,
               int64_t first_seq);
double gpt_bigram_loss(const uint8_t *data, int64_t ntrain, int64_t n, double alpha);
uint8_t gpt_draw(const float *z, int V, double temp, double u);

/* gpt_train.c: the kernels gpt_train, gpt_eval, gpt_sample (table in gpt_kernels.c). */
int gpt_k_train(mk_ctx_t *ctx, int argc, const mk_arg_t *argv);
int gpt_k_eval(mk_ctx_t *ctx, int argc, const mk_arg_t *argv);
int gpt_k_sample(mk_ctx_t *ctx, int argc, const mk_arg_t *argv);

#endif
