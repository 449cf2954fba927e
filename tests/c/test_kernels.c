/*
 * test_kernels.c - unit tests for the "basic" kernel library: its table,
 * the in-test signature checker, and every kernel's results and errors.
 * The libraries are loaded and called through the recording host of
 * kernel_host.h; test_faulty.c covers the "faulty" library.
 */
#include "kernel_host.h"

static void test_basic_table(void **state) {
  (void)state;
  static const char *const expect[] = {
    "noop", "", "echo", "*", "rank", "", "fill", "tn", "iota", "tn?", "axpy", "ntt",
    "copy", "tt", "scale", "tn", "sum", "t", "dot", "tt", "sgemm", "tttn?nBB", "sleep", "n", NULL,
  };
  check_table(basic, "basic", expect);
  /* The same table comes back on every call (the host may call it more than once). */
  mk_library_fn_t fn;
  void *sym = dlsym(basic_handle, MK_LIBRARY_SYMBOL);
  memcpy(&fn, &sym, sizeof(fn));
  assert_ptr_equal(fn(), basic);
}

static void test_signature_checker(void **state) {
  (void)state;
  /* The in-test checker guards every other test, so it must itself reject. */
  mk_tensor_t t = tensor(MK_F32, NULL, 0, -1);
  mk_arg_t three[] = { A_T(&t), A_T(&t), A_T(&t) };
  mk_arg_t seven[] = { A_T(&t), A_T(&t), A_T(&t), A_NUM(1), A_NUM(0), A_BOOL(0), A_BOOL(1) };
  assert_true(sig_accepts("tttn?nBB", 3, three));
  assert_true(sig_accepts("tttn?nBB", 7, seven));
  assert_false(sig_accepts("tttn?nBB", 2, three));
  assert_false(sig_accepts("tttn?nBB", 8, seven));
  assert_false(sig_accepts("tn", 2, three));
  assert_true(sig_accepts("tn?", 1, three));
  assert_true(sig_accepts("*", 3, three));
  assert_false(sig_accepts("", 1, three));
  assert_false(sig_valid("tx"));
  assert_false(sig_valid("*t"));
  assert_true(sig_valid("tttn?nBB"));
}

/* ---- basic ------------------------------------------------------------- */

static void test_noop(void **state) {
  (void)state;
  assert_int_equal(CALL0(basic, "noop"), 0);
  assert_int_equal(rec.nres, 0);
}

static void test_echo(void **state) {
  (void)state;
  mk_tensor_t t = tensor(MK_F32, NULL, 0, -1);
  t.id = 0x1234567890ULL;
  static const char s[] = "hi\0there"; /* embedded NUL: lengths, not strlen */
  static const unsigned char bytes[] = { 0x00, 0xff, 0x7f };
  assert_int_equal(CALL(basic, "echo", A_NIL, A_BOOL(1), A_BOOL(0), A_INT(-7), A_NUM(2.5),
                        A_STR(s, 8), A_BYTES((const char *)bytes, 3), A_T(&t), A_INT(INT64_MIN)),
                   0);
  assert_int_equal(rec.nres, 9);
  assert_int_equal(rec.res[0].type, MK_ARG_NIL);
  assert_int_equal(rec.res[1].type, MK_ARG_BOOL);
  assert_true(rec.res[1].b);
  assert_int_equal(rec.res[2].type, MK_ARG_BOOL);
  assert_false(rec.res[2].b);
  assert_int_equal(rec.res[3].type, MK_ARG_INT);
  assert_int_equal(rec.res[3].i, -7);
  assert_number(4, 2.5);
  assert_int_equal(rec.res[5].type, MK_ARG_STRING);
  assert_int_equal(rec.res[5].len, 8);
  assert_memory_equal(rec.res[5].str, s, 8);
  assert_int_equal(rec.res[6].type, MK_ARG_BYTES);
  assert_int_equal(rec.res[6].len, 3);
  assert_memory_equal(rec.res[6].str, bytes, 3);
  assert_int_equal(rec.res[7].type, MK_ARG_INT);
  assert_int_equal(rec.res[7].i, 0x1234567890LL);
  assert_int_equal(rec.res[8].type, MK_ARG_INT);
  assert_true(rec.res[8].i == INT64_MIN);

  assert_int_equal(CALL0(basic, "echo"), 0);
  assert_int_equal(rec.nres, 0);
}

