/*
 * test_exec.c - unit tests for host/proc/exec.c, the proc's CALL executor:
 * loading libraries, kernels and the checks of their arguments, cancel,
 * sequencing and protocol errors, and the table of built-in modules. The
 * executor's tensors and the registry are in test_exec_tensors.c,
 * signatures and scratch in test_sig.c; the fixture in exec_fixture.h.
 */
#include "exec_fixture.h"

/* ---- library loading ---------------------------------------------------------- */

static void test_load(void **state) {
  fix_t *f = *state;
  reply_t r;
  /* Before anything is loaded, a kernel is unknown and the hint says why. */
  uint64_t seq = call0(f, "noop", &r);
  expect_fail(&r, seq, "unknown_kernel", "noop", "noop", "no library loaded");
  reply_free(&r);

  load_ok(f, "basic");
  assert_int_equal(f->x.reg.nlibs, 1);
  /* Loading again is a no-op that answers the same. */
  load_ok(f, "basic");
  assert_int_equal(f->x.reg.nlibs, 1);

  /* Unknown library: bad_args naming it. */
  seq = call_str(f, "__load", "no_such_library_xyz", &r);
  expect_fail(&r, seq, "bad_args", "__load", "no_such_library_xyz", NULL);
  reply_free(&r);
  /* Bad names. */
  seq = call_str(f, "__load", "", &r);
  expect_fail(&r, seq, "bad_args", "__load", NULL, NULL);
  reply_free(&r);
  {
    char longname[MN_MAX_NAME + 2];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    seq = call_str(f, "__load", longname, &r);
    expect_fail(&r, seq, "bad_args", "__load", NULL, NULL);
    reply_free(&r);
  }
  seq = call_id(f, "__load", 5, &r);
  expect_fail(&r, seq, "bad_args", "__load", NULL, NULL);
  reply_free(&r);
  /* A path that is a file but not a kernel library. */
  seq = call_str(f, "__load", "/etc/hostname", &r);
  expect_fail(&r, seq, "bad_args", "__load", NULL, NULL);
  reply_free(&r);
  assert_int_equal(f->x.reg.nlibs, 1);

  /* With a library loaded, an unknown kernel has no "load first" hint. */
  seq = call0(f, "no_such_kernel", &r);
  expect_fail(&r, seq, "unknown_kernel", "no_such_kernel", "no_such_kernel", NULL);
  {
    const msgpack_object *m = mn_map_get(&r.obj.via.array.ptr[3], "message");
    char buf[512];
    snprintf(buf, sizeof(buf), "%.*s", (int)m->via.str.size, m->via.str.ptr);
    assert_null(strstr(buf, "no library loaded"));
  }
  reply_free(&r);

  /* __kernels lists what is loaded. */
  seq = call0(f, "__kernels", &r);
  const msgpack_object *v = expect_ok(&r, seq);
  int seen_noop = 0, seen_echo = 0;
  for (uint32_t i = 0; i < v->via.array.size; i++) {
    const msgpack_object *k = &v->via.array.ptr[i];
    assert_int_equal(k->type, MSGPACK_OBJECT_STR);
    if (k->via.str.size == 4 && memcmp(k->via.str.ptr, "noop", 4) == 0) seen_noop++;
    if (k->via.str.size == 4 && memcmp(k->via.str.ptr, "echo", 4) == 0) seen_echo++;
  }
  assert_int_equal(seen_noop, 1);
  assert_int_equal(seen_echo, 1);
  assert_int_equal(v->via.array.size, (uint32_t)f->x.reg.libs[0]->count);
  reply_free(&r);

  /* An unknown built-in. */
  seq = call0(f, "__nonsense", &r);
  expect_fail(&r, seq, "bad_args", "__nonsense", "__nonsense", NULL);
  reply_free(&r);
}

/* ---- kernels and argument checking ---------------------------------------------- */

static void test_noop(void **state) {
  fix_t *f = *state;
  reply_t r;
  load_ok(f, "basic");
  uint64_t seq = call0(f, "noop", &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 0);
  reply_free(&r);
}

