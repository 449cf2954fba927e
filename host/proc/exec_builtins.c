/*
 * exec_builtins.c - the executor's own built-ins: library loading, CPU
 * tensors, process info, the timeline (docs/protocol.md lists them). One short function
 * each, found through the table at the end (exec.c looks it up).
 */
#include "exec_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* An integer id or a tensor handle at argument i; 0, or MN_EINVAL if neither. */
static int arg_id(const msgpack_object *args, uint32_t i, uint64_t *v) {
  if (i >= args->via.array.size) return MN_EINVAL;
  const msgpack_object *o = &args->via.array.ptr[i];
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
    *v = o->via.u64;
    return 0;
  }
  return mn__exec_tensor_id(o, v);
}

mk_tensor_t *mn_exec_tensor_arg(mn_exec_t *x, const msgpack_object *args, uint32_t i, char *err,
                                size_t errlen) {
  uint64_t id;
  if (arg_id(args, i, &id) != 0) {
    snprintf(err, errlen, "argument %u must be a tensor", i + 1);
    return NULL;
  }
  mk_tensor_t *t = mn_tensor_get(&x->reg, id);
  if (t == NULL) snprintf(err, errlen, "argument %u: tensor %llu does not exist on this proc", i + 1, (unsigned long long)id);
  return t;
}

/* __load(library) -> name, kernel count */
static int b_load(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                  size_t errlen) {
  char lname[MN_MAX_NAME + 1];
  const char *s;
  size_t sl;
  if (mn_get_str(args, 0, &s, &sl) != 0 || sl == 0 || sl > MN_MAX_NAME) {
    snprintf(err, errlen, "__load takes a library name of 1..%d bytes", MN_MAX_NAME);
    return MN_EINVAL;
  }
  memcpy(lname, s, sl);
  lname[sl] = '\0';
  const mk_library_t *lib = mn_registry_load(&x->reg, lname, err, errlen);
  if (lib == NULL) return MN_ENOTFOUND; /* not found, or not a usable library: err says which */
  const char *name = lib->name ? lib->name : lname;
  return mn_exec_returned(x, mk_return_string(ctx, name, strlen(name)) || mk_return_int(ctx, lib->count));
}

int mn_exec_dtype_shape(const char *s, size_t sl, const msgpack_object *sh, int *dt, int64_t shape[MK_MAX_DIMS],
                        char *err, size_t errlen) {
  if ((*dt = mn_dtype_parse(s, sl)) < 0) {
    snprintf(err, errlen, "unknown dtype '%.*s' (f32, f64, f16, bf16, i32, i64, u8)", (int)sl, s);
    return MN_EINVAL;
  }
  if (sh->via.array.size > MK_MAX_DIMS) {
    snprintf(err, errlen, "tensor has %u dimensions; MK_MAX_DIMS is %d", sh->via.array.size, MK_MAX_DIMS);
    return MN_EINVAL;
  }
  for (uint32_t i = 0; i < sh->via.array.size; i++) {
    if (mn_get_i64(sh, i, &shape[i]) != 0) {
      snprintf(err, errlen, "tensor shape entry %u is not an integer", i + 1);
      return MN_EINVAL;
    }
  }
  return 0;
}

/* __tensor_new(id, dtype, shape) */
static int b_tensor_new(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                        char *err, size_t errlen) {
  int64_t shape[MK_MAX_DIMS];
  uint64_t id;
  const char *s;
  size_t sl;
  const msgpack_object *sh = args->via.array.size > 2 ? &args->via.array.ptr[2] : NULL;
  if (arg_id(args, 0, &id) != 0 || mn_get_str(args, 1, &s, &sl) != 0 || sh == NULL ||
      sh->type != MSGPACK_OBJECT_ARRAY) {
    snprintf(err, errlen, "%s takes %s", b->name, b->usage);
    return MN_EINVAL;
  }
  int dt;
  int rc = mn_exec_dtype_shape(s, sl, sh, &dt, shape, err, errlen);
  if (rc != 0) return rc;
  /* NULL for a bad shape, a taken id, a limit or memory: err says which, the reply's kind is bad_args. */
  return mn_tensor_new(&x->reg, id, (mk_dtype_t)dt, (int)sh->via.array.size, shape, err, errlen) ? 0 : MN_EINVAL;
}

/* __tensor_free(t) -> true, or false if there was none */
static int b_tensor_free(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                         char *err, size_t errlen) {
  uint64_t id;
  if (arg_id(args, 0, &id) != 0) {
    snprintf(err, errlen, "__tensor_free takes a tensor id");
    return MN_EINVAL;
  }
  return mn_exec_returned(x, mk_return_bool(ctx, mn_tensor_free(&x->reg, id) == 0));
}