static void test_rank(void **state) {
  (void)state;
  rec.ctx.rank = 3;
  rec.ctx.world = 8;
  assert_int_equal(CALL0(basic, "rank"), 0);
  assert_int_equal(rec.nres, 2);
  assert_int_equal(rec.res[0].type, MK_ARG_INT);
  assert_int_equal(rec.res[0].i, 3);
  assert_int_equal(rec.res[1].type, MK_ARG_INT);
  assert_int_equal(rec.res[1].i, 8);
  rec.ctx.rank = 0;
  rec.ctx.world = 1;
}

static void test_fill_sum_f32(void **state) {
  (void)state;
  float d[6] = { 9, 9, 9, 9, 9, 9 };
  mk_tensor_t t = tensor(MK_F32, d, 2, 3);
  assert_int_equal(CALL(basic, "fill", A_T(&t), A_NUM(1.5)), 0);
  assert_int_equal(rec.nres, 0);
  assert_floats(d, (float[]){ 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f }, 6);
  assert_int_equal(CALL(basic, "sum", A_T(&t)), 0);
  assert_int_equal(rec.nres, 1);
  assert_number(0, 9.0);
}

static void test_fill_sum_f64(void **state) {
  (void)state;
  double d[5] = { 0 };
  mk_tensor_t t = tensor(MK_F64, d, 5, -1);
  assert_int_equal(CALL(basic, "fill", A_T(&t), A_NUM(-0.25)), 0);
  assert_doubles(d, (double[]){ -0.25, -0.25, -0.25, -0.25, -0.25 }, 5);
  assert_int_equal(CALL(basic, "sum", A_T(&t)), 0);
  assert_number(0, -1.25);
  /* f64 keeps what f32 would round away. */
  assert_int_equal(CALL(basic, "fill", A_T(&t), A_NUM(0.1)), 0);
  assert_true(d[4] == 0.1);
}

static void test_fill_sum_ints(void **state) {
  (void)state;
  int32_t a[4];
  int64_t b[3];
  uint8_t c[10];
  mk_tensor_t ta = tensor(MK_I32, a, 2, 2), tb = tensor(MK_I64, b, 3, -1), tc = tensor(MK_U8, c, 10, -1);

  assert_int_equal(CALL(basic, "fill", A_T(&ta), A_NUM(-3)), 0);
  for (int i = 0; i < 4; i++)
    assert_int_equal(a[i], -3);
  assert_int_equal(CALL(basic, "sum", A_T(&ta)), 0);
  assert_number(0, -12.0);

  assert_int_equal(CALL(basic, "fill", A_T(&tb), A_NUM(1e12)), 0);
  for (int i = 0; i < 3; i++)
    assert_true(b[i] == 1000000000000LL);
  assert_int_equal(CALL(basic, "sum", A_T(&tb)), 0);
  assert_number(0, 3e12);

  assert_int_equal(CALL(basic, "fill", A_T(&tc), A_NUM(255)), 0);
  for (int i = 0; i < 10; i++)
    assert_int_equal(c[i], 255);
  assert_int_equal(CALL(basic, "sum", A_T(&tc)), 0);
  assert_number(0, 2550.0);

  /* Values an integer dtype cannot hold are refused, not wrapped. */
  assert_int_equal(CALL(basic, "fill", A_T(&tc), A_NUM(256)), -1);
  assert_string_equal(rec.err, "fill: value 256 does not fit in u8");
  assert_int_equal(c[0], 255);
  assert_int_equal(CALL(basic, "fill", A_T(&ta), A_NUM(1.5)), -1);
  assert_string_equal(rec.err, "fill: value 1.5 does not fit in i32");
  assert_int_equal(CALL(basic, "fill", A_T(&ta), A_NUM(NAN)), -1);
  assert_int_equal(CALL(basic, "fill", A_T(&tb), A_NUM(9223372036854775808.0)), -1);
}

