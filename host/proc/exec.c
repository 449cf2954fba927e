/* exec.c - the proc's CALL executor; see exec.h. */
#include "exec.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MN_EXT_TENSOR 1 /* msgpack ext type of a tensor handle: 8-byte big-endian id */

/* ---- the mk_api_t kernels see -------------------------------------------- */

static mn_exec_t *X(mk_ctx_t *ctx) { return (mn_exec_t *)ctx->host; }

static int count_result(mn_exec_t *x) {
  if (x->nresults >= MN_MAX_RESULTS) {
    snprintf(x->errmsg, sizeof(x->errmsg), "kernel returned more than MN_MAX_RESULTS (%d) values",
             MN_MAX_RESULTS);
    x->failed = 1;
    return -1;
  }
  x->nresults++;
  return 0;
}

static int api_nil(mk_ctx_t *c) {
  if (count_result(X(c))) return -1;
  return msgpack_pack_nil(&X(c)->rpk);
}
static int api_bool(mk_ctx_t *c, int b) {
  if (count_result(X(c))) return -1;
  return b ? msgpack_pack_true(&X(c)->rpk) : msgpack_pack_false(&X(c)->rpk);
}
static int api_int(mk_ctx_t *c, int64_t i) {
  if (count_result(X(c))) return -1;
  return msgpack_pack_int64(&X(c)->rpk, i);
}
static int api_number(mk_ctx_t *c, double d) {
  if (count_result(X(c))) return -1;
  return msgpack_pack_double(&X(c)->rpk, d);
}
static int api_string(mk_ctx_t *c, const char *s, size_t n) {
  if (count_result(X(c))) return -1;
  msgpack_pack_str(&X(c)->rpk, n);
  return msgpack_pack_str_body(&X(c)->rpk, s, n);
}
static int api_bytes(mk_ctx_t *c, const void *p, size_t n) {
  if (count_result(X(c))) return -1;
  msgpack_pack_bin(&X(c)->rpk, n);
  return msgpack_pack_bin_body(&X(c)->rpk, p, n);
}
__attribute__((format(printf, 2, 3))) static int api_error(mk_ctx_t *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(X(c)->errmsg, sizeof(X(c)->errmsg), fmt, ap);
  va_end(ap);
  X(c)->failed = 1;
  return -1;
}
/* The first request of a call reuses a cached block; later ones in the same
 * call get blocks of their own, so every pointer stays valid until return. */
static void *api_scratch(mk_ctx_t *c, size_t n) {
  mn_exec_t *x = X(c);
  void *p = NULL;
  if (!x->scratch_used) {
    if (n > x->scratch_cap) {
      if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
      free(x->scratch);
      x->scratch = p;
      x->scratch_cap = n;
    }
    x->scratch_used = 1;
    return x->scratch;
  }
  if (x->nextra == MN_MAX_SCRATCH || posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
  x->extra[x->nextra++] = p;
  return p;
}

static void scratch_release(mn_exec_t *x) {
  for (int i = 0; i < x->nextra; i++) free(x->extra[i]);
  x->nextra = 0;
  x->scratch_used = 0;
}
static int api_cancelled(mk_ctx_t *c) { return atomic_load(X(c)->cancel) != 0; }

static const mk_api_t api = {api_nil, api_bool, api_int, api_number, api_string,
                             api_bytes, api_error, api_scratch, api_cancelled};

/* ---- replies ------------------------------------------------------------ */

static void reply_err(mn_exec_t *x, uint64_t seq, const char *kind, const char *kernel,
                      size_t klen, const char *msg);

/* [RESULT, seq, true, [values...]] from the packed results in x->rbuf. */
static void reply_ok(mn_exec_t *x, uint64_t seq, const char *kernel, size_t klen) {
  if (x->rbuf.len + x->ref_len > MN_MAX_FRAME - 64) {
    x->ref_len = 0;
    char msg[160];
    snprintf(msg, sizeof(msg), "results of %zu bytes do not fit in one frame (MN_MAX_FRAME is %u)",
             x->rbuf.len, MN_MAX_FRAME);
    reply_err(x, seq, "kernel", kernel, klen, msg);
    return;
  }
  msgpack_packer pk;
  msgpack_packer_init(&pk, &x->out, mn_buf_write_cb);
  size_t start = mn_frame_begin(&x->out);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_RESULT);
  msgpack_pack_uint64(&pk, seq);
  msgpack_pack_true(&pk);
  msgpack_pack_array(&pk, x->nresults);
  if (mn_buf_append(&x->out, x->rbuf.data, x->rbuf.len) != 0) {
    x->out.len = start;
    x->ref_len = 0;
    return;
  }
  mn_frame_end(&x->out, start);
  if (x->ref_len > 0) /* the payload written after these bytes belongs to this frame */
    mn_put_be32(x->out.data + start, (uint32_t)(x->out.len - start - MN_FRAME_HEADER + x->ref_len));
}

