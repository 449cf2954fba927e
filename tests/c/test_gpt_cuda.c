/*
 * test_gpt_cuda.c - the GPU kernel library cuda_gpt (kernels/cuda/gpt_*.cu)
 * where no GPU is needed: that it loads, that it registers gpt's names with
 * gpt's signatures (kernels/cpu/gpt_kernels.c), and, through the executor
 * on the fake CUDA runtime (gpu_fixture.h) and a fake CPU group, every
 * refusal its kernels make before they touch the device, and a clear error
 * from CUDA itself where the real runtime has no device. What it computes
 * is checked on a GPU by build/tests/gpt_cuda_check and
 * tests/integration/gpt_gpu_spec.lua (bench/gpu_check.sh runs both).
 * Every test skips where cuda_gpt.so was not built (no nvcc).
 */
#include "gpu_fixture.h"

#include <dlfcn.h>

/* gpt's kernels that cuda_gpt leaves to gpt: they read files, count bytes or size the layout on the host. */
static const char *const HOST_ONLY[] = {"gpt_text_size", "gpt_text_load", "gpt_bigram", "gpt_info"};

#define TP_GROUP 41 /* the fake groups: tp of two members (this proc rank 0), dp of one */
#define DP_GROUP 42

static char lib_dir[900];

static const char *lib_path(const char *name, char *buf, size_t n) {
  snprintf(buf, n, "%s/%s.so", lib_dir, name);
  return buf;
}

static int have_cuda_gpt(void) {
  char p[1024];
  return access(lib_path("cuda_gpt", p, sizeof(p)), R_OK) == 0;
}

static const mk_library_t *open_lib(const char *name, void **h) {
  char p[1024];
  *h = dlopen(lib_path(name, p, sizeof(p)), RTLD_NOW | RTLD_LOCAL);
  if (*h == NULL) print_error("dlopen %s: %s\n", p, dlerror());
  assert_non_null(*h);
  mk_library_fn_t fn = (mk_library_fn_t)dlsym(*h, MK_LIBRARY_SYMBOL);
  assert_non_null(fn);
  return fn();
}

static const mk_kernel_t *find(const mk_library_t *lib, const char *name) {
  for (int i = 0; i < lib->count; i++)
    if (strcmp(lib->kernels[i].name, name) == 0) return &lib->kernels[i];
  return NULL;
}

static void test_cuda_gpt_registers_gpts_names_and_signatures(void **state) {
  if (!have_cuda_gpt()) skip();
  void *hc, *hg;
  const mk_library_t *cu = open_lib("cuda_gpt", &hc), *cpu = open_lib("gpt", &hg);
  assert_string_equal(cu->name, "cuda_gpt");
  assert_int_equal(cu->abi_version, MK_ABI_VERSION);
  for (int i = 0; i < cu->count; i++) { /* each of cuda_gpt's is one of gpt's, taking the same arguments */
    const mk_kernel_t *k = &cu->kernels[i], *twin = find(cpu, k->name);
    if (twin == NULL) print_error("cuda_gpt's %s is not a kernel of gpt\n", k->name);
    assert_non_null(twin);
    assert_string_equal(k->signature, twin->signature);
    assert_true(k->doc != NULL && strncmp(k->doc, k->name, strlen(k->name)) == 0);
  }
  int host_only = 0;
  for (int i = 0; i < cpu->count; i++) { /* and every one of gpt's is cuda_gpt's, but the host-only four */
    int listed = 0;
    for (size_t j = 0; j < sizeof(HOST_ONLY) / sizeof(HOST_ONLY[0]); j++) listed |= !strcmp(HOST_ONLY[j], cpu->kernels[i].name);
    if (!listed && find(cu, cpu->kernels[i].name) == NULL) print_error("gpt's %s has no CUDA twin\n", cpu->kernels[i].name);
    assert_true(listed || find(cu, cpu->kernels[i].name) != NULL);
    host_only += listed;
  }
  assert_int_equal(host_only, 4);
  assert_int_equal(cu->count, cpu->count - 4);
  /* Not dlclose'd: what their libraries' constructors allocated (libstdc++'s, OpenBLAS's) stays reachable, as in a
   * proc, which never unloads a library. */
  (void)hc, (void)hg;
}

/* ---- the kernels on the fake runtime --------------------------------------------------- */