static void test_iota(void **state) {
  (void)state;
  float f[5];
  double d[4];
  int32_t i32[3];
  int64_t i64[3];
  uint8_t u8[7];
  mk_tensor_t tf = tensor(MK_F32, f, 5, -1), td = tensor(MK_F64, d, 2, 2);
  mk_tensor_t ti = tensor(MK_I32, i32, 3, -1), tl = tensor(MK_I64, i64, 3, -1);
  mk_tensor_t tu = tensor(MK_U8, u8, 7, -1);

  assert_int_equal(CALL(basic, "iota", A_T(&tf)), 0);
  assert_floats(f, (float[]){ 0, 1, 2, 3, 4 }, 5);
  assert_int_equal(CALL(basic, "iota", A_T(&td), A_NUM(10.5)), 0);
  assert_doubles(d, (double[]){ 10.5, 11.5, 12.5, 13.5 }, 4);
  assert_int_equal(CALL(basic, "sum", A_T(&td)), 0);
  assert_number(0, 48.0);
  assert_int_equal(CALL(basic, "iota", A_T(&ti), A_NUM(-2)), 0);
  assert_int_equal(i32[0], -2);
  assert_int_equal(i32[1], -1);
  assert_int_equal(i32[2], 0);
  assert_int_equal(CALL(basic, "iota", A_T(&tl), A_NUM(4e15)), 0);
  assert_true(i64[2] == 4000000000000002LL);
  assert_int_equal(CALL(basic, "iota", A_T(&tu), A_NUM(249)), 0);
  assert_int_equal(u8[0], 249);
  assert_int_equal(u8[6], 255);
  /* 250..256 would wrap the last element. */
  assert_int_equal(CALL(basic, "iota", A_T(&tu), A_NUM(250)), -1);
  assert_string_equal(rec.err, "iota: 7 values from 250 do not fit in u8");
  assert_int_equal(u8[0], 249);
}

static void test_copy(void **state) {
  (void)state;
  int32_t a[3] = { 1, -2, 3 }, b[3] = { 0 };
  mk_tensor_t ta = tensor(MK_I32, a, 3, -1), tb = tensor(MK_I32, b, 3, -1);
  assert_int_equal(CALL(basic, "copy", A_T(&ta), A_T(&tb)), 0);
  assert_memory_equal(a, b, sizeof(a));
  float f[3] = { 0 };
  mk_tensor_t tf = tensor(MK_F32, f, 3, -1);
  assert_int_equal(CALL(basic, "copy", A_T(&ta), A_T(&tf)), -1);
  assert_string_equal(rec.err, "copy: src is i32[3] but dst is f32[3] (need the same dtype and element count)");
}

static void test_axpy(void **state) {
  (void)state;
  float xf[3] = { 1, 2, 3 }, yf[3] = { 10, 20, 30 };
  double xd[2] = { 4, -8 }, yd[2] = { 1, 1 };
  mk_tensor_t x = tensor(MK_F32, xf, 3, -1), y = tensor(MK_F32, yf, 3, -1);
  mk_tensor_t x2 = tensor(MK_F64, xd, 2, -1), y2 = tensor(MK_F64, yd, 2, -1);

  assert_int_equal(CALL(basic, "axpy", A_NUM(2), A_T(&x), A_T(&y)), 0);
  assert_int_equal(rec.nres, 0);
  assert_floats(yf, (float[]){ 12, 24, 36 }, 3);
  assert_floats(xf, (float[]){ 1, 2, 3 }, 3);
  assert_int_equal(CALL(basic, "axpy", A_NUM(-0.5), A_T(&x2), A_T(&y2)), 0);
  assert_doubles(yd, (double[]){ -1, 5 }, 2);

  assert_int_equal(CALL(basic, "axpy", A_NUM(1), A_T(&x), A_T(&y2)), -1);
  assert_string_equal(rec.err,
                      "axpy: x is f32[3] but y is f64[2] (need the same dtype and element count)");
  float zf[4] = { 0 };
  mk_tensor_t z = tensor(MK_F32, zf, 2, 2);
  assert_int_equal(CALL(basic, "axpy", A_NUM(1), A_T(&z), A_T(&y)), -1);
  assert_string_equal(rec.err,
                      "axpy: x is f32[2x2] but y is f32[3] (need the same dtype and element count)");
  assert_floats(yf, (float[]){ 12, 24, 36 }, 3);

  int32_t ia[2] = { 1, 2 }, ib[2] = { 3, 4 };
  mk_tensor_t ta = tensor(MK_I32, ia, 2, -1), tb = tensor(MK_I32, ib, 2, -1);
  assert_int_equal(CALL(basic, "axpy", A_NUM(1), A_T(&ta), A_T(&tb)), -1);
  assert_string_equal(rec.err, "axpy: unsupported dtype i32 (supported: f32, f64)");
}