/* [RESULT, seq, false, {kind, message, kernel}] */
static void reply_err(mn_exec_t *x, uint64_t seq, const char *kind, const char *kernel,
                      size_t klen, const char *msg) {
  msgpack_packer pk;
  x->ref_len = 0;
  msgpack_packer_init(&pk, &x->out, mn_buf_write_cb);
  size_t start = mn_frame_begin(&x->out);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_RESULT);
  msgpack_pack_uint64(&pk, seq);
  msgpack_pack_false(&pk);
  msgpack_pack_map(&pk, 3);
  mn_pack_cstr(&pk, "kind");
  mn_pack_cstr(&pk, kind);
  mn_pack_cstr(&pk, "message");
  mn_pack_cstr(&pk, msg);
  mn_pack_cstr(&pk, "kernel");
  msgpack_pack_str(&pk, klen);
  msgpack_pack_str_body(&pk, kernel, klen);
  mn_frame_end(&x->out, start);
}

/* ---- arguments ---------------------------------------------------------- */

static const char *obj_type_name(const msgpack_object *o) {
  switch (o->type) {
  case MSGPACK_OBJECT_NIL: return "nil";
  case MSGPACK_OBJECT_BOOLEAN: return "boolean";
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "integer";
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64: return "number";
  case MSGPACK_OBJECT_STR: return "string";
  case MSGPACK_OBJECT_BIN: return "bytes";
  case MSGPACK_OBJECT_ARRAY:
  case MSGPACK_OBJECT_MAP: return "table";
  case MSGPACK_OBJECT_EXT: return "tensor";
  default: return "?";
  }
}

static const char *want_name(char c) {
  switch (c) {
  case 'n': return "number";
  case 'i': return "integer";
  case 's': return "string";
  case 'b': return "bytes";
  case 't': return "tensor";
  case 'B': return "boolean";
  default: return "any value";
  }
}

/* Reads a tensor handle from an ext object; 0 or -1. */
static int tensor_id(const msgpack_object *o, uint64_t *id) {
  if (o->type != MSGPACK_OBJECT_EXT || o->via.ext.type != MN_EXT_TENSOR || o->via.ext.size != 8) return -1;
  const unsigned char *p = (const unsigned char *)o->via.ext.ptr;
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
  *id = v;
  return 0;
}

/*
 * Converts argument i to what signature letter `want` asks for.
 * Returns 0, or -1 with a message in err naming the argument.
 */
