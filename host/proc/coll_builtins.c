/* coll_builtins.c - the proc's "__coll_" built-ins over the collective instance of host/coll. */
#include "coll_builtins.h"

#include "collective.h"
#include "exec.h"
#include "registry.h"

#include <stdio.h>
#include <string.h>

#define MN_COLL_MAX_LOCAL 64 /* most "local" sends waiting for their recv on one proc */

/* "local" sends waiting for their recv on this proc: tag -> tensor id. */
static struct {
  int used;
  uint64_t tag, id;
} local_sends[MN_COLL_MAX_LOCAL];

static int arg_u64(const msgpack_object *args, uint32_t i, const char *name, const char *what, uint64_t *v,
                   char *err, size_t errlen) {
  if (mn_get_u64(args, i, v) == 0) return 0;
  snprintf(err, errlen, "%s: argument %u (%s) must be a non-negative integer", what, i + 1, name);
  return MN_EINVAL;
}

static int arg_op(const msgpack_object *args, uint32_t i, const char *what, int *op, char *err, size_t errlen) {
  const char *s;
  size_t n;
  if (mn_get_str(args, i, &s, &n) != 0 || (*op = mn_coll_op_parse(s, n)) < 0) {
    if (i < args->via.array.size && args->via.array.ptr[i].type == MSGPACK_OBJECT_STR)
      snprintf(err, errlen, "%s: unknown op '%.*s' (sum, max, min, avg)", what, (int)(n > 32 ? 32 : n), s);
    else
      snprintf(err, errlen, "%s: argument %u (op) must be one of \"sum\", \"max\", \"min\", \"avg\"", what, i + 1);
    return MN_EINVAL;
  }
  return 0;
}

/* The process's collective instance, watching this executor's cancel flag while it waits. */
static mn_coll_t *inst(mn_exec_t *x) {
  mn_coll_t *c = mn_coll_instance();
  mn_coll_set_cancel(c, x->cancel);
  return c;
}

static int arg_count(const msgpack_object *args, uint32_t lo, uint32_t hi, const char *what, const char *sig,
                     char *err, size_t errlen) {
  uint32_t n = args->via.array.size;
  if (n >= lo && n <= hi) return 0;
  snprintf(err, errlen, "%s takes %s, got %u argument%s", what, sig, n, n == 1 ? "" : "s");
  return MN_EINVAL;
}

static int builtin_recv_local(mn_exec_t *x, mk_tensor_t *t, uint64_t tag, int *found, char *err, size_t errlen) {
  *found = 0;
  for (int i = 0; i < MN_COLL_MAX_LOCAL; i++) {
    if (!local_sends[i].used || local_sends[i].tag != tag) continue;
    *found = 1;
    local_sends[i].used = 0;
    mk_tensor_t *s = mn_tensor_get(&x->reg, local_sends[i].id);
    if (s == NULL) {
      snprintf(err, errlen, "copy: the source tensor %llu was freed before the copy ran",
               (unsigned long long)local_sends[i].id);
      return MN_ENOTFOUND;
    }
    if (s->nbytes != t->nbytes || s->dtype != t->dtype) {
      snprintf(err, errlen, "copy: the source is %s of %zu bytes but the destination on rank %d is %s of %zu bytes",
               mn_dtype_name(s->dtype), s->nbytes, x->rank, mn_dtype_name(t->dtype), t->nbytes);
      return MN_EINVAL;
    }
    if (s != t) memcpy(t->data, s->data, t->nbytes);
    return 0;
  }
  return 0;
}

/* Checks the argument count and reads the group id that starts every group built-in; 0 or MN_EINVAL with err. */
static int group_args(const mn_builtin_t *b, const msgpack_object *args, uint32_t n, uint64_t *gid, char *err,
                      size_t errlen) {
  if (arg_count(args, n, n, b->name, b->usage, err, errlen) != 0) return MN_EINVAL;
  return arg_u64(args, 0, "group id", b->name, gid, err, errlen);
}

/* The result of a collective that ran: members calling different collectives is a failure of its
 * own kind. Callers read mismatch after the call that sets it, not in the same argument list. */
static int ran(mn_exec_t *x, int rc, int mismatch) {
  if (rc != 0 && mismatch) x->err_kind = "collective_mismatch";
  return rc;
}

/* ---- the built-ins ------------------------------------------------------------- */

/* __coll_port() -> this proc's data port */
static int b_port(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                  size_t errlen) {
  return mn_exec_returned(x, mk_return_int(ctx, mn_coll_port(inst(x))));
}