static void test_scale(void **state) {
  (void)state;
  float f[3] = { 1, -2, 4 };
  double d[2] = { 0.5, -3 };
  mk_tensor_t tf = tensor(MK_F32, f, 3, -1), td = tensor(MK_F64, d, 1, 2);
  assert_int_equal(CALL(basic, "scale", A_T(&tf), A_NUM(0.5)), 0);
  assert_floats(f, (float[]){ 0.5f, -1, 2 }, 3);
  assert_int_equal(CALL(basic, "scale", A_T(&td), A_NUM(3)), 0);
  assert_doubles(d, (double[]){ 1.5, -9 }, 2);
  uint8_t u[1] = { 3 };
  mk_tensor_t tu = tensor(MK_U8, u, 1, -1);
  assert_int_equal(CALL(basic, "scale", A_T(&tu), A_NUM(2)), -1);
  assert_string_equal(rec.err, "scale: unsupported dtype u8 (supported: f32, f64)");
  assert_int_equal(u[0], 3);
}

static void test_dot(void **state) {
  (void)state;
  float a[3] = { 1, 2, 3 }, b[3] = { 4, 5, 6 };
  double c[2] = { 0.5, 1.5 }, d[2] = { 2, 4 };
  mk_tensor_t ta = tensor(MK_F32, a, 3, -1), tb = tensor(MK_F32, b, 3, -1);
  mk_tensor_t tc = tensor(MK_F64, c, 2, -1), td = tensor(MK_F64, d, 2, -1);
  assert_int_equal(CALL(basic, "dot", A_T(&ta), A_T(&tb)), 0);
  assert_int_equal(rec.nres, 1);
  assert_number(0, 32.0);
  assert_int_equal(CALL(basic, "dot", A_T(&tc), A_T(&td)), 0);
  assert_number(0, 7.0);
  /* Mixed dtypes are refused rather than silently converted. */
  assert_int_equal(CALL(basic, "dot", A_T(&ta), A_T(&tc)), -1);
  assert_string_equal(rec.err,
                      "dot: x is f32[3] but y is f64[2] (need the same dtype and element count)");
}

/* A = [1 2 3; 4 5 6], B = [7 8; 9 10; 11 12], A@B = [58 64; 139 154]. */
static void test_sgemm(void **state) {
  (void)state;
  float a[6] = { 1, 2, 3, 4, 5, 6 }, b[6] = { 7, 8, 9, 10, 11, 12 };
  float c[4] = { NAN, NAN, NAN, NAN };
  mk_tensor_t A = tensor(MK_F32, a, 2, 3), B = tensor(MK_F32, b, 3, 2), C = tensor(MK_F32, c, 2, 2);

  /* Default beta = 0: C's old contents (NaN) must not leak into the result. */
  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&B), A_T(&C)), 0);
  assert_int_equal(rec.nres, 0);
  assert_floats(c, (float[]){ 58, 64, 139, 154 }, 4);

  /* C = 2*A@B + 1*C */
  c[0] = c[1] = c[2] = c[3] = 1;
  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&B), A_T(&C), A_NUM(2), A_NUM(1)), 0);
  assert_floats(c, (float[]){ 117, 129, 279, 309 }, 4);

  /* Same product from stored transposes: At is 3x2, Bt is 2x3. */
  float at[6] = { 1, 4, 2, 5, 3, 6 }, bt[6] = { 7, 9, 11, 8, 10, 12 };
  mk_tensor_t At = tensor(MK_F32, at, 3, 2), Bt = tensor(MK_F32, bt, 2, 3);
  assert_int_equal(CALL(basic, "sgemm", A_T(&At), A_T(&Bt), A_T(&C), A_NUM(1), A_NUM(0),
                        A_BOOL(1), A_BOOL(1)),
                   0);
  assert_floats(c, (float[]){ 58, 64, 139, 154 }, 4);
  assert_int_equal(CALL(basic, "sgemm", A_T(&At), A_T(&B), A_T(&C), A_NUM(1), A_NUM(0),
                        A_BOOL(1)),
                   0);
  assert_floats(c, (float[]){ 58, 64, 139, 154 }, 4);

  /* B@A is 3x3 from a 3x2 @ 2x3. */
  float c9[9];
  mk_tensor_t C9 = tensor(MK_F32, c9, 3, 3);
  assert_int_equal(CALL(basic, "sgemm", A_T(&B), A_T(&A), A_T(&C9)), 0);
  assert_floats(c9, (float[]){ 39, 54, 69, 49, 68, 87, 59, 82, 105 }, 9);

  /* Empty inner dimension: the product is zero, so C = beta*C (BLAS wants ld >= 1 here). */
  float e[1] = { 0 };
  mk_tensor_t A0 = tensor(MK_F32, e, 2, 0), B0 = tensor(MK_F32, e, 0, 2);
  c[0] = c[1] = c[2] = c[3] = 4;
  assert_int_equal(CALL(basic, "sgemm", A_T(&A0), A_T(&B0), A_T(&C), A_NUM(1), A_NUM(0.5)), 0);
  assert_floats(c, (float[]){ 2, 2, 2, 2 }, 4);
}