static int convert_arg(mn_exec_t *x, const msgpack_object *o, char want, int i, mk_arg_t *a,
                       char *err, size_t errlen) {
  uint64_t id;
  memset(a, 0, sizeof(*a));
  switch (o->type) {
  case MSGPACK_OBJECT_NIL: a->type = MK_ARG_NIL; break;
  case MSGPACK_OBJECT_BOOLEAN: a->type = MK_ARG_BOOL; a->v.b = o->via.boolean; break;
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    a->type = MK_ARG_INT;
    a->v.i = o->via.u64 > INT64_MAX ? INT64_MAX : (int64_t)o->via.u64;
    break;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: a->type = MK_ARG_INT; a->v.i = o->via.i64; break;
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64: a->type = MK_ARG_NUMBER; a->v.num = o->via.f64; break;
  case MSGPACK_OBJECT_STR:
    a->type = MK_ARG_STRING; a->v.str.ptr = o->via.str.ptr; a->v.str.len = o->via.str.size;
    break;
  case MSGPACK_OBJECT_BIN:
    a->type = MK_ARG_BYTES; a->v.str.ptr = o->via.bin.ptr; a->v.str.len = o->via.bin.size;
    break;
  case MSGPACK_OBJECT_EXT:
    if (tensor_id(o, &id) != 0) {
      snprintf(err, errlen, "argument %d: unknown extension value", i + 1);
      return -1;
    }
    a->type = MK_ARG_TENSOR;
    a->v.tensor = mn_tensor_get(&x->reg, id);
    if (a->v.tensor == NULL) {
      snprintf(err, errlen, "argument %d: tensor %llu does not exist on this proc (freed?)", i + 1,
               (unsigned long long)id);
      return -1;
    }
    break;
  default:
    snprintf(err, errlen, "argument %d: a %s cannot be passed to a kernel", i + 1, obj_type_name(o));
    return -1;
  }
  int ok = 1;
  switch (want) {
  case 'n':
    if (a->type == MK_ARG_INT) { a->type = MK_ARG_NUMBER; a->v.num = (double)a->v.i; }
    ok = a->type == MK_ARG_NUMBER;
    break;
  case 'i':
    /* Range check first: casting NaN or a huge double to int64 is undefined. */
    if (a->type == MK_ARG_NUMBER && a->v.num >= -9.2e18 && a->v.num <= 9.2e18 &&
        a->v.num == (double)(int64_t)a->v.num) {
      a->type = MK_ARG_INT; a->v.i = (int64_t)a->v.num;
    }
    ok = a->type == MK_ARG_INT;
    break;
  case 's': ok = a->type == MK_ARG_STRING; break;
  case 'b':
    if (a->type == MK_ARG_STRING) a->type = MK_ARG_BYTES;
    ok = a->type == MK_ARG_BYTES;
    break;
  case 't': ok = a->type == MK_ARG_TENSOR; break;
  case 'B': ok = a->type == MK_ARG_BOOL; break;
  default: break;
  }
  if (!ok) {
    snprintf(err, errlen, "argument %d: expected %s, got %s", i + 1, want_name(want), obj_type_name(o));
    return -1;
  }
  return 0;
}

/* Checks args against a signature and converts them; 0 or -1 with err. */
static int bind_args(mn_exec_t *x, const mk_kernel_t *k, const msgpack_object *args, mk_arg_t *argv,
                     char *err, size_t errlen) {
  const char *sig = k->signature;
  int n = (int)args->via.array.size, max = 0, rest = 0, opt_from = -1;
  char letters[MN_MAX_ARGS];
  for (const char *p = sig; *p && max < MN_MAX_ARGS; p++) {
    if (*p == '*') { rest = 1; break; }
    if (*p == '?') { /* the letter before '?' and every later one are optional */
      if (opt_from < 0 && max > 0) opt_from = max - 1;
      continue;
    }
    letters[max++] = *p;
  }
  int min = opt_from >= 0 ? opt_from : max;
  if (n < min || (!rest && n > max)) {
    if (min == max)
      snprintf(err, errlen, "expected %d argument%s, got %d (signature \"%s\")", max, max == 1 ? "" : "s", n, sig);
    else
      snprintf(err, errlen, "expected %d to %d arguments, got %d (signature \"%s\")", min, max, n, sig);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    char want = i < max ? letters[i] : 'a';
    if (convert_arg(x, &args->via.array.ptr[i], want, i, &argv[i], err, errlen) != 0) return -1;
  }
  return 0;
}

/* ---- built-ins ----------------------------------------------------------- */

static int get_arg_u64(const msgpack_object *args, uint32_t i, uint64_t *v) {
  if (i >= args->via.array.size) return -1;
  const msgpack_object *o = &args->via.array.ptr[i];
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) { *v = o->via.u64; return 0; }
  return tensor_id(o, v);
}

static struct {
  const char *prefix;
  mn_builtin_fn fn;
} modules[MN_MAX_BUILTIN_MODULES];
static int nmodules;

int mn_exec_register(const char *prefix, mn_builtin_fn fn) {
  if (nmodules == MN_MAX_BUILTIN_MODULES) return -1;
  modules[nmodules].prefix = prefix;
  modules[nmodules].fn = fn;
  nmodules++;
  return 0;
}

mk_tensor_t *mn_exec_tensor_arg(mn_exec_t *x, const msgpack_object *args, uint32_t i, char *err,
                                size_t errlen) {
  uint64_t id;
  if (get_arg_u64(args, i, &id) != 0) {
    snprintf(err, errlen, "argument %u must be a tensor", i + 1);
    return NULL;
  }
  mk_tensor_t *t = mn_tensor_get(&x->reg, id);
  if (t == NULL) snprintf(err, errlen, "argument %u: tensor %llu does not exist on this proc", i + 1, (unsigned long long)id);
  return t;
}