/* __coll_group(gid, my_index, {"host:port", ...} [, {rank, ...}]) */
static int b_group(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                   size_t errlen) {
  const char *what = b->name;
  uint64_t gid, me;
  if (arg_count(args, 3, 4, what, b->usage, err, errlen) != 0 ||
      arg_u64(args, 0, "group id", what, &gid, err, errlen) != 0 ||
      arg_u64(args, 1, "my index", what, &me, err, errlen) != 0)
    return MN_EINVAL;
  const msgpack_object *a = &args->via.array.ptr[2];
  const msgpack_object *r = args->via.array.size > 3 ? &args->via.array.ptr[3] : NULL;
  if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size < 1 || a->via.array.size > MN_COLL_MAX_MEMBERS) {
    snprintf(err, errlen, "%s: argument 3 must be a list of 1..%d \"host:port\" addresses", what,
             MN_COLL_MAX_MEMBERS);
    return MN_EINVAL;
  }
  int n = (int)a->via.array.size;
  if (r != NULL && r->type != MSGPACK_OBJECT_NIL && (r->type != MSGPACK_OBJECT_ARRAY || (int)r->via.array.size != n)) {
    snprintf(err, errlen, "%s: argument 4 must be a list of %d ranks", what, n);
    return MN_EINVAL;
  }
  if (me >= (uint64_t)n) {
    snprintf(err, errlen, "%s: my index %llu is outside 0..%d", what, (unsigned long long)me, n - 1);
    return MN_EINVAL;
  }
  char **addrs = calloc((size_t)n, sizeof(char *));
  int *ranks = malloc(sizeof(int) * (size_t)n), rc = MN_ENOMEM;
  if (addrs == NULL || ranks == NULL) {
    snprintf(err, errlen, "%s: out of memory", what);
    goto done;
  }
  for (int i = 0; i < n; i++) {
    const char *s;
    size_t sl;
    int64_t rk = -1;
    if (mn_get_str(a, (uint32_t)i, &s, &sl) != 0 || sl == 0 || sl > MN_COLL_MAX_ADDR) {
      snprintf(err, errlen, "%s: address %d must be a \"host:port\" string of at most %d bytes", what, i + 1,
               MN_COLL_MAX_ADDR);
      rc = MN_EINVAL;
      goto done;
    }
    if ((addrs[i] = strndup(s, sl)) == NULL) {
      snprintf(err, errlen, "%s: out of memory", what);
      goto done;
    }
    if (r != NULL && r->type == MSGPACK_OBJECT_ARRAY && (mn_get_i64(r, (uint32_t)i, &rk) != 0 || rk < -1 || rk > INT32_MAX)) {
      snprintf(err, errlen, "%s: rank %d must be an integer", what, i + 1);
      rc = MN_EINVAL;
      goto done;
    }
    ranks[i] = (int)rk;
  }
  rc = mn_coll_group(inst(x), gid, (int)me, n, (const char *const *)addrs, ranks, err, errlen);
done:
  for (int i = 0; addrs != NULL && i < n; i++) free(addrs[i]);
  free(addrs);
  free(ranks);
  return rc;
}

/* __coll_free(group_id) */
static int b_free(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                  size_t errlen) {
  uint64_t gid;
  if (group_args(b, args, 1, &gid, err, errlen) != 0) return MN_EINVAL;
  return mn_coll_group_free(inst(x), gid);
}

/* __coll_layout(group_id) -> "flat", "one host" or "hosts" */
static int b_layout(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                    size_t errlen) {
  static const char *const names[] = {"flat", "one host", "hosts"};
  uint64_t gid;
  if (group_args(b, args, 1, &gid, err, errlen) != 0) return MN_EINVAL;
  mn_coll_t *c = inst(x);
  int l = mn_coll_group_layout(c, gid);
  if (l < 0) {
    snprintf(err, errlen, "__coll_layout: rank %d has no group %llu", mn_coll_rank(c), (unsigned long long)gid);
    return l;
  }
  return mn_exec_returned(x, mk_return_string(ctx, names[l], strlen(names[l])));
}

/* The other members are (or will be) in this collective: tell them why this one is not. MN_EINVAL. */
static int abort_on_bad_args(mn_coll_t *c, uint64_t gid, const char *err) {
  mn_coll_group_abort(c, gid, err);
  return MN_EINVAL;
}

/* __coll_all_reduce(group_id, tensor, op) */
static int b_all_reduce(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                        size_t errlen) {
  uint64_t gid;
  int op, mismatch = 0;
  mk_tensor_t *t;
  if (group_args(b, args, 3, &gid, err, errlen) != 0) return MN_EINVAL;
  mn_coll_t *c = inst(x);
  if ((t = mn_exec_tensor_arg(x, args, 1, err, errlen)) == NULL || arg_op(args, 2, b->name, &op, err, errlen) != 0)
    return abort_on_bad_args(c, gid, err);
  x->err_kind = "collective";
  int rc = mn_coll_all_reduce(c, gid, t, op, err, errlen, &mismatch);
  return ran(x, rc, mismatch);
}

