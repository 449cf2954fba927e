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
  return -1;
}

static int arg_op(const msgpack_object *args, uint32_t i, const char *what, int *op, char *err, size_t errlen) {
  const char *s;
  size_t n;
  if (mn_get_str(args, i, &s, &n) != 0 || (*op = mn_coll_op_parse(s, n)) < 0) {
    if (i < args->via.array.size && args->via.array.ptr[i].type == MSGPACK_OBJECT_STR)
      snprintf(err, errlen, "%s: unknown op '%.*s' (sum, max, min, avg)", what, (int)(n > 32 ? 32 : n), s);
    else
      snprintf(err, errlen, "%s: argument %u (op) must be one of \"sum\", \"max\", \"min\", \"avg\"", what, i + 1);
    return -1;
  }
  return 0;
}

static int arg_count(const msgpack_object *args, uint32_t lo, uint32_t hi, const char *what, const char *sig,
                     char *err, size_t errlen) {
  uint32_t n = args->via.array.size;
  if (n >= lo && n <= hi) return 0;
  snprintf(err, errlen, "%s takes %s, got %u argument%s", what, sig, n, n == 1 ? "" : "s");
  return -1;
}

/* __coll_group(gid, my_index, {"host:port", ...} [, {rank, ...}]) */
static int builtin_group(const msgpack_object *args, char *err, size_t errlen) {
  const char *what = "__coll_group";
  uint64_t gid, me;
  if (arg_count(args, 3, 4, what, "(group_id, my_index, addresses [, ranks])", err, errlen) != 0 ||
      arg_u64(args, 0, "group id", what, &gid, err, errlen) != 0 ||
      arg_u64(args, 1, "my index", what, &me, err, errlen) != 0)
    return -1;
  const msgpack_object *a = &args->via.array.ptr[2];
  const msgpack_object *r = args->via.array.size > 3 ? &args->via.array.ptr[3] : NULL;
  if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size < 1 || a->via.array.size > MN_COLL_MAX_MEMBERS) {
    snprintf(err, errlen, "%s: argument 3 must be a list of 1..%d \"host:port\" addresses", what,
             MN_COLL_MAX_MEMBERS);
    return -1;
  }
  int n = (int)a->via.array.size;
  if (r != NULL && r->type != MSGPACK_OBJECT_NIL && (r->type != MSGPACK_OBJECT_ARRAY || (int)r->via.array.size != n)) {
    snprintf(err, errlen, "%s: argument 4 must be a list of %d ranks", what, n);
    return -1;
  }
  if (me >= (uint64_t)n) {
    snprintf(err, errlen, "%s: my index %llu is outside 0..%d", what, (unsigned long long)me, n - 1);
    return -1;
  }
  char **addrs = calloc((size_t)n, sizeof(char *));
  int *ranks = malloc(sizeof(int) * (size_t)n), rc = -1;
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
      goto done;
    }
    if ((addrs[i] = strndup(s, sl)) == NULL) {
      snprintf(err, errlen, "%s: out of memory", what);
      goto done;
    }
    if (r != NULL && r->type == MSGPACK_OBJECT_ARRAY && (mn_get_i64(r, (uint32_t)i, &rk) != 0 || rk < -1 || rk > INT32_MAX)) {
      snprintf(err, errlen, "%s: rank %d must be an integer", what, i + 1);
      goto done;
    }
    ranks[i] = (int)rk;
  }
  rc = mn_coll_group(mn_coll_instance(), gid, (int)me, n, (const char *const *)addrs, ranks, err, errlen);
done:
  for (int i = 0; addrs != NULL && i < n; i++) free(addrs[i]);
  free(addrs);
  free(ranks);
  return rc;
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
      return -1;
    }
    if (s->nbytes != t->nbytes || s->dtype != t->dtype) {
      snprintf(err, errlen, "copy: the source is %s of %zu bytes but the destination on rank %d is %s of %zu bytes",
               mn_dtype_name(s->dtype), s->nbytes, x->rank, mn_dtype_name(t->dtype), t->nbytes);
      return -1;
    }
    if (s != t) memcpy(t->data, s->data, t->nbytes);
    return 0;
  }
  return 0;
}

/* The other members are (or will be) in this collective: tell them why this one is not. */
static int abort_on_bad_args(mn_coll_t *c, uint64_t gid, const char *err) {
  mn_coll_group_abort(c, gid, err);
  return -1;
}