static int fg_group(mn_exec_t *x, uint64_t gid, mk_group_t *g, char *err, size_t errlen) {
  g->id = gid, g->rank = 0, g->size = gid == TP_GROUP ? 2 : 1;
  return 0;
}
static int coll_runs;
static int fg_run(mn_exec_t *x, const mn_kcoll_t *k, char *err, size_t errlen, int *mismatch) {
  coll_runs += k->what != MN_KCOLL_FENCE;
  return 0;
}
static void fg_abort(mn_exec_t *x, uint64_t gid, const char *why) {}
static const mn_exec_coll_t fake_groups = {fg_group, fg_run, fg_abort};

enum { T_P = 1, T_G, T_S, T_CPU_P, T_D, T_GPU_D }; /* tensor ids of the fixture */
static int64_t numel;                            /* floats of a tp = 2 shard of the test model */
#define L_ 1
#define H_ 2
#define C_ 8
#define T_ 4

static void load(fix_t *f, const char *name) {
  reply_t r;
  call_t c;
  char p[1024];
  mn_pack_cstr(begin(f, &c, "__load", 1), lib_path(name, p, sizeof(p)));
  run(f, &c, &r);
  expect_ok(&r);
  done(&r);
}

/* gpt and then cuda_gpt (its kernels shadow gpt's), GPU P, G, S for the model of L_, H_, C_, T_ at tp = 2, a
 * CPU P, the text D on the CPU and a u8 GPU tensor. */
static int setup_gpt(void **state) {
  if (!have_cuda_gpt()) return setup_fake(state);
  if (setup_fake(state) != 0) return -1;
  fix_t *f = *state;
  reply_t r;
  call_t c;
  char err[128];
  mn_exec_set_coll(&fake_groups);
  coll_runs = 0;
  load(f, "gpt");
  load(f, "cuda_gpt");
  msgpack_packer *pk = begin(f, &c, "gpt_info", 5);
  for (int i = 0, v[5] = {L_, H_, C_, T_, 2}; i < 5; i++) msgpack_pack_int(pk, v[i]);
  run(f, &c, &r);
  expect_ok(&r);
  numel = r.values->via.array.ptr[0].via.i64;
  done(&r);
  int64_t np[] = {numel, numel + 1, 2 * numel}, shape[1] = {numel}, text[1] = {4096};
  for (int i = 0; i < 3; i++) {
    tensor_new(f, (uint64_t)(T_P + i), "f32", np[i], &r);
    expect_ok(&r);
    done(&r);
  }
  tensor_new(f, T_GPU_D, "u8", text[0], &r);
  expect_ok(&r);
  done(&r);
  if (mn_tensor_new(&f->x.reg, T_CPU_P, MK_F32, 1, shape, err, sizeof(err)) == NULL ||
      mn_tensor_new(&f->x.reg, T_D, MK_U8, 1, text, err, sizeof(err)) == NULL)
    return -1;
  return 0;
}

static int teardown_gpt(void **state) {
  mn_exec_set_coll(NULL);
  return teardown(state);
}

/* gpt_train(tpg, dpg, P, G, S, D, ntrain, L, H, C, T, B, seed, first, K, lr, warmup, total, wd, clip) */
static void train(fix_t *f, uint64_t P, uint64_t G, uint64_t D, int heads, reply_t *r) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, "gpt_train", 20);
  msgpack_pack_uint64(pk, TP_GROUP);
  msgpack_pack_uint64(pk, DP_GROUP);
  uint64_t t[4] = {P, G, T_S, D};
  for (int i = 0; i < 4; i++) pack_tensor(pk, t[i]);
  int64_t iv[] = {3000, L_, heads, C_, T_, 2, 7, 0, 1};
  for (size_t i = 0; i < sizeof(iv) / sizeof(iv[0]); i++) msgpack_pack_int64(pk, iv[i]);
  msgpack_pack_double(pk, 1e-3);
  msgpack_pack_int64(pk, 2);
  msgpack_pack_int64(pk, 10);
  msgpack_pack_double(pk, 0.1);
  msgpack_pack_double(pk, 1.0);
  run(f, &c, r);
}

/* gpt_init(tpg, P, L, H, C, T, seed) */
static void init(fix_t *f, uint64_t P, reply_t *r) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, "gpt_init", 7);
  msgpack_pack_uint64(pk, TP_GROUP);
  pack_tensor(pk, P);
  for (int i = 0, v[5] = {L_, H_, C_, T_, 7}; i < 5; i++) msgpack_pack_int(pk, v[i]);
  run(f, &c, r);
}