/*
 * The CPU tensor and byte range of __tensor_fetch(t [, offset, len]) or
 * __tensor_put(t [, offset], bytes): the whole tensor unless three arguments
 * name an offset (and, to fetch, a length). NULL with err (a bad argument).
 */
static mk_tensor_t *tensor_range(mn_exec_t *x, const mn_builtin_t *b, const msgpack_object *args, int fetch,
                                 int64_t *off, int64_t *len, char *err, size_t errlen) {
  uint64_t id;
  if (arg_id(args, 0, &id) != 0) {
    snprintf(err, errlen, "%s takes a tensor (or tensor id) first", b->name);
    return NULL;
  }
  mk_tensor_t *t = mn_tensor_get(&x->reg, id);
  if (t == NULL) {
    snprintf(err, errlen, "tensor %llu does not exist on this proc", (unsigned long long)id);
    return NULL;
  }
  *off = 0;
  *len = (int64_t)t->nbytes;
  if (args->via.array.size >= 3) {
    if (mn_get_i64(args, 1, off) != 0 || *off < 0 || (size_t)*off > t->nbytes) {
      snprintf(err, errlen, "%s: offset must be an integer within 0..%zu", b->name, t->nbytes);
      return NULL;
    }
    if (fetch && (mn_get_i64(args, 2, len) != 0 || *len < 0 || *len > (int64_t)t->nbytes - *off)) {
      snprintf(err, errlen, "__tensor_fetch: range %lld+%lld is outside the tensor's %zu bytes", (long long)*off,
               (long long)*len, t->nbytes);
      return NULL;
    }
  }
  if (t->device >= 0) {
    snprintf(err, errlen, "tensor %llu is on cuda:%d: use __gpu_fetch / __gpu_put", (unsigned long long)id,
             t->device);
    return NULL;
  }
  return t;
}

/* __tensor_fetch(t [, offset, len]) -> bytes, sent from the tensor itself */
static int b_tensor_fetch(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                          char *err, size_t errlen) {
  int64_t off, len;
  mk_tensor_t *t = tensor_range(x, b, args, 1, &off, &len, err, errlen);
  if (t == NULL) return MN_EINVAL;
  if ((uint64_t)len > MN_MAX_FRAME - 64) {
    snprintf(err, errlen, "fetch of %lld bytes is larger than one frame (MN_MAX_FRAME): fetch in ranges",
             (long long)len);
    return MN_ELIMIT;
  }
  return mn__exec_return_ref(x, (const char *)t->data + off, (size_t)len);
}

/* __tensor_put(t, bytes) or __tensor_put(t, offset, bytes) */
static int b_tensor_put(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args,
                        char *err, size_t errlen) {
  int64_t off, len;
  const char *s;
  size_t sl;
  mk_tensor_t *t = tensor_range(x, b, args, 0, &off, &len, err, errlen);
  if (t == NULL) return MN_EINVAL;
  uint32_t data_at = args->via.array.size >= 3 ? 2 : 1;
  if (mn_get_bin(args, data_at, &s, &sl) != 0 && mn_get_str(args, data_at, &s, &sl) != 0) {
    snprintf(err, errlen, "__tensor_put takes %s", b->usage);
    return MN_EINVAL;
  }
  if (data_at == 1 && sl != t->nbytes) {
    snprintf(err, errlen, "put of %zu bytes into a tensor of %zu bytes", sl, t->nbytes);
    return MN_EINVAL;
  }
  if ((size_t)off + sl > t->nbytes) {
    snprintf(err, errlen, "put of %zu bytes at offset %lld runs past the tensor's %zu bytes", sl, (long long)off,
             t->nbytes);
    return MN_EINVAL;
  }
  memcpy((char *)t->data + off, s, sl);
  return 0;
}

/* __lost(): stands in for a bulk CALL whose payload a reconnect could not resend. */
static int b_lost(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                  size_t errlen) {
  x->err_kind = "lost";
  snprintf(err, errlen, "the call's payload was lost in a reconnect before the proc ran it; send it again");
  return MN_EPEER; /* the connection to the controller lost it */
}

/* __kernels() -> the name of every loaded kernel, in load order (at most MN_MAX_RESULTS) */
static int b_kernels(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                     size_t errlen) {
  for (int l = 0; l < x->reg.nlibs; l++) {
    const mk_library_t *lib = x->reg.libs[l];
    for (int k = 0; k < lib->count && x->nresults < MN_MAX_RESULTS; k++)
      if (mk_return_string(ctx, lib->kernels[k].name, strlen(lib->kernels[k].name)) != 0) return MN_ENOMEM;
  }
  return 0;
}

