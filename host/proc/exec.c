/* exec.c - the proc's CALL executor; see exec.h. */
#include "exec.h"
#include "exec_int.h"
#include "sig.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MN_EXT_TENSOR 1 /* msgpack ext type of a tensor handle: 8-byte big-endian id */

/* ---- the mk_api_t kernels see -------------------------------------------- */
/* These are the kernel ABI (monarch_kernel.h), not err.h: they fail with -1, or msgpack-c's nonzero. */

static mn_exec_t *X(mk_ctx_t *ctx) { return (mn_exec_t *)ctx->host; }

static int count_result(mn_exec_t *x) {
  if (x->nresults >= MN_MAX_RESULTS) {
    snprintf(x->errmsg, sizeof(x->errmsg), "kernel returned more than MN_MAX_RESULTS (%d) values",
             MN_MAX_RESULTS);
    x->failed = 1;
    return MN_ELIMIT;
  }
  x->nresults++;
  return 0;
}

static int api_nil(mk_ctx_t *c) {
  if (count_result(X(c)) != 0) return -1;
  return msgpack_pack_nil(&X(c)->rpk);
}
static int api_bool(mk_ctx_t *c, int b) {
  if (count_result(X(c)) != 0) return -1;
  return b ? msgpack_pack_true(&X(c)->rpk) : msgpack_pack_false(&X(c)->rpk);
}
static int api_int(mk_ctx_t *c, int64_t i) {
  if (count_result(X(c)) != 0) return -1;
  return msgpack_pack_int64(&X(c)->rpk, i);
}
static int api_number(mk_ctx_t *c, double d) {
  if (count_result(X(c)) != 0) return -1;
  return msgpack_pack_double(&X(c)->rpk, d);
}
static int api_string(mk_ctx_t *c, const char *s, size_t n) {
  if (count_result(X(c)) != 0) return -1;
  msgpack_pack_str(&X(c)->rpk, n);
  return msgpack_pack_str_body(&X(c)->rpk, s, n);
}
static int api_bytes(mk_ctx_t *c, const void *p, size_t n) {
  if (count_result(X(c)) != 0) return -1;
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
/* Blocks stay valid until the kernel returns (scratch.h). */
static void *api_scratch(mk_ctx_t *c, size_t n) { return mn_scratch_get(&X(c)->scratch, n); }
static int api_cancelled(mk_ctx_t *c) { return atomic_load(X(c)->cancel) != 0; }

int mn__exec_return_ref(mn_exec_t *x, const void *p, size_t n) {
  int rc = count_result(x);
  if (rc != 0) return rc;
  /* Only the bin header is packed; reply_ok writes the bytes from p itself. */
  msgpack_pack_bin(&x->rpk, n);
  x->ref_ptr = (const char *)p;
  x->ref_len = n;
  return 0;
}

static const mk_api_t api = {api_nil, api_bool, api_int, api_number, api_string,
                             api_bytes, api_error, api_scratch, api_cancelled,
                             mn__exec_api_all_reduce, mn__exec_api_broadcast, mn__exec_api_all_gather,
                             mn__exec_api_reduce_scatter, mn__exec_api_barrier};

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
  size_t start = mn_msg_result_head(&x->out, &pk, seq, 1);
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
  x->replied_err = 1;
  size_t start = mn_msg_result_head(&x->out, &pk, seq, 0);
  mn_msg_pack_failure(&pk, kind, msg, kernel, klen);
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

int mn__exec_tensor_id(const msgpack_object *o, uint64_t *id) {
  if (o->type != MSGPACK_OBJECT_EXT || o->via.ext.type != MN_EXT_TENSOR || o->via.ext.size != 8) return MN_EINVAL;
  const unsigned char *p = (const unsigned char *)o->via.ext.ptr;
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
  *id = v;
  return 0;
}

/*
 * Converts argument i from msgpack, then to what signature letter `want`
 * asks for (sig.c). Returns 0, or with a message in err naming the argument:
 * MN_ENOTFOUND for a tensor this proc does not hold, else MN_EINVAL.
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
    if (mn__exec_tensor_id(o, &id) != 0) {
      snprintf(err, errlen, "argument %d: unknown extension value", i + 1);
      return MN_EINVAL;
    }
    a->type = MK_ARG_TENSOR;
    a->v.tensor = mn_tensor_get(&x->reg, id);
    if (a->v.tensor == NULL) {
      snprintf(err, errlen, "argument %d: tensor %llu does not exist on this proc (freed?)", i + 1,
               (unsigned long long)id);
      return MN_ENOTFOUND;
    }
    break;
  default:
    snprintf(err, errlen, "argument %d: a %s cannot be passed to a kernel", i + 1, obj_type_name(o));
    return MN_EINVAL;
  }
  if (want == 'g') return mn__exec_group_arg(x, a, i, obj_type_name(o), err, errlen);
  return mn_sig_coerce(a, want, i + 1, obj_type_name(o), err, errlen);
}

/* Checks args against a signature and converts them; 0, or convert_arg's or mn_sig_*'s code with err. */
static int bind_args(mn_exec_t *x, const mk_kernel_t *k, const msgpack_object *args, mk_arg_t *argv,
                     char *err, size_t errlen) {
  mn_sig_t sig;
  int n = (int)args->via.array.size;
  mn_sig_parse(&sig, k->signature);
  int rc = mn_sig_check_count(&sig, n, err, errlen);
  for (int i = 0; rc == 0 && i < n; i++)
    rc = convert_arg(x, &args->via.array.ptr[i], mn_sig_letter(&sig, i), i, &argv[i], err, errlen);
  if (rc != 0) mn__exec_bind_failed(x, err);
  return rc;
}

/* ---- built-ins: one table per module, looked up by name ------------------------ */

static struct {
  const mn_builtin_module_t *m;
  size_t plen; /* strlen(m->prefix), so a lookup does not measure it again */
} modules[MN_MAX_BUILTIN_MODULES];
static int nmodules;

int mn_exec_register(const mn_builtin_module_t *m) {
  if (nmodules == MN_MAX_BUILTIN_MODULES) return MN_ELIMIT;
  modules[nmodules].m = m;
  modules[nmodules].plen = strlen(m->prefix);
  nmodules++;
  return 0;
}

const char *mn_exec_builtin_names(const mn_builtin_module_t *m, size_t strip, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (int i = 0; i < m->count && at < len; i++) {
    const char *n = m->entries[i].name;
    if (i > 0) n += strlen(n) > strip ? strip : strlen(n);
    int w = snprintf(buf + at, len - at, "%s%s", i > 0 ? ", " : "", n);
    if (w < 0) break;
    at += (size_t)w;
  }
  return buf;
}

/* The module a "__" name belongs to: the registered one whose prefix it
 * has, else the executor's own (exec_builtins.c). */
static const mn_builtin_module_t *module_of(const char *name, size_t nl) {
  for (int i = 0; i < nmodules; i++)
    if (nl >= modules[i].plen && memcmp(name, modules[i].m->prefix, modules[i].plen) == 0) return modules[i].m;
  return &mn__exec_builtins;
}

/* Runs a "__" built-in; returns 0, or its code (MN_ENOTFOUND: no such built-in) with err. Results go to rbuf. */
static int run_builtin(mn_exec_t *x, mk_ctx_t *ctx, const char *name, size_t nl,
                       const msgpack_object *args, char *err, size_t errlen) {
  const mn_builtin_module_t *m = module_of(name, nl);
  for (int i = 0; i < m->count; i++) {
    const mn_builtin_t *b = &m->entries[i];
    if (strlen(b->name) == nl && memcmp(b->name, name, nl) == 0) return b->fn(x, ctx, b, args, err, errlen);
  }
  if (m->unknown != NULL)
    m->unknown(m, name, nl, err, errlen);
  else
    snprintf(err, errlen, "unknown built-in '%.*s'", (int)nl, name);
  return MN_ENOTFOUND;
}

/* ---- the CALL path --------------------------------------------------------- */

int mn_exec_init(mn_exec_t *x, const char *prefix, int rank, int world, atomic_int *cancel) {
  memset(x, 0, sizeof(*x));
  mn_trace_init(&x->trace, rank);
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
  mn_scratch_close(&x->scratch);
  msgpack_zone_destroy(&x->zone);
  mn_trace_close(&x->trace);
}

static int protocol_error(mn_exec_t *x, int code, const char *msg) {
  mn_msg_pack_error(&x->out, code, msg);
  return code;
}

/* Empties the results and error of the previous call. */
static void reset_results(mn_exec_t *x) {
  x->rbuf.len = 0;
  x->nresults = 0;
  x->failed = 0;
  x->ref_ptr = NULL;
  x->ref_len = 0;
  x->errmsg[0] = '\0';
  x->nkgroups = 0;
  x->kcoll_kind = NULL;
}

/* mn_exec_frame without the timeline. */
/* Takes CALL seq in order: MN_EXEC_DONE, MN_EXEC_ALREADY_RAN for a resend (the caller replays
 * its result), or a protocol error for a gap. */
static int take_seq(mn_exec_t *x, uint64_t seq) {
  if (seq <= x->last_seq) {
    x->dup_seq = seq;
    return MN_EXEC_ALREADY_RAN;
  }
  if (seq != x->last_seq + 1) {
    char err[96];
    snprintf(err, sizeof(err), "CALL sequence gap: got %llu after %llu", (unsigned long long)seq,
             (unsigned long long)x->last_seq);
    return protocol_error(x, MN_EPROTO, err);
  }
  x->last_seq = seq;
  return MN_EXEC_DONE;
}

static int exec_frame(mn_exec_t *x, const char *body, size_t len) {
  msgpack_object msg;
  char err[MN_MAX_ERRMSG];
  mn_msg_call_t call;
  msgpack_zone_clear(&x->zone);
  int rc = mn_decode(body, len, &x->zone, &msg, err, sizeof(err));
  if (rc != 0) return protocol_error(x, rc, err);
  if (mn_msg_type(&msg) != MN_MSG_CALL) {
    snprintf(err, sizeof(err), "proc does not accept message type %d", mn_msg_type(&msg));
    return protocol_error(x, MN_EPROTO, err);
  }
  if (mn_msg_parse_call(&msg, &call, err, sizeof(err)) != 0) return protocol_error(x, MN_EPROTO, err);
  const uint64_t seq = call.seq;
  const char *kname = call.kernel;
  const size_t kl = call.kernel_len;
  const msgpack_object *args = call.args;
  x->call_name = kname;
  x->call_len = kl;
  x->call_args = args;
  if ((rc = take_seq(x, seq)) != MN_EXEC_DONE) return rc;
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
  reset_results(x);
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
  if (x->nkgroups > 0) mn__exec_kernel_groups_done(x, namebuf, rc != 0);
  x->running = NULL;
  mn_scratch_release(&x->scratch);
  if (rc != 0 || x->failed)
    reply_err(x, seq, atomic_load(x->cancel) ? "cancelled" : x->kcoll_kind ? x->kcoll_kind : "kernel", kname, kl,
              x->errmsg[0] ? x->errmsg : "kernel failed without a message");
  else
    reply_ok(x, seq, kname, kl);
  return 0;
}

/* ---- the timeline ------------------------------------------------------------- */

/* Bytes of the tensors among a call's arguments (that still exist once it ran). */
static uint64_t tensor_bytes(mn_exec_t *x, const msgpack_object *args) {
  uint64_t n = 0, id;
  for (uint32_t i = 0; i < args->via.array.size; i++) {
    if (mn__exec_tensor_id(&args->via.array.ptr[i], &id) != 0) continue;
    const mk_tensor_t *t = mn_tensor_get(&x->reg, id);
    if (t != NULL) n += t->nbytes;
  }
  return n;
}

/* A frame while tracing: the call, then its span. Resends, protocol errors and __trace itself have none. */
static int traced_frame(mn_exec_t *x, const char *body, size_t len) {
  mn_trace_t *t = &x->trace;
  size_t before = x->out.len;
  int64_t t0 = mn_trace_now(t);
  x->call_name = NULL;
  x->replied_err = 0;
  t->label_len = 0;
  int rc = exec_frame(x, body, len);
  if (rc != MN_EXEC_DONE || x->call_name == NULL || !t->on || (x->call_len == 7 && memcmp(x->call_name, "__trace", 7) == 0))
    return rc;
  mn_trace_span_t *s = t->label_len > 0 ? mn_trace_push(t, (mn_trace_kind_t)t->label_kind, t->label, t->label_len, t0)
                                        : mn_trace_push(t, MN_TRACE_CALL, x->call_name, x->call_len, t0);
  s->seq = x->last_seq;
  s->failed = (uint8_t)x->replied_err;
  s->bytes_in = (uint32_t)len;
  s->bytes_out = (uint32_t)(x->out.len - before + x->ref_len);
  s->tensor_bytes = tensor_bytes(x, x->call_args);
  return rc;
}

int mn_exec_frame(mn_exec_t *x, const char *body, size_t len) {
  if (x->trace.on) return traced_frame(x, body, len);
  return exec_frame(x, body, len);
}