/* echo returns every kind of value unchanged. */
static void test_echo_values(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  static const char binv[] = {0, 1, (char)0xfe};
  load_ok(f, "basic");
  uint64_t seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "echo", 10);
  msgpack_pack_int64(pk, 42);
  msgpack_pack_int64(pk, -7);
  msgpack_pack_int64(pk, INT64_MIN);
  msgpack_pack_double(pk, 2.5);
  mn_pack_cstr(pk, "hello");
  msgpack_pack_nil(pk);
  msgpack_pack_true(pk);
  msgpack_pack_false(pk);
  pack_bin(pk, binv, sizeof(binv));
  mn_pack_cstr(pk, "");
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 10);
  const msgpack_object *e = v->via.array.ptr;
  assert_int_equal(e[0].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
  assert_int_equal(e[0].via.u64, 42);
  assert_int_equal(e[1].type, MSGPACK_OBJECT_NEGATIVE_INTEGER);
  assert_int_equal(e[1].via.i64, -7);
  assert_int_equal(e[2].type, MSGPACK_OBJECT_NEGATIVE_INTEGER);
  assert_true(e[2].via.i64 == INT64_MIN);
  assert_int_equal(e[3].type, MSGPACK_OBJECT_FLOAT64);
  assert_true(e[3].via.f64 == 2.5);
  assert_int_equal(e[4].type, MSGPACK_OBJECT_STR);
  assert_int_equal(e[4].via.str.size, 5);
  assert_memory_equal(e[4].via.str.ptr, "hello", 5);
  assert_int_equal(e[5].type, MSGPACK_OBJECT_NIL);
  assert_int_equal(e[6].type, MSGPACK_OBJECT_BOOLEAN);
  assert_true(e[6].via.boolean);
  assert_int_equal(e[7].type, MSGPACK_OBJECT_BOOLEAN);
  assert_false(e[7].via.boolean);
  assert_int_equal(e[8].type, MSGPACK_OBJECT_BIN);
  assert_int_equal(e[8].via.bin.size, sizeof(binv));
  assert_memory_equal(e[8].via.bin.ptr, binv, sizeof(binv));
  assert_int_equal(e[9].type, MSGPACK_OBJECT_STR);
  assert_int_equal(e[9].via.str.size, 0);
  reply_free(&r);
}

static void test_echo_empty_and_rank(void **state) {
  fix_t *f = *state;
  reply_t r;
  load_ok(f, "basic");
  /* echo with no arguments returns nothing. */
  uint64_t seq = call0(f, "echo", &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 0);
  reply_free(&r);

  /* rank reports the rank and world given to mn_exec_init. */
  seq = call0(f, "rank", &r);
  v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 2);
  assert_int_equal(as_number(&v->via.array.ptr[0]), 3);
  assert_int_equal(as_number(&v->via.array.ptr[1]), 8);
  reply_free(&r);
}

static void test_kernel_refuses_tables_and_ext(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_ok(f, "basic");
  /* A table cannot be passed to a kernel. */
  uint64_t seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "echo", 1);
  msgpack_pack_array(pk, 0);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "echo", "argument 1", NULL);
  reply_free(&r);
  /* Nor an ext value that is not a tensor handle. */
  seq = ++f->seq;
  pk = call_begin(&c, seq, "echo", 2);
  msgpack_pack_nil(pk);
  msgpack_pack_ext(pk, 2, 9);
  msgpack_pack_ext_body(pk, "ab", 2);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "echo", "argument 2", NULL);
  reply_free(&r);
}

/* The argument-checking tests run on the basic library and tensor 7, f32[4]. */
static void load_with_tensor(fix_t *f) {
  int64_t shape[1] = {4};
  load_ok(f, "basic");
  tensor_new_ok(f, 7, "f32", 1, shape);
}

static void test_bad_arg_count(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_with_tensor(f);
  uint64_t seq = call_t1(f, "fill", 7, &r);
  expect_fail(&r, seq, "bad_args", "fill", "expected 2 arguments", "got 1");
  reply_free(&r);
  seq = call_str(f, "noop", "extra", &r);
  expect_fail(&r, seq, "bad_args", "noop", "expected 0 arguments", NULL);
  reply_free(&r);
  seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "sum", 2);
  pack_tensor(pk, 7);
  pack_tensor(pk, 7);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "sum", "expected 1 argument", NULL);
  reply_free(&r);
  /* Optional arguments: iota takes 1 to 2. */
  seq = ++f->seq;
  pk = call_begin(&c, seq, "iota", 3);
  pack_tensor(pk, 7);
  msgpack_pack_int(pk, 1);
  msgpack_pack_int(pk, 2);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "iota", "expected 1 to 2 arguments", NULL);
  reply_free(&r);
  seq = call_t1(f, "iota", 7, &r);
  expect_ok(&r, seq);
  reply_free(&r);
}