static int coll_builtin(mn_exec_t *x, mk_ctx_t *ctx, const char *name, size_t nl, const msgpack_object *args,
                        char *err, size_t errlen) {
  uint64_t gid, tag, root;
  int op, mismatch = 0, rc;
  mk_tensor_t *t, *t2 = NULL;
  mn_coll_t *c = mn_coll_instance();
  mn_coll_set_cancel(c, x->cancel);
#define IS(lit) (nl == sizeof(lit) - 1 && memcmp(name, lit, nl) == 0)
#define TENSOR(i) mn_exec_tensor_arg(x, args, i, err, errlen)
  if (IS("__coll_port")) return mk_return_int(ctx, mn_coll_port(c)) == 0 ? 0 : -1;
  if (IS("__coll_group")) return builtin_group(args, err, errlen);
  if (IS("__coll_free")) {
    if (arg_count(args, 1, 1, "__coll_free", "(group_id)", err, errlen) != 0 ||
        arg_u64(args, 0, "group id", "__coll_free", &gid, err, errlen) != 0)
      return -1;
    return mn_coll_group_free(c, gid);
  }
  if (IS("__coll_layout")) {
    static const char *const names[] = {"flat", "one host", "hosts"};
    if (arg_count(args, 1, 1, "__coll_layout", "(group_id)", err, errlen) != 0 ||
        arg_u64(args, 0, "group id", "__coll_layout", &gid, err, errlen) != 0)
      return -1;
    int l = mn_coll_group_layout(c, gid);
    if (l < 0) {
      snprintf(err, errlen, "__coll_layout: rank %d has no group %llu", mn_coll_rank(c), (unsigned long long)gid);
      return -1;
    }
    return mk_return_string(ctx, names[l], strlen(names[l])) == 0 ? 0 : -1;
  }
  if (IS("__coll_all_reduce") || IS("__coll_reduce_scatter")) {
    int scatter = IS("__coll_reduce_scatter");
    const char *what = scatter ? "__coll_reduce_scatter" : "__coll_all_reduce";
    uint32_t opi = scatter ? 3 : 2;
    if (arg_count(args, opi + 1, opi + 1, what, scatter ? "(group_id, src, dst, op)" : "(group_id, tensor, op)",
                  err, errlen) != 0 ||
        arg_u64(args, 0, "group id", what, &gid, err, errlen) != 0)
      return -1;
    if ((t = TENSOR(1)) == NULL || (scatter && (t2 = TENSOR(2)) == NULL) || arg_op(args, opi, what, &op, err, errlen) != 0)
      return abort_on_bad_args(c, gid, err);
    x->err_kind = "collective";
    rc = scatter ? mn_coll_reduce_scatter(c, gid, t, t2, op, err, errlen, &mismatch)
                 : mn_coll_all_reduce(c, gid, t, op, err, errlen, &mismatch);
  } else if (IS("__coll_broadcast")) {
    if (arg_count(args, 3, 3, "__coll_broadcast", "(group_id, tensor, root_index)", err, errlen) != 0 ||
        arg_u64(args, 0, "group id", "__coll_broadcast", &gid, err, errlen) != 0)
      return -1;
    if ((t = TENSOR(1)) == NULL || arg_u64(args, 2, "root index", "__coll_broadcast", &root, err, errlen) != 0)
      return abort_on_bad_args(c, gid, err);
    x->err_kind = "collective";
    rc = mn_coll_broadcast(c, gid, t, root > INT32_MAX ? -1 : (int)root, err, errlen, &mismatch);
  } else if (IS("__coll_all_gather")) {
    if (arg_count(args, 3, 3, "__coll_all_gather", "(group_id, src, dst)", err, errlen) != 0 ||
        arg_u64(args, 0, "group id", "__coll_all_gather", &gid, err, errlen) != 0)
      return -1;
    if ((t = TENSOR(1)) == NULL || (t2 = TENSOR(2)) == NULL) return abort_on_bad_args(c, gid, err);
    x->err_kind = "collective";
    rc = mn_coll_all_gather(c, gid, t, t2, err, errlen, &mismatch);
  } else if (IS("__coll_barrier")) {
    if (arg_count(args, 1, 1, "__coll_barrier", "(group_id)", err, errlen) != 0 ||
        arg_u64(args, 0, "group id", "__coll_barrier", &gid, err, errlen) != 0)
      return -1;
    x->err_kind = "collective";
    rc = mn_coll_barrier(c, gid, err, errlen, &mismatch);
  } else if (IS("__coll_send")) {
    const char *s;
    size_t sl;
    char addr[MN_COLL_MAX_ADDR + 1];
    if (arg_count(args, 3, 3, "__coll_send", "(tensor, \"host:port\" or \"local\", tag)", err, errlen) != 0 ||
        (t = TENSOR(0)) == NULL || arg_u64(args, 2, "tag", "__coll_send", &tag, err, errlen) != 0)
      return -1;
    if (mn_get_str(args, 1, &s, &sl) != 0 || sl == 0 || sl > MN_COLL_MAX_ADDR) {
      snprintf(err, errlen, "__coll_send: argument 2 must be the receiver's data address \"host:port\" or \"local\"");
      return -1;
    }
    memcpy(addr, s, sl);
    addr[sl] = '\0';
    x->err_kind = "collective";
    if (strcmp(addr, "local") == 0) {
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
      return -1;
    }
    rc = mn_coll_send(c, t, addr, tag, err, errlen);
  } else if (IS("__coll_recv")) {
    int found;
    if (arg_count(args, 2, 2, "__coll_recv", "(tensor, tag)", err, errlen) != 0 || (t = TENSOR(0)) == NULL ||
        arg_u64(args, 1, "tag", "__coll_recv", &tag, err, errlen) != 0)
      return -1;
    x->err_kind = "collective";
    rc = builtin_recv_local(x, t, tag, &found, err, errlen);
    if (!found) rc = mn_coll_recv(c, t, tag, err, errlen);
  } else {
    snprintf(err, errlen, "unknown built-in '%.*s' (collectives: __coll_port, __coll_group, __coll_free, __coll_layout, "
             "__coll_all_reduce, __coll_broadcast, __coll_all_gather, __coll_reduce_scatter, __coll_barrier, "
             "__coll_send, __coll_recv)", (int)nl, name);
    return -1;
  }
#undef IS
#undef TENSOR
  if (rc != 0 && mismatch) x->err_kind = "collective_mismatch";
  return rc;
}

int mn_coll_start(const char *bind_host, const mn_auth_t *auth, int rank) {
  char err[256];
  int rc = mn_coll_instance_open(bind_host, auth, rank, err, sizeof(err));
  if (rc != 0) {
    fprintf(stderr, "monarch-worker --proc: data port: %s\n", err);
    return rc;
  }
  if (mn_exec_register("__coll_", coll_builtin) != 0) {
    fprintf(stderr, "monarch-worker --proc: cannot register the collective built-ins (MN_MAX_BUILTIN_MODULES)\n");
    return -1;
  }
  return 0;
}
