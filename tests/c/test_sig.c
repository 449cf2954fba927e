/*
 * test_sig.c - unit tests for host/proc/sig.c (kernel signatures: parsing
 * and coercing arguments) and host/proc/scratch.c, which CALLs and actors'
 * proc.call share.
 */
#include "exec_fixture.h"

/* ---- signatures (sig.c), shared by CALLs and actors' proc.call ------------------- */

static void check_sig(const char *text, int min, int max, int rest) {
  mn_sig_t s;
  mn_sig_parse(&s, text);
  if (s.min != min || s.max != max || s.rest != rest)
    print_error("signature \"%s\": got %d..%d rest %d, wanted %d..%d rest %d\n", text, s.min, s.max, s.rest, min,
                max, rest);
  assert_int_equal(s.min, min);
  assert_int_equal(s.max, max);
  assert_int_equal(s.rest, rest);
}

/* The count check's message, for n arguments against `text` ("" when it passes). */
static const char *count_err(const char *text, int n, char *err, size_t errlen) {
  mn_sig_t s;
  mn_sig_parse(&s, text);
  err[0] = '\0';
  if (mn_sig_check_count(&s, n, err, errlen) == 0) assert_string_equal(err, "");
  return err;
}

static void test_sig_parse(void **state) {
  char err[256];
  check_sig("", 0, 0, 0);
  check_sig(NULL, 0, 0, 0);
  check_sig("tn", 2, 2, 0);
  check_sig("tn?", 1, 2, 0);
  check_sig("i?s", 0, 2, 0); /* every letter after the first '?' is optional too */
  check_sig("s*", 1, 1, 1);
  check_sig("*", 0, 0, 1);
  /* Malformed ones keep the lenient reading calls have always had. */
  check_sig("?i", 1, 1, 0);  /* a '?' with no letter before it is ignored */
  check_sig("n*nn", 1, 1, 1); /* letters after '*' are ignored */
  char many[MN_MAX_ARGS + 8];
  memset(many, 'n', sizeof(many) - 1);
  many[sizeof(many) - 1] = '\0';
  check_sig(many, MN_MAX_ARGS, MN_MAX_ARGS, 0);

  mn_sig_t s;
  mn_sig_parse(&s, "tx*");
  assert_int_equal(mn_sig_letter(&s, 0), 't');
  assert_int_equal(mn_sig_letter(&s, 1), 'x');
  assert_int_equal(mn_sig_letter(&s, 5), 'a'); /* what '*' accepts */
  assert_string_equal(mn_sig_want_name('x'), "any value");
  assert_string_equal(mn_sig_want_name('B'), "boolean");

  /* Good counts pass; bad ones say what was expected, got, and the signature. */
  assert_string_equal(count_err("tn", 2, err, sizeof(err)), "");
  assert_string_equal(count_err("tn?", 1, err, sizeof(err)), "");
  assert_string_equal(count_err("s*", 9, err, sizeof(err)), "");
  assert_string_equal(count_err("tn", 3, err, sizeof(err)), "expected 2 arguments, got 3 (signature \"tn\")");
  assert_string_equal(count_err("t", 0, err, sizeof(err)), "expected 1 argument, got 0 (signature \"t\")");
  assert_string_equal(count_err("", 1, err, sizeof(err)), "expected 0 arguments, got 1 (signature \"\")");
  assert_string_equal(count_err("tn?", 3, err, sizeof(err)), "expected 1 to 2 arguments, got 3 (signature \"tn?\")");
  assert_string_equal(count_err("s*", 0, err, sizeof(err)), "expected 1 argument, got 0 (signature \"s*\")");
}