/* __coll_reduce_scatter(group_id, src, dst, op) */
static int b_reduce_scatter(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                            char *err, size_t errlen) {
  uint64_t gid;
  int op, mismatch = 0;
  mk_tensor_t *t, *t2;
  if (group_args(b, args, 4, &gid, err, errlen) != 0) return MN_EINVAL;
  mn_coll_t *c = inst(x);
  if ((t = mn_exec_tensor_arg(x, args, 1, err, errlen)) == NULL ||
      (t2 = mn_exec_tensor_arg(x, args, 2, err, errlen)) == NULL || arg_op(args, 3, b->name, &op, err, errlen) != 0)
    return abort_on_bad_args(c, gid, err);
  x->err_kind = "collective";
  int rc = mn_coll_reduce_scatter(c, gid, t, t2, op, err, errlen, &mismatch);
  return ran(x, rc, mismatch);
}

/* __coll_broadcast(group_id, tensor, root_index) */
static int b_broadcast(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                       size_t errlen) {
  uint64_t gid, root;
  int mismatch = 0;
  mk_tensor_t *t;
  if (group_args(b, args, 3, &gid, err, errlen) != 0) return MN_EINVAL;
  mn_coll_t *c = inst(x);
  if ((t = mn_exec_tensor_arg(x, args, 1, err, errlen)) == NULL ||
      arg_u64(args, 2, "root index", b->name, &root, err, errlen) != 0)
    return abort_on_bad_args(c, gid, err);
  x->err_kind = "collective";
  int rc = mn_coll_broadcast(c, gid, t, root > INT32_MAX ? -1 : (int)root, err, errlen, &mismatch);
  return ran(x, rc, mismatch);
}

/* __coll_all_gather(group_id, src, dst) */
static int b_all_gather(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                        size_t errlen) {
  uint64_t gid;
  int mismatch = 0;
  mk_tensor_t *t, *t2;
  if (group_args(b, args, 3, &gid, err, errlen) != 0) return MN_EINVAL;
  mn_coll_t *c = inst(x);
  if ((t = mn_exec_tensor_arg(x, args, 1, err, errlen)) == NULL ||
      (t2 = mn_exec_tensor_arg(x, args, 2, err, errlen)) == NULL)
    return abort_on_bad_args(c, gid, err);
  x->err_kind = "collective";
  int rc = mn_coll_all_gather(c, gid, t, t2, err, errlen, &mismatch);
  return ran(x, rc, mismatch);
}

/* __coll_barrier(group_id) */
static int b_barrier(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                     size_t errlen) {
  uint64_t gid;
  int mismatch = 0;
  if (group_args(b, args, 1, &gid, err, errlen) != 0) return MN_EINVAL;
  x->err_kind = "collective";
  int rc = mn_coll_barrier(inst(x), gid, err, errlen, &mismatch);
  return ran(x, rc, mismatch);
}

/* A "local" send only records the tensor: the recv on this proc copies it. */
static int send_local(const mk_tensor_t *t, uint64_t tag, char *err, size_t errlen) {
  for (int i = 0; i < MN_COLL_MAX_LOCAL; i++) {
    if (!local_sends[i].used) {
      local_sends[i].used = 1;
      local_sends[i].tag = tag;
      local_sends[i].id = t->id;
      return 0;
    }
  }
  snprintf(err, errlen, "copy: %d local copies are already waiting for their recv (MN_COLL_MAX_LOCAL)",
           MN_COLL_MAX_LOCAL);
  return MN_ELIMIT;
}

/* __coll_send(tensor, "host:port" or "local", tag) */
static int b_send(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                  size_t errlen) {
  const char *s;
  size_t sl;
  uint64_t tag;
  mk_tensor_t *t;
  char addr[MN_COLL_MAX_ADDR + 1];
  if (arg_count(args, 3, 3, b->name, b->usage, err, errlen) != 0 ||
      (t = mn_exec_tensor_arg(x, args, 0, err, errlen)) == NULL ||
      arg_u64(args, 2, "tag", b->name, &tag, err, errlen) != 0)
    return MN_EINVAL;
  if (mn_get_str(args, 1, &s, &sl) != 0 || sl == 0 || sl > MN_COLL_MAX_ADDR) {
    snprintf(err, errlen, "__coll_send: argument 2 must be the receiver's data address \"host:port\" or \"local\"");
    return MN_EINVAL;
  }
  memcpy(addr, s, sl);
  addr[sl] = '\0';
  x->err_kind = "collective";
  if (strcmp(addr, "local") == 0) return send_local(t, tag, err, errlen);
  return mn_coll_send(inst(x), t, addr, tag, err, errlen);
}