static void test_bad_arg_types(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_with_tensor(f);
  uint64_t seq = call_str(f, "sum", "not a tensor", &r);
  expect_fail(&r, seq, "bad_args", "sum", "argument 1", "expected tensor");
  reply_free(&r);
  seq = call_id(f, "sum", 7, &r); /* a bare integer is not a tensor */
  expect_fail(&r, seq, "bad_args", "sum", "argument 1", "expected tensor");
  reply_free(&r);
  seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "fill", 2);
  pack_tensor(pk, 7);
  mn_pack_cstr(pk, "1.5");
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "fill", "argument 2", "expected number");
  reply_free(&r);
  seq = ++f->seq;
  pk = call_begin(&c, seq, "sleep", 1);
  msgpack_pack_true(pk);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "sleep", "argument 1", "expected number");
  reply_free(&r);
  /* An integer where a number is wanted is converted, not refused. */
  seq = ++f->seq;
  pk = call_begin(&c, seq, "fill", 2);
  pack_tensor(pk, 7);
  msgpack_pack_int(pk, 3);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_ok(&r, seq);
  reply_free(&r);
}

/* Too many arguments for the protocol, and too long a name. */
static void test_arg_limits(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_with_tensor(f);
  uint64_t seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "echo", MN_MAX_ARGS + 1);
  for (int i = 0; i < MN_MAX_ARGS + 1; i++) msgpack_pack_int(pk, i);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "echo", "MN_MAX_ARGS", NULL);
  reply_free(&r);
  seq = ++f->seq;
  pk = call_begin(&c, seq, "echo", MN_MAX_ARGS);
  for (int i = 0; i < MN_MAX_ARGS; i++) msgpack_pack_int(pk, i);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  assert_int_equal(expect_ok(&r, seq)->via.array.size, MN_MAX_ARGS);
  reply_free(&r);
  {
    char longname[MN_MAX_NAME + 2];
    memset(longname, 'k', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    seq = call0(f, longname, &r);
    expect_fail(&r, seq, "bad_args", NULL, "MN_MAX_NAME", NULL);
    reply_free(&r);
  }
}

/* A kernel that fails reports kind "kernel" with its own message. */
static void test_kernel_error(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_with_tensor(f);
  uint64_t seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "sleep", 1);
  msgpack_pack_double(pk, -1.0);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "kernel", "sleep", "seconds must be", NULL);
  reply_free(&r);
}

static void test_cancel(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_ok(f, "basic");
  atomic_store(&f->cancel, 1);
  uint64_t seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "sleep", 1);
  msgpack_pack_double(pk, 30.0);
  assert_int_equal(call_run(&f->x, &c), 0); /* returns promptly, not after 30 s */
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "cancelled", "sleep", "cancelled", NULL); /* a stopped kernel fails as cancelled, not as its own error */
  reply_free(&r);
  atomic_store(&f->cancel, 0);
  seq = ++f->seq;
  pk = call_begin(&c, seq, "sleep", 1);
  msgpack_pack_double(pk, 0.0);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_ok(&r, seq);
  reply_free(&r);
}

