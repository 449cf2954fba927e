/*
 * fuzz_exec.c - libFuzzer target for the proc's CALL path: mn_exec_frame
 * (host/worker/exec.c) with the real basic kernel library loaded, so that
 * CALL decoding, signature checks, argument conversion, the built-ins and
 * the kernels' own argument handling all see hostile input.
 *
 * The library comes from $MONARCH_PREFIX/lib/monarch (default "build";
 * `make fuzz` points it at build-fuzz, where basic.so is instrumented too).
 *
 * The first input byte picks a mode:
 *   even  raw: the rest is a stream of length-prefixed CALL frames (or, if
 *         it does not start with one, a single CALL body), run in order.
 *   odd   structured: up to 32 CALL messages are generated from the bytes:
 *         mostly right sequence numbers, kernel names from the basic
 *         library and the built-ins, arguments of every msgpack type with
 *         edge values, tensor handles to tensors that may or may not exist.
 * Oracle: every reply (with the payload a fetch leaves in x->ref_ptr, as
 * proc.c writes it) is one or more whole frames that decode, a RESULT
 * for the CALL's own sequence number, or an ERROR when mn_exec_frame says
 * the connection must close; a resend (MN_EXEC_ALREADY_RAN) appends nothing.
 *
 * Between inputs every tensor is freed and the session restarts, so inputs
 * do not depend on each other. What the harness will not run (a proc's
 * owner may, on purpose): __load of another library (it could be
 * faulty.so, whose kernels crash by design) and tensors over
 * FUZZ_MAX_TENSOR bytes (memory is the owner's to spend).
 */
#include "exec.h"
#include "fuzz_util.h"

#include <math.h>

#define FUZZ_MAX_TENSOR (1u << 20) /* largest tensor the harness lets a CALL create, bytes */
#define FUZZ_MAX_CALLS 32          /* most generated CALLs per structured input */
#define FUZZ_TENSOR_IDS 4          /* generated tensor handles are 1..4 */

static mn_exec_t x;
static atomic_int cancel = 1; /* sleep returns at once: the kernel honours cancellation */
static int trace;

/* ---- input reader ---------------------------------------------------------- */

typedef struct {
  const uint8_t *p;
  size_t n;
} in_t;

static uint8_t take(in_t *in) {
  if (in->n == 0) return 0;
  in->n--;
  return *in->p++;
}

static uint64_t take64(in_t *in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | take(in);
  return v;
}

/* ---- harness policy ---------------------------------------------------------- */

/* Returns 1 if the body may run; see the file comment for what is skipped. */
static int allowed(const char *body, size_t len) {
  msgpack_zone z;
  msgpack_object m;
  char err[256];
  const char *k, *s;
  size_t kl, sl;
  int ok = 1;
  if (fz_skip_overcount() && fz_overcount(body, len)) return 0; /* known issue F1 */
  if (!msgpack_zone_init(&z, 1024)) return 0;
  if (mn_decode(body, len, &z, &m, err, sizeof(err)) == 0 && m.via.array.size == 4 &&
      mn_get_str(&m, 2, &k, &kl) == 0 && m.via.array.ptr[3].type == MSGPACK_OBJECT_ARRAY) {
    const msgpack_object *args = &m.via.array.ptr[3];
    if (kl == 6 && memcmp(k, "__load", 6) == 0)
      ok = mn_get_str(args, 0, &s, &sl) != 0 || (sl == 5 && memcmp(s, "basic", 5) == 0);
    if (kl == 12 && memcmp(k, "__tensor_new", 12) == 0 && args->via.array.size > 2 &&
        args->via.array.ptr[2].type == MSGPACK_OBJECT_ARRAY) {
      const msgpack_object *sh = &args->via.array.ptr[2];
      double bytes = 8;
      for (uint32_t i = 0; i < sh->via.array.size; i++) {
        const msgpack_object *d = &sh->via.array.ptr[i];
        if (d->type == MSGPACK_OBJECT_POSITIVE_INTEGER) bytes *= (double)d->via.u64;
      }
      ok = bytes <= FUZZ_MAX_TENSOR;
    }
  }
  msgpack_zone_destroy(&z);
  return ok;
}

/* ---- running and checking ---------------------------------------------------- */