/* __coll_recv(tensor, tag) */
static int b_recv(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                  size_t errlen) {
  uint64_t tag;
  int found;
  mk_tensor_t *t;
  if (arg_count(args, 2, 2, b->name, b->usage, err, errlen) != 0 ||
      (t = mn_exec_tensor_arg(x, args, 0, err, errlen)) == NULL ||
      arg_u64(args, 1, "tag", b->name, &tag, err, errlen) != 0)
    return MN_EINVAL;
  x->err_kind = "collective";
  int rc = builtin_recv_local(x, t, tag, &found, err, errlen);
  return found ? rc : mn_coll_recv(inst(x), t, tag, err, errlen);
}

/* ---- collectives kernels call (exec.h's hooks) ------------------------------------ */

static int k_group(mn_exec_t *x, uint64_t gid, mk_group_t *g, char *err, size_t errlen) {
  int me, n;
  if (mn_coll_group_info(inst(x), gid, &me, &n) != 0) {
    snprintf(err, errlen, "rank %d has no group %llu", x->rank, (unsigned long long)gid);
    return MN_ENOTFOUND;
  }
  g->id = gid;
  g->rank = me;
  g->size = n;
  return 0;
}

static int k_run(mn_exec_t *x, const mn_kcoll_t *k, char *err, size_t errlen, int *mismatch) {
  mn_coll_t *c = inst(x);
  switch (k->what) {
  case MN_KCOLL_ALL_REDUCE: return mn_coll_all_reduce(c, k->gid, k->t, k->arg, err, errlen, mismatch);
  case MN_KCOLL_BROADCAST: return mn_coll_broadcast(c, k->gid, k->t, k->arg, err, errlen, mismatch);
  case MN_KCOLL_ALL_GATHER: return mn_coll_all_gather(c, k->gid, k->t, k->dst, err, errlen, mismatch);
  case MN_KCOLL_REDUCE_SCATTER: return mn_coll_reduce_scatter(c, k->gid, k->t, k->dst, k->arg, err, errlen, mismatch);
  case MN_KCOLL_BARRIER: return mn_coll_barrier(c, k->gid, err, errlen, mismatch);
  case MN_KCOLL_FENCE: return mn_coll_fence(c, k->gid, err, errlen, mismatch);
  }
  snprintf(err, errlen, "unknown in-kernel collective %d", (int)k->what);
  return MN_EINVAL;
}

static void k_abort(mn_exec_t *x, uint64_t gid, const char *why) { mn_coll_group_abort(inst(x), gid, why); }

static const mn_exec_coll_t kernel_colls = {k_group, k_run, k_abort};

/* ---- the table ----------------------------------------------------------------- */

/* In the order the "unknown built-in" message lists them. */
static const mn_builtin_t entries[] = {
  {"__coll_port", b_port, "()"},
  {"__coll_group", b_group, "(group_id, my_index, addresses [, ranks])"},
  {"__coll_free", b_free, "(group_id)"},
  {"__coll_layout", b_layout, "(group_id)"},
  {"__coll_all_reduce", b_all_reduce, "(group_id, tensor, op)"},
  {"__coll_broadcast", b_broadcast, "(group_id, tensor, root_index)"},
  {"__coll_all_gather", b_all_gather, "(group_id, src, dst)"},
  {"__coll_reduce_scatter", b_reduce_scatter, "(group_id, src, dst, op)"},
  {"__coll_barrier", b_barrier, "(group_id)"},
  {"__coll_send", b_send, "(tensor, \"host:port\" or \"local\", tag)"},
  {"__coll_recv", b_recv, "(tensor, tag)"},
};

static void coll_unknown(const mn_builtin_module_t *m, const char *name, size_t nl, char *err, size_t errlen) {
  char names[512];
  snprintf(err, errlen, "unknown built-in '%.*s' (collectives: %s)", (int)nl, name,
           mn_exec_builtin_names(m, 0, names, sizeof(names)));
}

static const mn_builtin_module_t module = {"__coll_", entries, (int)(sizeof(entries) / sizeof(entries[0])),
                                           coll_unknown};

int mn_coll_start(const char *bind_host, const mn_auth_t *auth, int rank) {
  char err[256];
  int rc = mn_coll_instance_open(bind_host, auth, rank, err, sizeof(err));
  if (rc != 0) {
    fprintf(stderr, "monarch-worker --proc: data port: %s\n", err);
    return rc;
  }
  if (mn_exec_register(&module) != 0) {
    fprintf(stderr, "monarch-worker --proc: cannot register the collective built-ins (MN_MAX_BUILTIN_MODULES)\n");
    return MN_ELIMIT;
  }
  mn_exec_set_coll(&kernel_colls);
  return 0;
}
