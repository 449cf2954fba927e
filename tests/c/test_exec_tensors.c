/*
 * test_exec_tensors.c - unit tests for tensors in the proc: the executor's
 * tensor built-ins (host/proc/exec_builtins.c through mn_exec_frame()) and
 * host/proc/registry.c directly (tensors and kernel libraries), on the
 * fixture of exec_fixture.h.
 */
#include "exec_fixture.h"

/* ---- tensors ------------------------------------------------------------------- */

/* The basic library and tensor 7, f32[4], that the tensor tests work on. */
static void load_with_tensor(fix_t *f) {
  int64_t shape[1] = {4};
  load_ok(f, "basic");
  tensor_new_ok(f, 7, "f32", 1, shape);
  assert_int_equal(f->x.reg.ntensors, 1);
  assert_int_equal(f->x.reg.tensor_bytes, 16);
}

/* fill(tensor, value), checked to succeed with no values. */
static void fill_ok(fix_t *f, uint64_t id, double value) {
  reply_t r;
  call_t c;
  uint64_t seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "fill", 2);
  pack_tensor(pk, id);
  msgpack_pack_double(pk, value);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  assert_int_equal(expect_ok(&r, seq)->via.array.size, 0);
  reply_free(&r);
}

/* __tensor_put(id, bin of n bytes); leaves the reply in r. */
static uint64_t tensor_put(fix_t *f, uint64_t id, const void *data, size_t n, reply_t *r) {
  call_t c;
  uint64_t seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "__tensor_put", 2);
  msgpack_pack_uint64(pk, id);
  pack_bin(pk, data, n);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, r);
  return seq;
}

/* sum(tensor), checked to succeed; returns the sum. */
static double sum_ok(fix_t *f, uint64_t id) {
  reply_t r;
  uint64_t seq = call_t1(f, "sum", id, &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 1);
  double sum = as_number(&v->via.array.ptr[0]);
  reply_free(&r);
  return sum;
}