/* Runs one CALL body and checks what came out; returns mn_exec_frame's code (0 if skipped). */
static int run_call(const char *body, size_t len) {
  if (!allowed(body, len)) return 0;
  size_t before = x.out.len;
  uint64_t last = x.last_seq;
  int rc = mn_exec_frame(&x, body, len);
  FZ_CHECK(rc == MN_EXEC_DONE || rc == MN_EXEC_ALREADY_RAN || (rc < 0 && rc <= MN_EAGAIN), "mn_exec_frame returned %d", rc);
  if (rc == MN_EXEC_ALREADY_RAN) {
    FZ_CHECK(x.out.len == before, "a resend appended a reply");
    FZ_CHECK(x.dup_seq <= last, "resend of seq %llu beyond last %llu", (unsigned long long)x.dup_seq,
             (unsigned long long)last);
  } else {
    FZ_CHECK(x.out.len > before, "no reply (rc %d)", rc);
  }
  if (x.ref_len > 0) { /* the last RESULT's payload goes out from tensor memory, as proc.c writes it */
    FZ_CHECK(rc == 0 && x.ref_ptr != NULL, "a referenced payload without a RESULT");
    FZ_CHECK(mn_buf_append(&x.out, x.ref_ptr, x.ref_len) == 0, "append");
    x.ref_len = 0;
  }
  size_t off = before;
  msgpack_zone z;
  FZ_CHECK(msgpack_zone_init(&z, 1024), "zone");
  while (off < x.out.len) {
    const char *b;
    msgpack_object m;
    char err[256];
    uint64_t seq;
    int64_t n = mn_frame_peek(x.out.data + off, x.out.len - off, MN_MAX_FRAME, &b);
    FZ_CHECK(n > 0, "reply is not a whole frame (%lld)", (long long)n);
    int drc = mn_decode(b, (size_t)n, &z, &m, err, sizeof(err));
    FZ_CHECK(drc == 0, "reply does not decode: %s", err);
    if (rc < 0) {
      FZ_CHECK(mn_msg_type(&m) == MN_MSG_ERROR, "closing without an ERROR");
    } else {
      FZ_CHECK(mn_msg_type(&m) == MN_MSG_RESULT && m.via.array.size == 4, "reply is not a RESULT");
      FZ_CHECK(mn_get_u64(&m, 1, &seq) == 0 && seq == x.last_seq, "RESULT for seq %llu, ran %llu",
               (unsigned long long)seq, (unsigned long long)x.last_seq);
      FZ_CHECK(m.via.array.ptr[2].type == MSGPACK_OBJECT_BOOLEAN, "RESULT without ok flag");
      if (!m.via.array.ptr[2].via.boolean) {
        const msgpack_object *msg = mn_map_get(&m.via.array.ptr[3], "message");
        FZ_CHECK(msg != NULL && msg->type == MSGPACK_OBJECT_STR && msg->via.str.size > 0,
                 "failed RESULT without a message");
        FZ_CHECK(mn_map_get(&m.via.array.ptr[3], "kind") != NULL, "failed RESULT without a kind");
      }
    }
    if (trace) { /* FUZZ_TRACE=1: what each CALL got back, to read a reproducer */
      fprintf(stderr, "fuzz_exec: seq %llu rc %d -> ", (unsigned long long)x.last_seq, rc);
      msgpack_object_print(stderr, m);
      fputc('\n', stderr);
    }
    off += MN_FRAME_HEADER + (size_t)n;
    msgpack_zone_clear(&z);
  }
  msgpack_zone_destroy(&z);
  x.out.len = 0;
  if (rc < 0) mn_exec_new_session(&x); /* the proc closes the connection; the next one starts afresh */
  return rc;
}

/* Forgets everything an input created, so the next input starts from the same state. */
static void reset(void) {
  mn_registry_t *r = &x.reg;
  for (size_t i = 0; i < r->tcap; i++) {
    mk_tensor_t *t = r->tslots[i];
    if (t != NULL && t != (mk_tensor_t *)r) FZ_CHECK(mn_tensor_free(r, t->id) == 0, "free");
  }
  FZ_CHECK(r->ntensors == 0 && r->tensor_bytes == 0, "tensor accounting off after freeing all");
  x.out.len = 0;
  mn_exec_new_session(&x);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *prefix = getenv("MONARCH_PREFIX");
  static const char load[] = "\x94\x14\x01\xa6__load\x91\xa5" "basic";
  const char *t = getenv("FUZZ_TRACE");
  trace = t != NULL && strcmp(t, "1") == 0;
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  FZ_CHECK(mn_exec_init(&x, prefix ? prefix : "build", 0, 1, &cancel) == 0, "mn_exec_init");
  FZ_CHECK(mn_exec_frame(&x, load, sizeof(load) - 1) == 0, "load");
  FZ_CHECK(x.out.len > 8 && (unsigned char)x.out.data[MN_FRAME_HEADER + 3] == 0xc3,
           "cannot load the basic library from %s/lib/monarch: %.*s", prefix ? prefix : "build",
           (int)x.out.len, x.out.data);
  reset();
  return 0;
}