static void test_faulty_fail(void **state) {
  fix_t *f = *state;
  reply_t r;
  load_ok(f, "faulty");
  uint64_t seq = call_str(f, "fail", "exactly this message", &r);
  expect_fail(&r, seq, "kernel", "fail", "exactly this message", NULL);
  {
    const msgpack_object *m = mn_map_get(&r.obj.via.array.ptr[3], "message");
    assert_int_equal(m->via.str.size, strlen("exactly this message"));
  }
  reply_free(&r);
  /* A very long kernel message is cut to MN_MAX_ERRMSG, not overflowed. */
  char *huge = malloc(5000);
  assert_non_null(huge);
  memset(huge, 'm', 4999);
  huge[4999] = '\0';
  seq = call_str(f, "fail", huge, &r);
  free(huge);
  expect_fail(&r, seq, "kernel", "fail", "mmmm", NULL);
  {
    const msgpack_object *m = mn_map_get(&r.obj.via.array.ptr[3], "message");
    assert_true(m->via.str.size < MN_MAX_ERRMSG);
  }
  reply_free(&r);
  /* An 'i' argument takes only integral values: a fractional, huge or NaN
   * number is refused before the kernel runs (here exit(code), which would
   * end this test program if it ran). */
  static const double not_ints[] = {2.5, -0.5, 1e300, -1e300, 9.3e18};
  for (size_t i = 0; i < sizeof(not_ints) / sizeof(not_ints[0]) + 2; i++) {
    call_t c;
    seq = ++f->seq;
    msgpack_packer *pk = call_begin(&c, seq, "exit", 1);
    if (i < sizeof(not_ints) / sizeof(not_ints[0])) msgpack_pack_double(pk, not_ints[i]);
    else if (i == sizeof(not_ints) / sizeof(not_ints[0])) msgpack_pack_double(pk, NAN);
    else mn_pack_cstr(pk, "0");
    assert_int_equal(call_run(&f->x, &c), 0);
    take_reply(&f->x, &r);
    expect_fail(&r, seq, "bad_args", "exit", "argument 1", "expected integer");
    reply_free(&r);
  }
  /* The proc carries on. */
  seq = call0(f, "__kernels", &r);
  expect_ok(&r, seq);
  reply_free(&r);
}

/* ---- sequencing and protocol errors ------------------------------------------------ */

static void test_sequence(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_ok(f, "basic"); /* seq 1 */
  uint64_t seq = call0(f, "noop", &r); /* seq 2 */
  expect_ok(&r, seq);
  reply_free(&r);

  /* Resends (seq <= last) run nothing: the caller replays their cached result. */
  for (uint64_t dup = 0; dup <= 2; dup++) {
    call_begin(&c, dup, "noop", 0);
    assert_int_equal(call_run(&f->x, &c), MN_EXEC_ALREADY_RAN);
    assert_int_equal(f->x.dup_seq, dup);
    assert_int_equal(f->x.out.len, 0);
  }
  assert_int_equal(f->x.last_seq, 2);

  /* A gap is a protocol violation. */
  call_begin(&c, 4, "noop", 0);
  assert_true(call_run(&f->x, &c) < 0);
  expect_error_frame(&f->x, MN_EPROTO, "gap");
  assert_int_equal(f->x.last_seq, 2); /* nothing ran */

  /* The next in order still runs. */
  seq = call0(f, "noop", &r); /* seq 3 */
  assert_int_equal(seq, 3);
  expect_ok(&r, seq);
  reply_free(&r);
  assert_int_equal(f->x.last_seq, 3);

  /* A failed call consumes its sequence number too. */
  seq = call0(f, "no_such_kernel", &r); /* seq 4 */
  expect_fail(&r, seq, "unknown_kernel", "no_such_kernel", NULL, NULL);
  reply_free(&r);
  assert_int_equal(f->x.last_seq, 4);
  call_begin(&c, 4, "noop", 0);
  assert_int_equal(call_run(&f->x, &c), 1); /* a resend: replayed by the caller, not run */
  assert_int_equal(f->x.out.len, 0);
}