/* __info() -> rank, world, pid, hostname, live tensors, their bytes */
static int b_info(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                  size_t errlen) {
  char h[256];
  if (gethostname(h, sizeof(h)) != 0) strcpy(h, "?");
  h[sizeof(h) - 1] = '\0';
  int bad = mk_return_int(ctx, x->rank) || mk_return_int(ctx, x->world) || mk_return_int(ctx, getpid()) ||
            mk_return_string(ctx, h, strlen(h)) || mk_return_int(ctx, (int64_t)x->reg.ntensors) ||
            mk_return_int(ctx, (int64_t)x->reg.tensor_bytes);
  return mn_exec_returned(x, bad);
}

/* __trace("take", max): the oldest spans (at most max, and MN_TRACE_TAKE_MAX), packed. */
static int trace_take(mn_exec_t *x, mk_ctx_t *ctx, int64_t now, uint64_t max, char *err, size_t errlen) {
  mn_trace_t *t = &x->trace;
  uint32_t n = max == 0 || max > MN_TRACE_TAKE_MAX ? MN_TRACE_TAKE_MAX : (uint32_t)max;
  if (n > t->count) n = t->count;
  unsigned char *buf = malloc((size_t)n * MN_TRACE_REC + 1);
  if (buf == NULL) {
    snprintf(err, errlen, "__trace: out of memory packing %u spans", n);
    return MN_ENOMEM;
  }
  n = mn_trace_take(t, buf, n);
  int bad = mk_return_int(ctx, now) || mk_return_bytes(ctx, buf, (size_t)n * MN_TRACE_REC) ||
            mk_return_int(ctx, t->count) || mk_return_int(ctx, (int64_t)t->dropped);
  free(buf);
  return mn_exec_returned(x, bad);
}

static int op_is(const char *s, size_t n, const char *op) { return strlen(op) == n && memcmp(s, op, n) == 0; }

/*
 * __trace(op [, n]) -> the trace clock (ns) when it ran, first whatever op does
 * (every answer is a sample for the controller's clock alignment):
 *   "start" [, spans]  record from now on, in a ring of `spans` (made by the first start)
 *   "stop"             stop recording; the spans stay to be taken
 *   "clock"            only the clock
 *   "take" [, max]     -> clock, packed spans (bytes), spans still left, spans dropped so far
 */
static int b_trace(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                   size_t errlen) {
  const char *op;
  size_t ol;
  uint64_t n = 0;
  if (mn_get_str(args, 0, &op, &ol) != 0 || args->via.array.size > 2 ||
      (args->via.array.size == 2 && mn_get_u64(args, 1, &n) != 0)) {
    snprintf(err, errlen, "__trace takes %s", b->usage);
    return MN_EINVAL;
  }
  int64_t now = mn_trace_now(&x->trace);
  if (op_is(op, ol, "start")) {
    int rc = mn_trace_start(&x->trace, n > MN_TRACE_SPANS_MAX ? MN_TRACE_SPANS_MAX + 1 : (uint32_t)n, err, errlen);
    if (rc != 0) return rc;
  } else if (op_is(op, ol, "stop")) {
    mn_trace_stop(&x->trace);
  } else if (op_is(op, ol, "take")) {
    return trace_take(x, ctx, now, n, err, errlen);
  } else if (!op_is(op, ol, "clock")) {
    snprintf(err, errlen, "__trace: unknown op '%.*s' (start, stop, clock, take)", (int)(ol > 32 ? 32 : ol), op);
    return MN_EINVAL;
  }
  return mn_exec_returned(x, mk_return_int(ctx, now));
}

static const mn_builtin_t entries[] = {
  {"__load", b_load, "(library)"},
  {"__tensor_new", b_tensor_new, "(id, dtype, shape)"},
  {"__tensor_free", b_tensor_free, "(tensor)"},
  {"__tensor_fetch", b_tensor_fetch, "(tensor [, offset, len])"},
  {"__tensor_put", b_tensor_put, "(tensor, bytes) or (tensor, offset, bytes)"},
  {"__lost", b_lost, "()"},
  {"__kernels", b_kernels, "()"},
  {"__info", b_info, "()"},
  {"__trace", b_trace, "(\"start\" [, spans]), (\"stop\"), (\"clock\") or (\"take\" [, max])"},
};

const mn_builtin_module_t mn__exec_builtins = {"__", entries, (int)(sizeof(entries) / sizeof(entries[0])), NULL};