/* ---- structured generation ---------------------------------------------------- */

static const char *const kernels[] = {
    "noop", "echo", "rank", "fill", "iota", "axpy", "scale", "sum", "dot", "sgemm", "sleep",
    "__tensor_new", "__tensor_free", "__tensor_fetch", "__tensor_put", "__kernels", "__info", "__load",
    "__nope", "__", "nosuch", "",
};
#define NKERNELS (sizeof(kernels) / sizeof(kernels[0]))
static const char *const dtypes[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8", "f8", ""};
static const uint8_t dsize[] = {4, 8, 2, 2, 4, 8, 1, 0, 0};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

static size_t nbytes_hint[FUZZ_TENSOR_IDS + 1]; /* bytes of the tensors this input asked for */

static void pack_tensor(msgpack_packer *pk, uint64_t id) {
  char b[8];
  for (int i = 0; i < 8; i++) b[i] = (char)(id >> (56 - 8 * i));
  msgpack_pack_ext(pk, 8, 1);
  msgpack_pack_ext_body(pk, b, 8);
}

static void pack_str(msgpack_packer *pk, in_t *in, size_t n, int bin) {
  char buf[256];
  if (n > sizeof(buf)) n = sizeof(buf);
  for (size_t i = 0; i < n; i++) buf[i] = (char)take(in);
  if (bin) {
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, buf, n);
  } else {
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, buf, n);
  }
}

/* One argument of any type, edge values included; depth bounds nesting. */
static void pack_arg(msgpack_packer *pk, in_t *in, int depth) {
  static const double floats[] = {0.0, -0.0, 0.5, -1.0, 1e300, -1e300, 9.3e18, -9.3e18, 3.0, 86401.0};
  static const int64_t ints[] = {0, 1, -1, 2, 7, 64, 255, 256, 65536, INT32_MAX, INT64_MAX, INT64_MIN};
  uint8_t t = take(in);
  switch (t % 16) {
  case 0: msgpack_pack_nil(pk); break;
  case 1: if (t & 16) msgpack_pack_true(pk); else msgpack_pack_false(pk); break;
  case 2: msgpack_pack_int64(pk, ints[(t >> 4) % 12]); break;
  case 3: msgpack_pack_uint64(pk, take64(in)); break;
  case 4: msgpack_pack_int64(pk, (int64_t)take64(in)); break;
  case 5: msgpack_pack_double(pk, floats[(t >> 4) % 10]); break;
  case 6: msgpack_pack_double(pk, (t & 16) ? NAN : (t & 32) ? INFINITY : -INFINITY); break;
  case 7: msgpack_pack_float(pk, (float)(int8_t)take(in) / 4.0f); break;
  case 8: pack_str(pk, in, take(in) % 24, 0); break;
  case 9: pack_str(pk, in, take(in) % 24, 1); break;
  case 10: pack_tensor(pk, 1 + (t >> 4) % FUZZ_TENSOR_IDS); break;
  case 11: pack_tensor(pk, (t & 16) ? 0 : take64(in)); break;
  case 12: { /* an ext that is not a tensor handle */
    char b[9] = {0};
    uint8_t sz = (t >> 4) % 10;
    msgpack_pack_ext(pk, sz, (int8_t)((t & 16) ? 1 : 7));
    msgpack_pack_ext_body(pk, b, sz);
    break;
  }
  case 13: msgpack_pack_uint64(pk, 1 + (t >> 4) % FUZZ_TENSOR_IDS); break; /* a tensor id as an integer */
  case 14:
  case 15: {
    uint8_t n = depth < 3 ? take(in) % 5 : 0;
    if (t % 16 == 14) {
      msgpack_pack_array(pk, n);
      for (uint8_t i = 0; i < n; i++) pack_arg(pk, in, depth + 1);
    } else {
      msgpack_pack_map(pk, n);
      for (uint8_t i = 0; i < n; i++) {
        pack_str(pk, in, take(in) % 6, 0);
        pack_arg(pk, in, depth + 1);
      }
    }
    break;
  }
  }
}