static void test_tensor_fill_sum_echo(void **state) {
  fix_t *f = *state;
  reply_t r;
  load_with_tensor(f);
  /* A new tensor is zeroed. */
  assert_true(sum_ok(f, 7) == 0.0);
  /* fill then sum. */
  fill_ok(f, 7, 2.5);
  assert_true(sum_ok(f, 7) == 4 * 2.5);
  /* echo gives a tensor back as its id. */
  uint64_t seq = call_t1(f, "echo", 7, &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(as_number(&v->via.array.ptr[0]), 7);
  reply_free(&r);
}

static void test_tensor_fetch_put(void **state) {
  fix_t *f = *state;
  reply_t r;
  load_with_tensor(f);
  fill_ok(f, 7, 2.5);
  /* __tensor_fetch: the raw bytes, 16 of them. Ids work bare or as handles. */
  uint64_t seq = call_id(f, "__tensor_fetch", 7, &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 1);
  assert_int_equal(v->via.array.ptr[0].type, MSGPACK_OBJECT_BIN);
  assert_int_equal(v->via.array.ptr[0].via.bin.size, 16);
  float got[4];
  memcpy(got, v->via.array.ptr[0].via.bin.ptr, 16);
  for (int i = 0; i < 4; i++) assert_true(got[i] == 2.5f);
  reply_free(&r);
  seq = call_t1(f, "__tensor_fetch", 7, &r);
  assert_int_equal(expect_ok(&r, seq)->via.array.ptr[0].via.bin.size, 16);
  reply_free(&r);

  /* __tensor_put of the right size, then sum sees it. */
  float put[5] = {1, 2, 3, 4.5f, 99}; /* the fifth only for the too-long put below */
  seq = tensor_put(f, 7, put, 16, &r);
  expect_ok(&r, seq);
  reply_free(&r);
  assert_true(sum_ok(f, 7) == 10.5);

  /* ...and of the wrong size, or without data, is refused and changes nothing. */
  seq = tensor_put(f, 7, put, 15, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_put", "15 bytes", "16 bytes");
  reply_free(&r);
  seq = tensor_put(f, 7, put, 17, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_put", NULL, NULL);
  reply_free(&r);
  seq = call_id(f, "__tensor_put", 7, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_put", NULL, NULL);
  reply_free(&r);
  assert_true(sum_ok(f, 7) == 10.5);
}

/* __info counts tensors. */
static void test_tensor_info(void **state) {
  fix_t *f = *state;
  reply_t r;
  load_with_tensor(f);
  uint64_t seq = call0(f, "__info", &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 6);
  assert_int_equal(as_number(&v->via.array.ptr[0]), 3);        /* rank */
  assert_int_equal(as_number(&v->via.array.ptr[1]), 8);        /* world */
  assert_int_equal(as_number(&v->via.array.ptr[2]), getpid()); /* pid */
  assert_int_equal(v->via.array.ptr[3].type, MSGPACK_OBJECT_STR);
  assert_int_equal(as_number(&v->via.array.ptr[4]), 1);
  assert_int_equal(as_number(&v->via.array.ptr[5]), 16);
  reply_free(&r);
}

static void test_tensor_free(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_with_tensor(f);
  /* Free it: true once, then false; using it after is bad_args. */
  uint64_t seq = call_t1(f, "__tensor_free", 7, &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 1);
  assert_int_equal(v->via.array.ptr[0].type, MSGPACK_OBJECT_BOOLEAN);
  assert_true(v->via.array.ptr[0].via.boolean);
  reply_free(&r);
  assert_int_equal(f->x.reg.ntensors, 0);
  assert_int_equal(f->x.reg.tensor_bytes, 0);
  seq = call_id(f, "__tensor_free", 7, &r);
  v = expect_ok(&r, seq);
  assert_false(v->via.array.ptr[0].via.boolean);
  reply_free(&r);
  seq = call_t1(f, "sum", 7, &r);
  expect_fail(&r, seq, "bad_args", "sum", "does not exist", NULL);
  reply_free(&r);
  seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "fill", 2);
  pack_tensor(pk, 7);
  msgpack_pack_double(pk, 1.0);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "fill", "argument 1", "does not exist");
  reply_free(&r);
  seq = call_id(f, "__tensor_fetch", 7, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_fetch", "does not exist", NULL);
  reply_free(&r);

  /* The id can be used again after the free. */
  int64_t shape[1] = {4};
  tensor_new_ok(f, 7, "f64", 1, shape);
  seq = call_id(f, "__tensor_fetch", 7, &r);
  assert_int_equal(expect_ok(&r, seq)->via.array.ptr[0].via.bin.size, 32);
  reply_free(&r);
}

/* A large id survives the 8-byte big-endian handle. */
static void test_tensor_large_id(void **state) {
  fix_t *f = *state;
  reply_t r;
  load_with_tensor(f);
  uint64_t big = 0x0102030405060708ull;
  int64_t two[2] = {2, 3};
  tensor_new_ok(f, big, "i32", 2, two);
  uint64_t seq = call_t1(f, "echo", big, &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.ptr[0].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
  assert_true(v->via.array.ptr[0].via.u64 == big);
  reply_free(&r);
  assert_non_null(mn_tensor_get(&f->x.reg, big));
  assert_int_equal(mn_tensor_get(&f->x.reg, big)->numel, 6);
}

static void test_tensor_new_errors(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  int64_t shape[MK_MAX_DIMS + 1];
  for (int i = 0; i <= MK_MAX_DIMS; i++) shape[i] = 1;

  tensor_new_ok(f, 1, "u8", 1, shape);
  /* Duplicate id. */
  uint64_t seq = tensor_new(f, 1, "u8", 1, shape, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "already exists", NULL);
  reply_free(&r);
  /* Unknown dtype. */
  seq = tensor_new(f, 2, "f33", 1, shape, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "f33", NULL);
  reply_free(&r);
  /* Too many dimensions; exactly MK_MAX_DIMS is fine. */
  seq = tensor_new(f, 2, "f32", MK_MAX_DIMS + 1, shape, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "MK_MAX_DIMS", NULL);
  reply_free(&r);
  tensor_new_ok(f, 2, "f32", MK_MAX_DIMS, shape);
  /* Negative and overflowing sizes. */
  int64_t neg[2] = {2, -1};
  seq = tensor_new(f, 3, "f32", 2, neg, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "dimension 2", NULL);
  reply_free(&r);
  int64_t huge[3] = {INT64_C(1) << 30, INT64_C(1) << 30, INT64_C(1) << 30};
  seq = tensor_new(f, 3, "f32", 3, huge, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", NULL, NULL);
  reply_free(&r);
  /* Non-integer shape entries, a missing shape. */
  seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "__tensor_new", 3);
  msgpack_pack_uint64(pk, 3);
  mn_pack_cstr(pk, "f32");
  msgpack_pack_array(pk, 2);
  msgpack_pack_int(pk, 2);
  mn_pack_cstr(pk, "x");
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "entry 2", NULL);
  reply_free(&r);
  seq = ++f->seq;
  pk = call_begin(&c, seq, "__tensor_new", 2);
  msgpack_pack_uint64(pk, 3);
  mn_pack_cstr(pk, "f32");
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "(id, dtype, shape)", NULL);
  reply_free(&r);
  /* A zero-sized and a 0-d tensor are fine. */
  int64_t zero[1] = {0};
  tensor_new_ok(f, 4, "f64", 1, zero);
  tensor_new_ok(f, 5, "f64", 0, NULL);
  assert_int_equal(mn_tensor_get(&f->x.reg, 4)->nbytes, 0);
  assert_int_equal(mn_tensor_get(&f->x.reg, 5)->numel, 1);
  assert_int_equal(f->x.reg.ntensors, 4);
}

/*
 * __tensor_fetch / __tensor_put / __tensor_free given no usable id must be
 * refused as bad_args, without claiming that some tensor "does not exist"
 * (no tensor was named). Run under valgrind, this also checks that no
 * uninitialized id is used to format the message.
 */
static void test_tensor_builtins_without_id(void **state) {
  fix_t *f = *state;
  static const char *const names[] = {"__tensor_fetch", "__tensor_put", "__tensor_free"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    for (int with_str = 0; with_str < 2; with_str++) {
      reply_t r;
      uint64_t seq = with_str ? call_str(f, names[i], "seven", &r) : call0(f, names[i], &r);
      expect_fail(&r, seq, "bad_args", names[i], NULL, NULL);
      const msgpack_object *m = mn_map_get(&r.obj.via.array.ptr[3], "message");
      char msg[512];
      snprintf(msg, sizeof(msg), "%.*s", (int)m->via.str.size, m->via.str.ptr);
      reply_free(&r);
      if (strstr(msg, "does not exist") != NULL)
        print_error("%s(%s): message \"%s\" names a tensor though no id was given\n", names[i],
                    with_str ? "\"seven\"" : "", msg);
      assert_null(strstr(msg, "does not exist"));
    }
  }
}

/* ---- the registry, directly ------------------------------------------------------- */

static void test_dtypes(void **state) {
  (void)state;
  assert_int_equal(mn_dtype_parse("f32", 3), MK_F32);
  assert_int_equal(mn_dtype_parse("f64", 3), MK_F64);
  assert_int_equal(mn_dtype_parse("f16", 3), MK_F16);
  assert_int_equal(mn_dtype_parse("bf16", 4), MK_BF16);
  assert_int_equal(mn_dtype_parse("i32", 3), MK_I32);
  assert_int_equal(mn_dtype_parse("i64", 3), MK_I64);
  assert_int_equal(mn_dtype_parse("u8", 2), MK_U8);
  assert_int_equal(mn_dtype_parse("f32x", 3), MK_F32); /* only n bytes count */
  assert_int_equal(mn_dtype_parse("f3", 2), MN_EINVAL);
  assert_int_equal(mn_dtype_parse("f32x", 4), MN_EINVAL);
  assert_int_equal(mn_dtype_parse("", 0), MN_EINVAL);
  assert_int_equal(mn_dtype_parse("F32", 3), MN_EINVAL);
  for (int d = 0; d < MK_DTYPE_COUNT; d++)
    assert_int_equal(mn_dtype_parse(mn_dtype_name((mk_dtype_t)d), strlen(mn_dtype_name((mk_dtype_t)d))), d);
  assert_string_equal(mn_dtype_name((mk_dtype_t)99), "?");
}

static void test_registry_bad_shapes(void **state) {
  (void)state;
  mn_registry_t reg;
  char err[256];
  mn_registry_init(&reg, prefix());
  assert_null(mn_tensor_get(&reg, 1));
  assert_int_equal(mn_tensor_free(&reg, 1), MN_ENOTFOUND);
  int64_t shape[MK_MAX_DIMS + 1];
  for (int i = 0; i <= MK_MAX_DIMS; i++) shape[i] = 2;
  err[0] = '\0';
  assert_null(mn_tensor_new(&reg, 1, MK_F32, MK_MAX_DIMS + 1, shape, err, sizeof(err)));
  assert_non_null(strstr(err, "MK_MAX_DIMS"));
  err[0] = '\0';
  assert_null(mn_tensor_new(&reg, 1, MK_F32, -1, shape, err, sizeof(err)));
  assert_true(strlen(err) > 0);
  shape[3] = -5;
  err[0] = '\0';
  assert_null(mn_tensor_new(&reg, 1, MK_F32, 4, shape, err, sizeof(err)));
  assert_non_null(strstr(err, "-5"));
  shape[3] = INT64_MAX;
  assert_null(mn_tensor_new(&reg, 1, MK_F32, 4, shape, err, sizeof(err)));
  assert_int_equal(reg.ntensors, 0);
  assert_int_equal(reg.tensor_bytes, 0);
  mn_registry_close(&reg);
}

enum { KEEP = 37 };                   /* tensors kept live while others come and go */
static const int64_t three[1] = {3}; /* the shape of the kept ones, 12 bytes as i32 */

/* Makes tensor 1, f64 of MK_MAX_DIMS dimensions of 2, checks it, and returns it. */
static mk_tensor_t *first_tensor(mn_registry_t *reg) {
  char err[256];
  int64_t shape[MK_MAX_DIMS];
  for (int i = 0; i < MK_MAX_DIMS; i++) shape[i] = 2;
  mk_tensor_t *t = mn_tensor_new(reg, 1, MK_F64, MK_MAX_DIMS, shape, err, sizeof(err));
  assert_non_null(t);
  assert_int_equal(t->numel, 256);
  assert_int_equal(t->nbytes, 256 * 8);
  assert_int_equal(t->ndim, MK_MAX_DIMS);
  assert_int_equal(t->device, -1);
  assert_int_equal(t->id, 1);
  assert_int_equal(((uintptr_t)t->data) % 64, 0);
  for (size_t i = 0; i < t->nbytes; i++) assert_int_equal(((unsigned char *)t->data)[i], 0);
  assert_ptr_equal(mn_tensor_get(reg, 1), t);
  return t;
}

/* A registry holding first_tensor() and KEEP i32[3] tensors, ids 100 on. */
static mk_tensor_t *registry_with_kept(mn_registry_t *reg) {
  char err[256];
  mn_registry_init(reg, prefix());
  mk_tensor_t *t = first_tensor(reg);
  for (uint64_t id = 100; id < 100 + KEEP; id++)
    assert_non_null(mn_tensor_new(reg, id, MK_I32, 1, three, err, sizeof(err)));
  assert_int_equal(reg->ntensors, 1 + KEEP);
  return t;
}

static void test_registry_tensor_new(void **state) {
  (void)state;
  mn_registry_t reg;
  char err[256];
  mn_registry_init(&reg, prefix());
  first_tensor(&reg);
  assert_null(mn_tensor_new(&reg, 1, MK_F32, 1, three, err, sizeof(err)));
  assert_non_null(strstr(err, "already exists"));
  assert_int_equal(reg.ntensors, 1);
  mn_registry_close(&reg);
}

/* Many new/free cycles: counts stay right and live tensors stay findable. */
static void test_registry_cycles(void **state) {
  (void)state;
  enum { CYCLES = 10000 };
  mn_registry_t reg;
  char err[256];
  mk_tensor_t *t = registry_with_kept(&reg);
  for (uint64_t i = 0; i < CYCLES; i++) {
    uint64_t id = 1000 + i;
    mk_tensor_t *u = mn_tensor_new(&reg, id, MK_U8, 1, three, err, sizeof(err));
    assert_non_null(u);
    assert_ptr_equal(mn_tensor_get(&reg, id), u);
    if (i % 3 == 0) {
      /* Also free and recreate one of the kept ones. */
      uint64_t k = 100 + i % KEEP;
      assert_int_equal(mn_tensor_free(&reg, k), 0);
      assert_null(mn_tensor_get(&reg, k));
      assert_non_null(mn_tensor_new(&reg, k, MK_I32, 1, three, err, sizeof(err)));
    }
    assert_int_equal(mn_tensor_free(&reg, id), 0);
    assert_int_equal(mn_tensor_free(&reg, id), MN_ENOTFOUND);
    assert_null(mn_tensor_get(&reg, id));
    assert_int_equal(reg.ntensors, 1 + KEEP);
  }
  assert_int_equal(reg.tensor_bytes, 256 * 8 + KEEP * 12);
  assert_ptr_equal(mn_tensor_get(&reg, 1), t);
  for (uint64_t id = 100; id < 100 + KEEP; id++) {
    mk_tensor_t *u = mn_tensor_get(&reg, id);
    assert_non_null(u);
    assert_int_equal(u->id, id);
  }
  mn_registry_close(&reg);
}

/* Grows the table past its first size with 2000 0-d u8 tensors (ids 50000 on),
 * then frees every other one; everything live stays findable. */
static void grow_and_thin(mn_registry_t *reg) {
  char err[256];
  for (uint64_t id = 50000; id < 52000; id++)
    assert_non_null(mn_tensor_new(reg, id, MK_U8, 0, three, err, sizeof(err)));
  assert_int_equal(reg->ntensors, 1 + KEEP + 2000);
  for (uint64_t id = 50000; id < 52000; id++) assert_int_equal(mn_tensor_get(reg, id)->id, id);
  for (uint64_t id = 100; id < 100 + KEEP; id++) assert_non_null(mn_tensor_get(reg, id));
  for (uint64_t id = 50000; id < 52000; id += 2) assert_int_equal(mn_tensor_free(reg, id), 0);
  assert_int_equal(reg->ntensors, 1 + KEEP + 1000);
  for (uint64_t id = 50001; id < 52000; id += 2) assert_non_null(mn_tensor_get(reg, id));
}

static void test_registry_growth(void **state) {
  (void)state;
  mn_registry_t reg;
  mk_tensor_t *t = registry_with_kept(&reg);
  grow_and_thin(&reg);
  assert_ptr_equal(mn_tensor_get(&reg, 1), t);
  mn_registry_close(&reg); /* frees what is still live */
}

/* Ids that all hash to the same slot (multiples of 2^32) form one long
 * probe chain: freeing from its middle must not hide what lies beyond. The
 * chain is built in a grown table with freed slots in it. */
static void test_registry_probe_chain(void **state) {
  (void)state;
  enum { CHAIN = 300 };
  mn_registry_t reg;
  char err[256];
  registry_with_kept(&reg);
  grow_and_thin(&reg);
  for (uint64_t k = 1; k <= CHAIN; k++)
    assert_non_null(mn_tensor_new(&reg, k << 32, MK_U8, 1, three, err, sizeof(err)));
  for (uint64_t k = 1; k <= CHAIN; k += 3) assert_int_equal(mn_tensor_free(&reg, k << 32), 0);
  for (uint64_t k = 1; k <= CHAIN; k++) {
    mk_tensor_t *u = mn_tensor_get(&reg, k << 32);
    if (k % 3 == 1) {
      assert_null(u);
      assert_int_equal(mn_tensor_free(&reg, k << 32), MN_ENOTFOUND);
    } else {
      assert_non_null(u);
      assert_true(u->id == k << 32);
    }
  }
  /* Re-adding reuses freed slots without duplicating live ids. */
  for (uint64_t k = 1; k <= CHAIN; k++) {
    mk_tensor_t *u = mn_tensor_new(&reg, k << 32, MK_U8, 1, three, err, sizeof(err));
    if (k % 3 == 1) assert_non_null(u);
    else assert_null(u); /* already exists */
  }
  for (uint64_t k = 1; k <= CHAIN; k++) assert_non_null(mn_tensor_get(&reg, k << 32));
  assert_int_equal(reg.ntensors, 1 + KEEP + 1000 + CHAIN);
  mn_registry_close(&reg); /* frees what is still live */
}

static void test_registry_libs(void **state) {
  (void)state;
  mn_registry_t reg;
  char err[512];
  mn_registry_init(&reg, prefix());
  assert_null(mn_registry_find(&reg, "noop", 4));
  err[0] = '\0';
  assert_null(mn_registry_load(&reg, "nope_not_here", err, sizeof(err)));
  assert_non_null(strstr(err, "nope_not_here"));
  const mk_library_t *lib = mn_registry_load(&reg, "basic", err, sizeof(err));
  if (lib == NULL) print_error("%s\n", err);
  assert_non_null(lib);
  assert_int_equal(lib->abi_version, MK_ABI_VERSION);
  assert_ptr_equal(mn_registry_load(&reg, "basic", err, sizeof(err)), lib);
  assert_int_equal(reg.nlibs, 1);
  assert_int_equal(reg.nkernels, (size_t)lib->count);
  for (int i = 0; i < lib->count; i++) {
    const char *name = lib->kernels[i].name;
    assert_ptr_equal(mn_registry_find(&reg, name, strlen(name)), &lib->kernels[i]);
  }
  /* Lookups use the given length, not a NUL. */
  assert_non_null(mn_registry_find(&reg, "noopXYZ", 4));
  assert_null(mn_registry_find(&reg, "noo", 3));
  assert_null(mn_registry_find(&reg, "noopX", 5));
  /* A second library adds to the table. */
  const mk_library_t *faulty = mn_registry_load(&reg, "faulty", err, sizeof(err));
  assert_non_null(faulty);
  assert_int_equal(reg.nlibs, 2);
  assert_int_equal(reg.nkernels, (size_t)(lib->count + faulty->count));
  assert_non_null(mn_registry_find(&reg, "noop", 4));
  assert_non_null(mn_registry_find(&reg, "fail", 4));
  mn_registry_close(&reg);
}

int main(void) {
  /* The basic library links OpenBLAS; keep it from starting a thread pool. */
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_tensor_fill_sum_echo, setup, teardown),
    cmocka_unit_test_setup_teardown(test_tensor_fetch_put, setup, teardown),
    cmocka_unit_test_setup_teardown(test_tensor_info, setup, teardown),
    cmocka_unit_test_setup_teardown(test_tensor_free, setup, teardown),
    cmocka_unit_test_setup_teardown(test_tensor_large_id, setup, teardown),
    cmocka_unit_test_setup_teardown(test_tensor_new_errors, setup, teardown),
    cmocka_unit_test_setup_teardown(test_tensor_builtins_without_id, setup, teardown),
    cmocka_unit_test(test_dtypes),
    cmocka_unit_test(test_registry_bad_shapes),
    cmocka_unit_test(test_registry_tensor_new),
    cmocka_unit_test(test_registry_cycles),
    cmocka_unit_test(test_registry_growth),
    cmocka_unit_test(test_registry_probe_chain),
    cmocka_unit_test(test_registry_libs),
  };
  return cmocka_run_group_tests_name("exec_tensors", tests, NULL, NULL);
}