static void test_protocol_errors(void **state) {
  fix_t *f = *state;
  reply_t r;
  mn_buf_t b;
  msgpack_packer pk;
  load_ok(f, "basic"); /* seq 1 */

  /* A message type the proc does not take. */
  mn_buf_init(&b);
  msgpack_packer_init(&pk, &b, mn_buf_write_cb);
  msgpack_pack_array(&pk, 2);
  msgpack_pack_int(&pk, MN_MSG_PING);
  msgpack_pack_int(&pk, 1);
  assert_true(mn_exec_frame(&f->x, b.data, b.len) < 0);
  expect_error_frame(&f->x, MN_EPROTO, "5");

  /* Malformed CALLs: seq not an integer, name not a string, args not an
   * array, wrong element count. */
  for (int variant = 0; variant < 5; variant++) {
    b.len = 0;
    msgpack_pack_array(&pk, variant == 3 ? 3 : (variant == 4 ? 5 : 4));
    msgpack_pack_int(&pk, MN_MSG_CALL);
    if (variant == 0) mn_pack_cstr(&pk, "2");
    else msgpack_pack_uint64(&pk, 2);
    if (variant == 1) msgpack_pack_int(&pk, 7);
    else mn_pack_cstr(&pk, "noop");
    if (variant == 2) mn_pack_cstr(&pk, "args");
    else if (variant != 3) msgpack_pack_array(&pk, 0);
    if (variant == 4) msgpack_pack_nil(&pk);
    int rc = mn_exec_frame(&f->x, b.data, b.len);
    if (rc >= 0) print_error("malformed CALL variant %d accepted\n", variant);
    assert_true(rc < 0);
    expect_error_frame(&f->x, MN_EPROTO, NULL);
  }
  assert_int_equal(f->x.last_seq, 1);

  /* Garbage that is not msgpack; the exec is still usable afterwards. */
  static const char garbage[] = {(char)0xc1, (char)0xc1, 0x00};
  int rc = mn_exec_frame(&f->x, garbage, sizeof(garbage));
  assert_int_equal(rc, MN_EMSGPACK);
  expect_error_frame(&f->x, MN_EMSGPACK, NULL);
  /* A truncated CALL. */
  call_t c;
  call_begin(&c, 2, "noop", 0);
  mn_frame_end(&c.b, c.start);
  rc = mn_exec_frame(&f->x, c.b.data + MN_FRAME_HEADER, c.b.len - MN_FRAME_HEADER - 1);
  mn_buf_free(&c.b);
  assert_int_equal(rc, MN_EMSGPACK);
  expect_error_frame(&f->x, MN_EMSGPACK, NULL);
  /* Trailing bytes. */
  b.len = 0;
  msgpack_pack_array(&pk, 1);
  msgpack_pack_int(&pk, MN_MSG_CALL);
  msgpack_pack_nil(&pk);
  assert_true(mn_exec_frame(&f->x, b.data, b.len) < 0);
  expect_error_frame(&f->x, MN_EMSGPACK, NULL);
  /* Too deep. */
  b.len = 0;
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_CALL);
  msgpack_pack_uint64(&pk, 2);
  mn_pack_cstr(&pk, "echo");
  for (int i = 0; i < MN_MAX_DEPTH + 2; i++) msgpack_pack_array(&pk, 1);
  msgpack_pack_nil(&pk);
  rc = mn_exec_frame(&f->x, b.data, b.len);
  assert_int_equal(rc, MN_ELIMIT);
  expect_error_frame(&f->x, MN_ELIMIT, NULL);
  mn_buf_free(&b);
  assert_int_equal(f->x.last_seq, 1);

  /* The next valid call, with the next sequence number, works. */
  f->seq = 1;
  uint64_t seq = call0(f, "noop", &r);
  assert_int_equal(seq, 2);
  expect_ok(&r, seq);
  reply_free(&r);
  seq = call_t1(f, "echo", 1, &r); /* no tensor 1: still a clean bad_args */
  expect_fail(&r, seq, "bad_args", "echo", "does not exist", NULL);
  reply_free(&r);
}

/* ---- the built-in table ------------------------------------------------------------- */

static int b_test_names(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                        size_t errlen) {
  return mk_return_string(ctx, b->name, strlen(b->name)) || mk_return_string(ctx, b->usage, strlen(b->usage)) ||
                 mk_return_string(ctx, ctx->kernel, strlen(ctx->kernel))
             ? -1
             : 0;
}

static int b_test_refuse(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                         size_t errlen) {
  x->err_kind = "refused";
  snprintf(err, errlen, "%s refuses %u arguments", b->name, args->via.array.size);
  return -1;
}

static void test_unknown(const mn_builtin_module_t *m, const char *name, size_t nl, char *err, size_t errlen) {
  char names[128];
  snprintf(err, errlen, "no '%.*s' here (try %s)", (int)nl, name,
           mn_exec_builtin_names(m, sizeof("__test") - 1, names, sizeof(names)));
}