static void test_sgemm_errors(void **state) {
  (void)state;
  float a[12] = { 0 }, b[10] = { 0 }, c[6] = { 0 };
  mk_tensor_t A = tensor(MK_F32, a, 3, 4), B = tensor(MK_F32, b, 5, 2), C = tensor(MK_F32, c, 3, 2);

  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&B), A_T(&C)), -1);
  assert_string_equal(rec.err, "sgemm: A is 3x4 but B is 5x2 (inner dimensions differ)");
  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&B), A_T(&C), A_NUM(1), A_NUM(0), A_BOOL(1)),
                   -1);
  assert_string_equal(rec.err, "sgemm: A^T is 4x3 but B is 5x2 (inner dimensions differ)");

  mk_tensor_t B42 = tensor(MK_F32, b, 4, 2), C22 = tensor(MK_F32, c, 2, 2);
  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&B42), A_T(&C22)), -1);
  assert_string_equal(rec.err, "sgemm: C is 2x2 but A@B is 3x2");

  mk_tensor_t A1 = tensor(MK_F32, a, 12, -1);
  assert_int_equal(CALL(basic, "sgemm", A_T(&A1), A_T(&B42), A_T(&C)), -1);
  assert_string_equal(rec.err, "sgemm: A must be a 2-D f32 tensor, got f32[12]");

  double d[8] = { 0 };
  mk_tensor_t Bd = tensor(MK_F64, d, 4, 2);
  assert_int_equal(CALL(basic, "sgemm", A_T(&A), A_T(&Bd), A_T(&C)), -1);
  assert_string_equal(rec.err, "sgemm: B must be a 2-D f32 tensor, got f64[4x2]");

  /* In-place products are undefined in BLAS, so they are refused. */
  float sq[4] = { 1, 2, 3, 4 };
  mk_tensor_t S = tensor(MK_F32, sq, 2, 2);
  assert_int_equal(CALL(basic, "sgemm", A_T(&S), A_T(&C22), A_T(&S)), -1);
  assert_string_equal(rec.err, "sgemm: C must not share memory with A or B");
  assert_floats(sq, (float[]){ 1, 2, 3, 4 }, 4);
}

static void test_unsupported_dtype(void **state) {
  (void)state;
  uint16_t h[4] = { 0 };
  mk_tensor_t t16 = tensor(MK_F16, h, 4, -1), tb16 = tensor(MK_BF16, h, 2, 2);
  assert_int_equal(CALL(basic, "fill", A_T(&t16), A_NUM(1)), -1);
  assert_string_equal(rec.err, "fill: unsupported dtype f16 (supported: f32, f64, i32, i64, u8)");
  assert_int_equal(CALL(basic, "iota", A_T(&tb16)), -1);
  assert_string_equal(rec.err, "iota: unsupported dtype bf16 (supported: f32, f64, i32, i64, u8)");
  assert_int_equal(CALL(basic, "sum", A_T(&tb16)), -1);
  assert_string_equal(rec.err, "sum: unsupported dtype bf16 (supported: f32, f64, i32, i64, u8)");
  assert_int_equal(CALL(basic, "dot", A_T(&t16), A_T(&t16)), -1);
  assert_string_equal(rec.err, "dot: unsupported dtype f16 (supported: f32, f64)");
  for (int i = 0; i < 4; i++)
    assert_int_equal(h[i], 0);
}