/* Arguments for __tensor_new and __tensor_put that usually make sense. */
static int pack_builtin_args(msgpack_packer *pk, in_t *in, const char *k) {
  uint8_t t = take(in);
  if (t & 128) return 0; /* let the generic arguments go instead */
  uint64_t id = 1 + t % FUZZ_TENSOR_IDS;
  if (strcmp(k, "__tensor_new") == 0) {
    size_t d = take(in) % NDTYPES, ndim = take(in) % 5;
    size_t bytes = dsize[d];
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint64(pk, id);
    mn_pack_cstr(pk, dtypes[d]);
    msgpack_pack_array(pk, ndim);
    for (size_t i = 0; i < ndim; i++) {
      uint8_t e = take(in);
      int64_t dim = e < 250 ? e % 24 : e == 250 ? -1 : e == 251 ? INT64_MAX : (int64_t)1 << 40;
      msgpack_pack_int64(pk, dim);
      bytes *= dim >= 0 && dim < 24 ? (size_t)dim : 0;
    }
    nbytes_hint[id] = bytes;
    return 1;
  }
  if (strcmp(k, "__tensor_put") == 0) {
    size_t n = nbytes_hint[id] + ((t & 64) ? take(in) % 3 : 0);
    char buf[FUZZ_MAX_TENSOR / 64];
    if (n > sizeof(buf)) n = sizeof(buf);
    memset(buf, take(in), n);
    msgpack_pack_array(pk, 2);
    pack_tensor(pk, id);
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, buf, n);
    return 1;
  }
  return 0;
}

static void structured(in_t *in) {
  mn_buf_t b;
  msgpack_packer pk;
  uint64_t seq = 0;
  char longname[MN_MAX_NAME + 8];
  memset(longname, 'k', sizeof(longname));
  memset(nbytes_hint, 0, sizeof(nbytes_hint));
  mn_buf_init(&b);
  msgpack_packer_init(&pk, &b, mn_buf_write_cb);
  for (int c = 0; c < FUZZ_MAX_CALLS && in->n > 0; c++) {
    uint8_t h = take(in);
    b.len = 0;
    /* Sequence: usually the next one; sometimes a resend, a gap or zero. */
    uint64_t s = (h & 7) == 7 ? (h & 8 ? seq : seq + 2) : (h & 15) == 14 ? 0 : seq + 1;
    size_t nfields = (h & 0x30) == 0x30 ? 3 + (h >> 6) % 3 : 4; /* sometimes malformed */
    uint8_t kk = take(in);
    msgpack_pack_array(&pk, nfields);
    msgpack_pack_int(&pk, (kk & 0xf0) == 0xf0 ? MN_MSG_PING : MN_MSG_CALL);
    msgpack_pack_uint64(&pk, s);
    const char *k = kernels[kk % NKERNELS];
    if (kk % 61 == 60) { /* longer than MN_MAX_NAME */
      msgpack_pack_str(&pk, sizeof(longname));
      msgpack_pack_str_body(&pk, longname, sizeof(longname));
    } else {
      mn_pack_cstr(&pk, k);
    }
    if (nfields > 3 && !pack_builtin_args(&pk, in, k)) {
      uint8_t na = take(in);
      size_t n = na == 255 ? MN_MAX_ARGS + 1 : na % 9;
      msgpack_pack_array(&pk, n);
      for (size_t i = 0; i < n; i++) pack_arg(&pk, in, 0);
    }
    for (size_t i = 4; i < nfields; i++) msgpack_pack_nil(&pk);
    int rc = run_call(b.data, b.len);
    if (rc == 0 && x.last_seq == s) seq = s;
    if (rc < 0) seq = 0;
  }
  mn_buf_free(&b);
}

static void raw(in_t *in) {
  while (in->n > 0) {
    const char *body;
    int64_t n = mn_frame_peek((const char *)in->p, in->n, in->n, &body);
    if (n <= 0) { /* not a frame stream: the rest is one body */
      run_call((const char *)in->p, in->n);
      return;
    }
    run_call(body, (size_t)n);
    in->p += MN_FRAME_HEADER + (size_t)n;
    in->n -= MN_FRAME_HEADER + (size_t)n;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  in_t in = {data, size};
  if (size == 0) return 0;
  if (take(&in) & 1) structured(&in);
  else raw(&in);
  reset();
  return 0;
}
