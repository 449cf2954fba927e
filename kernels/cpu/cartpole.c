/*
 * cartpole.c - a batch of CartPole environments (the classic-control
 * equations of Barto, Sutton and Anderson, as in Gym's CartPole-v0) stepped
 * in one call.
 *
 * The batch lives in one f64 tensor of shape {N, 5}; row i is environment i:
 * x, x_dot, theta, theta_dot, and the number of steps taken in the current
 * episode. Observations are the first four columns. Every step earns reward
 * 1 (the terminating one included), so an episode's return is its length.
 *
 *   cartpole_reset(state, seed)                        every env to a fresh start
 *   cartpole_step(state, actions, done, seed, limit)   one step of every env
 *
 * cartpole_step pushes left (action 0) or right (action 1), integrates one
 * Euler step of tau seconds, and writes done[i]: 0 running, 1 the pole fell
 * or the cart left the track, 2 the episode reached `limit` steps (200 for
 * v0). An env that is done is reset at once, so the state then holds the
 * first observation of its next episode. Returns how many envs were done.
 */
#include "monarch_kernel.h"

#include <math.h>
#include <stdint.h>

#define CP_COLS 5                      /* x, x_dot, theta, theta_dot, steps */
#define CP_GRAVITY 9.8
#define CP_MASSCART 1.0
#define CP_MASSPOLE 0.1
#define CP_LENGTH 0.5                  /* half the pole's length */
#define CP_FORCE 10.0
#define CP_TAU 0.02                    /* seconds per step */
#define CP_X_LIMIT 2.4                 /* |x| beyond this ends the episode */
#define CP_THETA_LIMIT (12.0 * 2.0 * M_PI / 360.0) /* 12 degrees, in radians */
#define CP_INIT_RANGE 0.05             /* a reset draws every variable from [-0.05, 0.05] */
#define CP_DEFAULT_LIMIT 200           /* CartPole-v0's episode length */
#define CP_MAX_LIMIT 1000000           /* longest episode a caller may ask for */

/* splitmix64: a small, well-mixed generator; one stream per (seed, env). */
static uint64_t mix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *s, double lo, double hi) {
  return lo + (hi - lo) * ((double)(mix(s) >> 11) * (1.0 / 9007199254740992.0));
}

static void reset_one(double *row, uint64_t seed, int64_t i) {
  uint64_t s = seed * 0x2545f4914f6cdd1dull + (uint64_t)i;
  for (int k = 0; k < 4; k++) row[k] = uniform(&s, -CP_INIT_RANGE, CP_INIT_RANGE);
  row[4] = 0.0;
}

/* Checks that t is the {N, 5} f64 state tensor; returns N or -1 with an error set. */
static int64_t check_state(mk_ctx_t *ctx, const mk_tensor_t *t) {
  if (t->device >= 0) return mk_errorf(ctx, "%s: state must be a CPU tensor", ctx->kernel);
  if (t->dtype != MK_F64 || t->ndim != 2 || t->shape[1] != CP_COLS)
    return mk_errorf(ctx, "%s: state must be an f64 tensor of shape {N, %d}", ctx->kernel, CP_COLS);
  return t->shape[0];
}

static int k_reset(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const mk_tensor_t *st = argv[0].v.tensor;
  int64_t n = check_state(ctx, st);
  if (n < 0) return -1;
  double *s = st->data;
  for (int64_t i = 0; i < n; i++) reset_one(s + i * CP_COLS, (uint64_t)argv[1].v.i, i);
  return 0;
}

/* Reads action i as 0 or 1 from an i32, i64 or u8 tensor. */
static int action_at(const mk_tensor_t *a, int64_t i) {
  switch (a->dtype) {
  case MK_I32: return ((const int32_t *)a->data)[i] != 0;
  case MK_I64: return ((const int64_t *)a->data)[i] != 0;
  default: return ((const uint8_t *)a->data)[i] != 0;
  }
}

/* One Euler step of one env (position first, with the old velocity, as Gym does). */
static int step_one(double *r, int right) {
  const double total_mass = CP_MASSPOLE + CP_MASSCART, pml = CP_MASSPOLE * CP_LENGTH;
  double x = r[0], x_dot = r[1], theta = r[2], theta_dot = r[3];
  double force = right ? CP_FORCE : -CP_FORCE;
  double c = cos(theta), s = sin(theta);
  double temp = (force + pml * theta_dot * theta_dot * s) / total_mass;
  double theta_acc = (CP_GRAVITY * s - c * temp) / (CP_LENGTH * (4.0 / 3.0 - CP_MASSPOLE * c * c / total_mass));
  double x_acc = temp - pml * theta_acc * c / total_mass;
  r[0] = x + CP_TAU * x_dot;
  r[1] = x_dot + CP_TAU * x_acc;
  r[2] = theta + CP_TAU * theta_dot;
  r[3] = theta_dot + CP_TAU * theta_acc;
  r[4] += 1.0;
  return r[0] < -CP_X_LIMIT || r[0] > CP_X_LIMIT || r[2] < -CP_THETA_LIMIT || r[2] > CP_THETA_LIMIT;
}

static int k_step(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const mk_tensor_t *st = argv[0].v.tensor, *act = argv[1].v.tensor, *done = argv[2].v.tensor;
  int64_t n = check_state(ctx, st);
  if (n < 0) return -1;
  int64_t limit = argc > 4 ? argv[4].v.i : CP_DEFAULT_LIMIT;
  if (limit < 1 || limit > CP_MAX_LIMIT)
    return mk_errorf(ctx, "cartpole_step: limit must be in 1..%d, got %lld", CP_MAX_LIMIT, (long long)limit);
  if (act->device >= 0 || act->numel != n || (act->dtype != MK_I32 && act->dtype != MK_I64 && act->dtype != MK_U8))
    return mk_errorf(ctx, "cartpole_step: actions must be an i32, i64 or u8 CPU tensor of %lld elements", (long long)n);
  if (done->device >= 0 || done->numel != n || done->dtype != MK_U8)
    return mk_errorf(ctx, "cartpole_step: done must be a u8 CPU tensor of %lld elements", (long long)n);
  double *s = st->data;
  uint8_t *d = done->data;
  int64_t ndone = 0;
  for (int64_t i = 0; i < n; i++) {
    double *r = s + i * CP_COLS;
    int fell = step_one(r, action_at(act, i));
    d[i] = fell ? 1 : (r[4] >= (double)limit ? 2 : 0);
    if (d[i]) {
      ndone++;
      /* Mix the step count in, so that one seed per call still gives every episode its own start. */
      reset_one(r, (uint64_t)argv[3].v.i ^ ((uint64_t)ndone << 40), i);
    }
  }
  return mk_return_int(ctx, ndone);
}

static const mk_kernel_t kernels[] = {
  { "cartpole_reset", k_reset, "ti", "cartpole_reset(state, seed): every env of the f64 {N, 5} state to a fresh start." },
  { "cartpole_step", k_step, "ttti?i",
    "cartpole_step(state, actions, done, seed, limit=200): one step of every env; done[i] = 1 fell, 2 reached the "
    "limit (the env is then reset); returns the number done." },
};

MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {
    MK_ABI_VERSION, "cartpole", (int)(sizeof(kernels) / sizeof(kernels[0])), kernels,
  };
  return &lib;
}