static void test_device_tensor(void **state) {
  (void)state;
  float f[4] = { 0 };
  mk_tensor_t g = tensor(MK_F32, f, 2, 2), h = tensor(MK_F32, f, 2, 2);
  g.device = 0;
  assert_int_equal(CALL(basic, "fill", A_T(&g), A_NUM(1)), -1);
  assert_string_equal(rec.err, "fill: basic is a CPU library; tensor is on cuda:0");
  assert_floats(f, (float[]){ 0, 0, 0, 0 }, 4);
  g.device = 3;
  assert_int_equal(CALL(basic, "sum", A_T(&g)), -1);
  assert_string_equal(rec.err, "sum: basic is a CPU library; tensor is on cuda:3");
  float c[4];
  mk_tensor_t C = tensor(MK_F32, c, 2, 2);
  assert_int_equal(CALL(basic, "sgemm", A_T(&h), A_T(&g), A_T(&C)), -1);
  assert_string_equal(rec.err, "sgemm: basic is a CPU library; tensor is on cuda:3");
  assert_int_equal(CALL(basic, "axpy", A_NUM(1), A_T(&h), A_T(&g)), -1);
  assert_string_equal(rec.err, "axpy: basic is a CPU library; tensor is on cuda:3");
}

static void test_sleep(void **state) {
  (void)state;
  double t0 = mn_now_s();
  assert_int_equal(CALL(basic, "sleep", A_NUM(0)), 0);
  assert_int_equal(rec.nres, 0);
  assert_int_equal(CALL(basic, "sleep", A_NUM(0.05)), 0);
  assert_true(mn_now_s() - t0 >= 0.05);

  /* Already cancelled: a 5 s sleep returns at once (and a broken cancel fails, not hangs). */
  rec.cancel_after = 1;
  t0 = mn_now_s();
  assert_int_equal(CALL(basic, "sleep", A_NUM(5)), -1);
  assert_string_equal(rec.err, "sleep: cancelled");
  assert_true(mn_now_s() - t0 < 0.5);

  /* Cancelled mid-way: noticed within a step or two of 10 ms. */
  rec.cancel_after = 4;
  t0 = mn_now_s();
  assert_int_equal(CALL(basic, "sleep", A_NUM(5)), -1);
  double dt = mn_now_s() - t0;
  assert_string_equal(rec.err, "sleep: cancelled");
  assert_int_equal(rec.polls, 4);
  assert_true(dt >= 0.025);
  assert_true(dt < 1.0);
  rec.cancel_after = 0;

  assert_int_equal(CALL(basic, "sleep", A_NUM(-1)), -1);
  assert_string_equal(rec.err, "sleep: seconds must be in [0, 86400], got -1");
  assert_int_equal(CALL(basic, "sleep", A_NUM(86401)), -1);
  assert_int_equal(CALL(basic, "sleep", A_NUM(NAN)), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_basic_table),
    cmocka_unit_test(test_signature_checker),
    cmocka_unit_test(test_noop),
    cmocka_unit_test(test_echo),
    cmocka_unit_test(test_rank),
    cmocka_unit_test(test_fill_sum_f32),
    cmocka_unit_test(test_fill_sum_f64),
    cmocka_unit_test(test_fill_sum_ints),
    cmocka_unit_test(test_iota),
    cmocka_unit_test(test_copy),
    cmocka_unit_test(test_axpy),
    cmocka_unit_test(test_scale),
    cmocka_unit_test(test_dot),
    cmocka_unit_test(test_sgemm),
    cmocka_unit_test(test_sgemm_errors),
    cmocka_unit_test(test_unsupported_dtype),
    cmocka_unit_test(test_device_tensor),
    cmocka_unit_test(test_sleep),
  };
  return cmocka_run_group_tests_name("kernels", tests, group_setup, group_teardown);
}