/* Runs a "__" built-in; returns 0 or -1 with err. Results go to rbuf. */
static int run_builtin(mn_exec_t *x, mk_ctx_t *ctx, const char *name, size_t nl,
                       const msgpack_object *args, char *err, size_t errlen) {
  const char *s;
  size_t sl;
  uint64_t id;
#define IS(lit) (nl == sizeof(lit) - 1 && memcmp(name, lit, nl) == 0)
  if (IS("__load")) {
    char lname[MN_MAX_NAME + 1];
    if (mn_get_str(args, 0, &s, &sl) != 0 || sl == 0 || sl > MN_MAX_NAME) {
      snprintf(err, errlen, "__load takes a library name of 1..%d bytes", MN_MAX_NAME);
      return -1;
    }
    memcpy(lname, s, sl);
    lname[sl] = '\0';
    const mk_library_t *lib = mn_registry_load(&x->reg, lname, err, errlen);
    if (lib == NULL) return -1;
    api_string(ctx, lib->name ? lib->name : lname, strlen(lib->name ? lib->name : lname));
    api_int(ctx, lib->count);
    return 0;
  }
  if (IS("__tensor_new")) {
    int64_t shape[MK_MAX_DIMS];
    const msgpack_object *sh = args->via.array.size > 2 ? &args->via.array.ptr[2] : NULL;
    if (get_arg_u64(args, 0, &id) != 0 || mn_get_str(args, 1, &s, &sl) != 0 || sh == NULL ||
        sh->type != MSGPACK_OBJECT_ARRAY) {
      snprintf(err, errlen, "__tensor_new takes (id, dtype, shape)");
      return -1;
    }
    int dt = mn_dtype_parse(s, sl);
    if (dt < 0) {
      snprintf(err, errlen, "unknown dtype '%.*s' (f32, f64, f16, bf16, i32, i64, u8)", (int)sl, s);
      return -1;
    }
    if (sh->via.array.size > MK_MAX_DIMS) {
      snprintf(err, errlen, "tensor has %u dimensions; MK_MAX_DIMS is %d", sh->via.array.size, MK_MAX_DIMS);
      return -1;
    }
    for (uint32_t i = 0; i < sh->via.array.size; i++) {
      if (mn_get_i64(sh, i, &shape[i]) != 0) {
        snprintf(err, errlen, "tensor shape entry %u is not an integer", i + 1);
        return -1;
      }
    }
    return mn_tensor_new(&x->reg, id, (mk_dtype_t)dt, (int)sh->via.array.size, shape, err, errlen) ? 0 : -1;
  }
  if (IS("__tensor_free")) {
    if (get_arg_u64(args, 0, &id) != 0) {
      snprintf(err, errlen, "__tensor_free takes a tensor id");
      return -1;
    }
    api_bool(ctx, mn_tensor_free(&x->reg, id) == 0);
    return 0;
  }
  if (IS("__tensor_fetch") || IS("__tensor_put")) {
    if (get_arg_u64(args, 0, &id) != 0) {
      snprintf(err, errlen, "%.*s takes a tensor (or tensor id) first", (int)nl, name);
      return -1;
    }
    mk_tensor_t *t = mn_tensor_get(&x->reg, id);
    if (t == NULL) {
      snprintf(err, errlen, "tensor %llu does not exist on this proc", (unsigned long long)id);
      return -1;
    }
    /* Optional byte range: (tensor, offset, len) to fetch, (tensor, offset, bytes) to put. */
    int64_t off = 0, len = (int64_t)t->nbytes;
    uint32_t data_at = 1;
    if (args->via.array.size >= 3) {
      if (mn_get_i64(args, 1, &off) != 0 || off < 0 || (size_t)off > t->nbytes) {
        snprintf(err, errlen, "%.*s: offset must be an integer within 0..%zu", (int)nl, name, t->nbytes);
        return -1;
      }
      data_at = 2;
      if (IS("__tensor_fetch") && (mn_get_i64(args, 2, &len) != 0 || len < 0 || len > (int64_t)t->nbytes - off)) {
        snprintf(err, errlen, "__tensor_fetch: range %lld+%lld is outside the tensor's %zu bytes", (long long)off,
                 (long long)len, t->nbytes);
        return -1;
      }
    }
    if (t->device >= 0) {
      snprintf(err, errlen, "tensor %llu is on cuda:%d: use __gpu_fetch / __gpu_put", (unsigned long long)id,
               t->device);
      return -1;
    }
    if (IS("__tensor_fetch")) {
      if ((uint64_t)len > MN_MAX_FRAME - 64) {
        snprintf(err, errlen, "fetch of %lld bytes is larger than one frame (MN_MAX_FRAME): fetch in ranges",
                 (long long)len);
        return -1;
      }
      /* Only the bin header is packed; the bytes go out from the tensor itself. */
      if (count_result(x)) return -1;
      msgpack_pack_bin(&x->rpk, (size_t)len);
      x->ref_ptr = (const char *)t->data + off;
      x->ref_len = (size_t)len;
      return 0;
    }
    if (mn_get_bin(args, data_at, &s, &sl) != 0 && mn_get_str(args, data_at, &s, &sl) != 0) {
      snprintf(err, errlen, "__tensor_put takes (tensor, bytes) or (tensor, offset, bytes)");
      return -1;
    }
    if (data_at == 1 && sl != t->nbytes) {
      snprintf(err, errlen, "put of %zu bytes into a tensor of %zu bytes", sl, t->nbytes);
      return -1;
    }
    if ((size_t)off + sl > t->nbytes) {
      snprintf(err, errlen, "put of %zu bytes at offset %lld runs past the tensor's %zu bytes", sl, (long long)off,
               t->nbytes);
      return -1;
    }
    memcpy((char *)t->data + off, s, sl);
    return 0;
  }
  if (IS("__lost")) {
    /* Stands in for a bulk CALL whose payload a reconnect could not resend. */
    x->err_kind = "lost";
    snprintf(err, errlen, "the call's payload was lost in a reconnect before the proc ran it; send it again");
    return -1;
  }
  if (IS("__kernels")) {
    int total = 0;
    for (int l = 0; l < x->reg.nlibs; l++) total += x->reg.libs[l]->count;
    for (int l = 0; l < x->reg.nlibs; l++)
      for (int k = 0; k < x->reg.libs[l]->count && x->nresults < MN_MAX_RESULTS; k++)
        api_string(ctx, x->reg.libs[l]->kernels[k].name, strlen(x->reg.libs[l]->kernels[k].name));
    (void)total;
    return 0;
  }
  if (IS("__info")) {
    char h[256];
    if (gethostname(h, sizeof(h)) != 0) strcpy(h, "?");
    h[sizeof(h) - 1] = '\0';
    api_int(ctx, x->rank);
    api_int(ctx, x->world);
    api_int(ctx, getpid());
    api_string(ctx, h, strlen(h));
    api_int(ctx, (int64_t)x->reg.ntensors);
    api_int(ctx, (int64_t)x->reg.tensor_bytes);
    return 0;
  }
#undef IS
  for (int m = 0; m < nmodules; m++) {
    size_t pl = strlen(modules[m].prefix);
    if (nl >= pl && memcmp(name, modules[m].prefix, pl) == 0)
      return modules[m].fn(x, ctx, name, nl, args, err, errlen);
  }
  snprintf(err, errlen, "unknown built-in '%.*s'", (int)nl, name);
  return -1;
}