static void test_sig_coerce(void **state) {
  char err[256];
  mk_arg_t a = {.type = MK_ARG_INT, .v.i = 3};
  assert_int_equal(mn_sig_coerce(&a, 'n', 1, "integer", err, sizeof(err)), 0);
  assert_int_equal(a.type, MK_ARG_NUMBER);
  assert_true(a.v.num == 3.0);
  a = (mk_arg_t){.type = MK_ARG_NUMBER, .v.num = 2.0};
  assert_int_equal(mn_sig_coerce(&a, 'i', 1, "number", err, sizeof(err)), 0);
  assert_int_equal(a.type, MK_ARG_INT);
  assert_int_equal(a.v.i, 2);
  a = (mk_arg_t){.type = MK_ARG_STRING, .v.str = {"ab", 2}};
  assert_int_equal(mn_sig_coerce(&a, 'b', 1, "string", err, sizeof(err)), 0);
  assert_int_equal(a.type, MK_ARG_BYTES);
  a = (mk_arg_t){.type = MK_ARG_BOOL, .v.b = 1};
  assert_int_equal(mn_sig_coerce(&a, 'a', 1, "boolean", err, sizeof(err)), 0);
  assert_int_equal(mn_sig_coerce(&a, 'x', 1, "boolean", err, sizeof(err)), 0); /* an unknown letter takes anything */

  /* The message names the argument, what its letter wants and what came. */
  a = (mk_arg_t){.type = MK_ARG_NUMBER, .v.num = 2.5};
  assert_int_equal(mn_sig_coerce(&a, 'i', 2, "number", err, sizeof(err)), MN_EINVAL);
  assert_string_equal(err, "argument 2: expected integer, got number");
  a = (mk_arg_t){.type = MK_ARG_NUMBER, .v.num = NAN};
  assert_int_equal(mn_sig_coerce(&a, 'i', 1, "number", err, sizeof(err)), MN_EINVAL);
  a = (mk_arg_t){.type = MK_ARG_NUMBER, .v.num = 1e19}; /* integral, but no int64 holds it */
  assert_int_equal(mn_sig_coerce(&a, 'i', 1, "number", err, sizeof(err)), MN_EINVAL);
  a = (mk_arg_t){.type = MK_ARG_STRING, .v.str = {"x", 1}};
  assert_int_equal(mn_sig_coerce(&a, 't', 1, "string", err, sizeof(err)), MN_EINVAL);
  assert_string_equal(err, "argument 1: expected tensor, got string");
  a = (mk_arg_t){.type = MK_ARG_INT, .v.i = 1};
  assert_int_equal(mn_sig_coerce(&a, 'B', 3, "integer", err, sizeof(err)), MN_EINVAL);
  assert_string_equal(err, "argument 3: expected boolean, got integer");
  assert_int_equal(mn_sig_coerce(&a, 's', 4, "integer", err, sizeof(err)), MN_EINVAL);
  assert_string_equal(err, "argument 4: expected string, got integer");
}

/* ---- scratch (scratch.c), shared by CALLs and actors' proc.call ------------------ */

static void test_scratch(void **state) {
  mn_scratch_t s;
  mn_scratch_init(&s);
  void *first = mn_scratch_get(&s, 100);
  assert_non_null(first);
  assert_int_equal((uintptr_t)first % MN_SCRATCH_ALIGN, 0);
  void *extra[MN_MAX_SCRATCH];
  for (int i = 0; i < MN_MAX_SCRATCH; i++) {
    extra[i] = mn_scratch_get(&s, i == 0 ? 0 : 32); /* even 0 bytes is a block of its own */
    assert_non_null(extra[i]);
    assert_ptr_not_equal(extra[i], first);
    memset(extra[i], 0xab, i == 0 ? 0 : 32);
  }
  assert_null(mn_scratch_get(&s, 8)); /* one block more than MN_MAX_SCRATCH extra */
  mn_scratch_release(&s);
  /* The next call gets the kept block back while it is big enough. */
  assert_ptr_equal(mn_scratch_get(&s, 64), first);
  mn_scratch_release(&s);
  void *bigger = mn_scratch_get(&s, 4096);
  assert_non_null(bigger);
  memset(bigger, 0, 4096);
  mn_scratch_release(&s);
  assert_ptr_equal(mn_scratch_get(&s, 4096), bigger);
  mn_scratch_close(&s);
  assert_null(s.first);
  assert_int_equal(s.nextra, 0);
  mn_scratch_close(&s); /* closing an empty one is harmless */
}

int main(void) {
  /* The basic library links OpenBLAS; keep it from starting a thread pool. */
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_sig_parse),
    cmocka_unit_test(test_sig_coerce),
    cmocka_unit_test(test_scratch),
  };
  return cmocka_run_group_tests_name("sig", tests, NULL, NULL);
}