static const mn_builtin_t test_entries[] = {
  {"__test_names", b_test_names, "(nothing)"},
  {"__test_refuse", b_test_refuse, "(anything)"},
};
static const mn_builtin_module_t test_module = {"__test_", test_entries, 2, test_unknown};

/* The message of a failed reply, copied out. */
static const char *reply_message(reply_t *r, char *buf, size_t len) {
  const msgpack_object *m = mn_map_get(&r->obj.via.array.ptr[3], "message");
  assert_non_null(m);
  snprintf(buf, len, "%.*s", (int)m->via.str.size, m->via.str.ptr);
  return buf;
}

static void test_builtin_table(void **state) {
  fix_t *f = *state;
  reply_t r;
  char msg[MN_MAX_ERRMSG];
  assert_int_equal(mn_exec_register(&test_module), 0);

  /* A registered module's entry gets its own row and the called name. */
  uint64_t seq = call0(f, "__test_names", &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 3);
  assert_int_equal(v->via.array.ptr[0].via.str.size, strlen("__test_names"));
  assert_memory_equal(v->via.array.ptr[1].via.str.ptr, "(nothing)", strlen("(nothing)"));
  assert_memory_equal(v->via.array.ptr[2].via.str.ptr, "__test_names", strlen("__test_names"));
  reply_free(&r);
  seq = call_str(f, "__test_refuse", "x", &r);
  expect_fail(&r, seq, "refused", "__test_refuse", "__test_refuse refuses 1 arguments", NULL);
  reply_free(&r);

  /* A name with the module's prefix but no entry (a prefix of one, too) gets the module's message. */
  seq = call0(f, "__test_name", &r);
  expect_fail(&r, seq, "bad_args", "__test_name", NULL, NULL);
  assert_string_equal(reply_message(&r, msg, sizeof(msg)), "no '__test_name' here (try __test_names, _refuse)");
  reply_free(&r);
  /* Without a module's prefix, the executor's own table answers, or says it has no such built-in. */
  seq = call0(f, "__tes", &r);
  expect_fail(&r, seq, "bad_args", "__tes", NULL, NULL);
  assert_string_equal(reply_message(&r, msg, sizeof(msg)), "unknown built-in '__tes'");
  reply_free(&r);
  seq = call0(f, "__lost", &r);
  expect_fail(&r, seq, "lost", "__lost", "payload was lost in a reconnect", NULL);
  reply_free(&r);
  seq = call0(f, "__info", &r);
  assert_int_equal(expect_ok(&r, seq)->via.array.size, 6);
  reply_free(&r);

  /* The table of modules is bounded; the modules already there keep working. */
  int n = 1;
  while (mn_exec_register(&test_module) == 0) n++;
  assert_true(n <= MN_MAX_BUILTIN_MODULES);
  assert_int_equal(mn_exec_register(&test_module), MN_ELIMIT);
  seq = call0(f, "__test_names", &r);
  expect_ok(&r, seq);
  reply_free(&r);
}

int main(void) {
  /* The basic library links OpenBLAS; keep it from starting a thread pool. */
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_load, setup, teardown),
    cmocka_unit_test_setup_teardown(test_noop, setup, teardown),
    cmocka_unit_test_setup_teardown(test_echo_values, setup, teardown),
    cmocka_unit_test_setup_teardown(test_echo_empty_and_rank, setup, teardown),
    cmocka_unit_test_setup_teardown(test_kernel_refuses_tables_and_ext, setup, teardown),
    cmocka_unit_test_setup_teardown(test_bad_arg_count, setup, teardown),
    cmocka_unit_test_setup_teardown(test_bad_arg_types, setup, teardown),
    cmocka_unit_test_setup_teardown(test_arg_limits, setup, teardown),
    cmocka_unit_test_setup_teardown(test_kernel_error, setup, teardown),
    cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
    cmocka_unit_test_setup_teardown(test_faulty_fail, setup, teardown),
    cmocka_unit_test_setup_teardown(test_sequence, setup, teardown),
    cmocka_unit_test_setup_teardown(test_protocol_errors, setup, teardown),
    /* Last: it fills the process's table of built-in modules. */
    cmocka_unit_test_setup_teardown(test_builtin_table, setup, teardown),
  };
  return cmocka_run_group_tests_name("exec", tests, NULL, NULL);
}