static void test_cuda_gpt_refuses_bad_arguments_before_the_device(void **state) {
  if (!have_cuda_gpt()) skip();
  fix_t *f = *state;
  reply_t r;
  train(f, T_CPU_P, T_G, T_D, H_, &r);
  expect_fail(&r, "kernel", "gpt_train: cuda_gpt is a GPU library; P is on the CPU (use gpt)");
  done(&r);
  train(f, T_P, T_S, T_D, H_, &r); /* S's size where G's belongs */
  expect_fail(&r, "kernel", "gpt_train: G must be f32[");
  done(&r);
  train(f, T_P, T_G, T_GPU_D, H_, &r);
  expect_fail(&r, "kernel", "gpt_train: D must be a CPU u8 tensor (gpt's gpt_text_load fills it), got u8 on the GPU");
  done(&r);
  train(f, T_P, T_G, T_D, 1, &r); /* 1 head over the tp group of 2 */
  expect_fail(&r, "kernel", "gpt_train: heads 1 are not divisible by tp 2");
  done(&r);
  init(f, T_CPU_P, &r);
  expect_fail(&r, "kernel", "gpt_init: cuda_gpt is a GPU library; P is on the CPU (use gpt)");
  done(&r);
  init(f, T_G, &r);
  expect_fail(&r, "kernel", "gpt_init: P must be f32[");
  done(&r);
  call_t c;
  msgpack_packer *pk = begin(f, &c, "gpt_sgemm_flops", 3);
  for (int i = 0, v[3] = {0, 1, 1}; i < 3; i++) msgpack_pack_int(pk, v[i]);
  run(f, &c, &r);
  expect_fail(&r, "kernel", "gpt_sgemm_flops: want n in 1..16384");
  done(&r);
  assert_int_equal(coll_runs, 0); /* no collective ran: every refusal came first */
}

/* gpt_bytes of a CPU tensor needs no device: the bytes come back as they are. */
static void test_cuda_gpt_bytes_of_a_cpu_tensor(void **state) {
  if (!have_cuda_gpt()) skip();
  fix_t *f = *state;
  reply_t r;
  mk_tensor_t *D = mn_tensor_get(&f->x.reg, T_D);
  for (int i = 0; i < 4096; i++) ((uint8_t *)D->data)[i] = (uint8_t)(i * 7);
  call_t1(f, "gpt_bytes", T_D, &r);
  expect_ok(&r);
  assert_int_equal(r.values->via.array.ptr[0].via.bin.size, 4096);
  assert_memory_equal(r.values->via.array.ptr[0].via.bin.ptr, D->data, 4096);
  done(&r);
}

/* The real CUDA runtime's device count, as cuda_gpt sees it; -1 when it fails (no driver) or is absent. */
static int real_devices(void) {
  void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  int n = -1;
  if (h == NULL) return -1;
  int (*count)(int *) = (int (*)(int *))dlsym(h, "cudaGetDeviceCount");
  if (count == NULL || count(&n) != 0) n = -1;
  return n; /* not dlclose'd: cuda_gpt.so holds the same runtime */
}

/* Arguments that pass every check, on a host whose real runtime has no device: CUDA's own reason, after the name. */
static void test_cuda_gpt_reports_cudas_failure_by_name(void **state) {
  if (!have_cuda_gpt() || real_devices() > 0) skip(); /* a real GPU would be handed the fake's host pointers */
  fix_t *f = *state;
  reply_t r;
  init(f, T_P, &r);
  expect_fail(&r, "kernel", "gpt_init: cudaGetDevice failed: ");
  done(&r);
  train(f, T_P, T_G, T_D, H_, &r);
  expect_fail(&r, "kernel", "gpt_train: cudaGetDevice failed: ");
  done(&r);
  call_t1(f, "gpt_bytes", T_P, &r);
  expect_fail(&r, "kernel", "gpt_bytes: cudaGetDevice failed: ");
  done(&r);
  assert_int_equal(coll_runs, 0);
}

int main(void) {
  const char *dir = getenv("MONARCH_KERNEL_DIR");
  snprintf(lib_dir, sizeof(lib_dir), "%s", dir && *dir ? dir : "build/lib/monarch");
  if (mn_gpu_register() != 0) {
    fprintf(stderr, "test_gpt_cuda: cannot register the GPU built-ins\n");
    return 1;
  }
  if (!have_cuda_gpt()) printf("    cuda_gpt.so is not built here (no nvcc): every test skips\n");
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_cuda_gpt_registers_gpts_names_and_signatures),
    cmocka_unit_test_setup_teardown(test_cuda_gpt_refuses_bad_arguments_before_the_device, setup_gpt, teardown_gpt),
    cmocka_unit_test_setup_teardown(test_cuda_gpt_bytes_of_a_cpu_tensor, setup_gpt, teardown_gpt),
    cmocka_unit_test_setup_teardown(test_cuda_gpt_reports_cudas_failure_by_name, setup_gpt, teardown_gpt),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