/* ---- the CALL path --------------------------------------------------------- */

int mn_exec_init(mn_exec_t *x, const char *prefix, int rank, int world, atomic_int *cancel) {
  memset(x, 0, sizeof(*x));
  mn_registry_init(&x->reg, prefix);
  x->rank = rank;
  x->world = world;
  x->cancel = cancel;
  x->device = -1;
  if (!msgpack_zone_init(&x->zone, 8192)) return MN_ENOMEM;
  msgpack_packer_init(&x->rpk, &x->rbuf, mn_buf_write_cb);
  return 0;
}

void mn_exec_close(mn_exec_t *x) {
  mn_registry_close(&x->reg);
  mn_buf_free(&x->out);
  mn_buf_free(&x->rbuf);
  scratch_release(x);
  free(x->scratch);
  msgpack_zone_destroy(&x->zone);
}

static int protocol_error(mn_exec_t *x, int code, const char *msg) {
  mn_pack_error(&x->out, code, msg);
  return code;
}

int mn_exec_frame(mn_exec_t *x, const char *body, size_t len) {
  msgpack_object msg;
  char err[MN_MAX_ERRMSG];
  uint64_t seq;
  const char *kname;
  size_t kl;
  msgpack_zone_clear(&x->zone);
  int rc = mn_decode(body, len, &x->zone, &msg, err, sizeof(err));
  if (rc != 0) return protocol_error(x, rc, err);
  if (mn_msg_type(&msg) != MN_MSG_CALL) {
    snprintf(err, sizeof(err), "proc does not accept message type %d", mn_msg_type(&msg));
    return protocol_error(x, MN_EPROTO, err);
  }
  const msgpack_object *args = msg.via.array.size == 4 ? &msg.via.array.ptr[3] : NULL;
  if (mn_get_u64(&msg, 1, &seq) != 0 || mn_get_str(&msg, 2, &kname, &kl) != 0 || args == NULL ||
      args->type != MSGPACK_OBJECT_ARRAY) {
    return protocol_error(x, MN_EPROTO, "malformed CALL: want [20, seq, kernel, args]");
  }
  if (seq <= x->last_seq) { /* a resend of what already ran: the caller replays its result */
    x->dup_seq = seq;
    return 1;
  }
  if (seq != x->last_seq + 1) {
    snprintf(err, sizeof(err), "CALL sequence gap: got %llu after %llu", (unsigned long long)seq,
             (unsigned long long)x->last_seq);
    return protocol_error(x, MN_EPROTO, err);
  }
  x->last_seq = seq;
  if (kl > MN_MAX_NAME) {
    reply_err(x, seq, "bad_args", kname, 64, "kernel name longer than MN_MAX_NAME");
    return 0;
  }
  if (args->via.array.size > MN_MAX_ARGS) {
    snprintf(err, sizeof(err), "%u arguments exceed MN_MAX_ARGS (%d)", args->via.array.size, MN_MAX_ARGS);
    reply_err(x, seq, "bad_args", kname, kl, err);
    return 0;
  }
  /* Asked to stop before it started: answer without running (the caller ends it with mn_cancel_end). */
  if (x->cancels != NULL && mn_cancel_begin(x->cancels, x->session, seq)) {
    reply_err(x, seq, "cancelled", kname, kl, "cancelled before it ran");
    return 0;
  }
  mk_ctx_t ctx = {&api, x->rank, x->world, x->device, NULL, NULL, x};
  char namebuf[MN_MAX_NAME + 1];
  if (kl > 0) memcpy(namebuf, kname, kl); /* an empty str may come with a NULL pointer */
  namebuf[kl] = '\0';
  ctx.kernel = namebuf;
  x->rbuf.len = 0;
  x->nresults = 0;
  x->failed = 0;
  x->ref_ptr = NULL;
  x->ref_len = 0;
  x->errmsg[0] = '\0';
  err[0] = '\0';
  if (kl >= 2 && kname[0] == '_' && kname[1] == '_') {
    x->err_kind = "bad_args";
    if (run_builtin(x, &ctx, kname, kl, args, err, sizeof(err)) != 0 || x->failed)
      reply_err(x, seq, atomic_load(x->cancel) ? "cancelled" : x->err_kind, kname, kl, err[0] ? err : x->errmsg);
    else
      reply_ok(x, seq, kname, kl);
    return 0;
  }
  const mk_kernel_t *k = mn_registry_find(&x->reg, kname, kl);
  if (k == NULL) {
    snprintf(err, sizeof(err), "no kernel named '%s' is loaded%s", namebuf,
             x->reg.nlibs == 0 ? " (no library loaded yet: call mesh:load first)" : "");
    reply_err(x, seq, "unknown_kernel", kname, kl, err);
    return 0;
  }
  mk_arg_t argv[MN_MAX_ARGS];
  if (bind_args(x, k, args, argv, err, sizeof(err)) != 0) {
    reply_err(x, seq, "bad_args", kname, kl, err);
    return 0;
  }
  x->running = k->name;
  rc = k->fn(&ctx, (int)args->via.array.size, argv);
  x->running = NULL;
  scratch_release(x);
  if (rc != 0 || x->failed)
    reply_err(x, seq, atomic_load(x->cancel) ? "cancelled" : "kernel", kname, kl,
              x->errmsg[0] ? x->errmsg : "kernel failed without a message");
  else
    reply_ok(x, seq, kname, kl);
  return 0;
}
