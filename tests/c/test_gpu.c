/*
 * test_gpu.c - unit tests for host/proc/gpu.c, the proc's GPU built-ins,
 * on machines with or without CUDA: loading and the device itself.
 *
 * Two layers here: the real loader with a bogus library name (the "not
 * found" path every CPU-only host takes), the real loader as this host has
 * it (a clear error or a real device, never a crash); and a fake CUDA
 * runtime and NCCL (fake_gpu.h: host memory standing in for device memory)
 * installed with mn__gpu_reset(), for the device's description and the
 * checks every built-in makes. test_gpu_tensors.c drives device tensors and
 * collectives on the same fake. Calls go through mn_exec_frame() exactly as
 * a proc runs them (gpu_fixture.h).
 */
#include "gpu_fixture.h"

#define BOGUS_CUDART "libmonarch-no-such-cudart.so"
#define BOGUS_NCCL "libmonarch-no-such-nccl.so"

/* ---- the real loader ------------------------------------------------------------ */

static void test_bogus_runtime_is_a_clear_error(void **state) {
  fix_t *f = *state;
  reply_t r;
  setenv("MONARCH_CUDART", BOGUS_CUDART, 1);
  for (int i = 0; i < 2; i++) { /* the reason is kept, and given again */
    call0(f, "__gpu_info", &r);
    expect_fail(&r, "no_gpu", "no CUDA runtime on this host: " BOGUS_CUDART " not found (MONARCH_CUDART)");
    done(&r);
  }
  tensor_new(f, 1, "f32", 4, &r);
  expect_fail(&r, "no_gpu", "no CUDA runtime on this host");
  done(&r);
  call0(f, "__gpu_nccl_id", &r);
  expect_fail(&r, "no_gpu", "no CUDA runtime on this host");
  done(&r);
  call0(f, "__gpu_sync", &r);
  expect_fail(&r, "no_gpu", "no CUDA runtime on this host");
  done(&r);
}

/* Whatever this host has: a device, or one of the two clear reasons. */
static void test_real_runtime_answers_or_explains(void **state) {
  fix_t *f = *state;
  reply_t r;
  call0(f, "__gpu_info", &r);
  if (r.ok) {
    assert_true(r.values->via.array.size == 8);
    assert_true(r.values->via.array.ptr[0].via.u64 >= 1);
    printf("    this host has a GPU: %.*s\n", (int)r.values->via.array.ptr[1].via.str.size,
           r.values->via.array.ptr[1].via.str.ptr);
  } else {
    assert_string_equal(r.kind, "no_gpu");
    assert_true(strstr(r.msg, "no CUDA runtime on this host") == r.msg || strstr(r.msg, "no CUDA device") == r.msg);
    printf("    no GPU here: %s\n", r.msg);
  }
  done(&r);
}

static void test_bogus_nccl_is_a_clear_error(void **state) {
  fix_t *f = *state;
  reply_t r;
  setenv("MONARCH_NCCL", BOGUS_NCCL, 1);
  call0(f, "__gpu_nccl_id", &r);
  expect_fail(&r, "no_gpu", "NCCL is not available on this host: " BOGUS_NCCL " not found (MONARCH_NCCL)");
  done(&r);
  call_t c;
  msgpack_packer *pk = begin(f, &c, "__gpu_all_reduce", 3);
  msgpack_pack_int(pk, 1);
  pack_tensor(pk, 1);
  mn_pack_cstr(pk, "sum");
  run(f, &c, &r);
  expect_fail(&r, "no_gpu", "NCCL is not available");
  done(&r);
}

/* mn_gpu_pin picks one entry of what the process may see. */
static void test_pin_narrows_the_visible_devices(void **state) {
  char err[256];
  unsetenv("CUDA_VISIBLE_DEVICES");
  assert_int_equal(mn_gpu_pin(3, err, sizeof(err)), 0);
  assert_string_equal(getenv("CUDA_VISIBLE_DEVICES"), "3");
  setenv("CUDA_VISIBLE_DEVICES", "4,GPU-5b2e,6", 1);
  assert_int_equal(mn_gpu_pin(1, err, sizeof(err)), 0);
  assert_string_equal(getenv("CUDA_VISIBLE_DEVICES"), "GPU-5b2e");
  setenv("CUDA_VISIBLE_DEVICES", "4,6", 1);
  assert_int_equal(mn_gpu_pin(2, err, sizeof(err)), MN_EINVAL);
  assert_string_equal(err, "cannot pin to GPU 2: CUDA_VISIBLE_DEVICES=4,6 lists fewer devices");
  assert_int_equal(mn_gpu_pin(-1, err, sizeof(err)), MN_EINVAL);
  assert_string_equal(getenv("CUDA_VISIBLE_DEVICES"), "4,6");
  unsetenv("CUDA_VISIBLE_DEVICES");
}

/* ---- the fake runtime -------------------------------------------------------------- */

static void test_info_describes_the_device(void **state) {
  fix_t *f = *state;
  reply_t r;
  call0(f, "__gpu_info", &r);
  expect_ok(&r);
  const msgpack_object *v = r.values;
  assert_int_equal(v->via.array.size, 8);
  assert_int_equal(v->via.array.ptr[0].via.u64, 2);
  assert_int_equal(v->via.array.ptr[1].via.str.size, strlen("Fake GPU"));
  assert_memory_equal(v->via.array.ptr[1].via.str.ptr, "Fake GPU", strlen("Fake GPU"));
  assert_int_equal(v->via.array.ptr[2].via.u64, 4000);
  assert_int_equal(v->via.array.ptr[3].via.u64, 1000);
  assert_memory_equal(v->via.array.ptr[4].via.str.ptr, "9.0", 3);
  assert_int_equal(v->via.array.ptr[7].via.u64, 0);
  done(&r);
}

static void test_no_device_is_a_clear_error(void **state) {
  fix_t *f = *state;
  reply_t r;
  F.count_rc = 100;
  call0(f, "__gpu_info", &r);
  expect_fail(&r, "no_gpu", "no CUDA device: cudaGetDeviceCount failed: no CUDA-capable device is detected");
  done(&r);
  mn__gpu_reset(&fake_rt, &fake_nccl);
  F.count_rc = 0;
  F.devices = 0;
  call0(f, "__gpu_info", &r);
  expect_fail(&r, "no_gpu", "no CUDA device: the CUDA runtime sees 0 devices");
  done(&r);
}

static void test_bad_arguments_are_named(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  tensor_new(f, 1, "f33", 4, &r);
  expect_fail(&r, "bad_args", "unknown dtype 'f33'");
  done(&r);
  call0(f, "__gpu_tensor_new", &r);
  expect_fail(&r, "bad_args", "__gpu_tensor_new takes (id, dtype, shape, device?)");
  done(&r);
  msgpack_packer *pk = begin(f, &c, "__gpu_tensor_new", 4);
  msgpack_pack_int(pk, 1);
  mn_pack_cstr(pk, "f32");
  msgpack_pack_array(pk, 0);
  msgpack_pack_int(pk, 5);
  run(f, &c, &r);
  expect_fail(&r, "bad_args", "device 5 does not exist: this proc sees 2 CUDA devices (0..1)");
  done(&r);
  call0(f, "__gpu_fetch", &r);
  expect_fail(&r, "bad_args", "__gpu_fetch: argument 1 must be a tensor");
  done(&r);
  call_t1(f, "__gpu_fetch", 99, &r);
  expect_fail(&r, "bad_args", "tensor 99 does not exist on this proc");
  done(&r);
  call0(f, "__gpu_free", &r);
  expect_fail(&r, "bad_args", "__gpu_free takes a tensor");
  done(&r);
  call_t1(f, "__gpu_free", 99, &r);
  expect_ok(&r);
  assert_false(r.values->via.array.ptr[0].via.boolean);
  done(&r);
  call0(f, "__gpu_nope", &r);
  expect_fail(&r, "bad_args", "unknown GPU built-in '__gpu_nope'");
  done(&r);
}

static void test_cpu_tensors_are_refused(void **state) {
  fix_t *f = *state;
  reply_t r;
  int64_t shape[1] = {4};
  char err[128];
  assert_non_null(mn_tensor_new(&f->x.reg, 5, MK_F32, 1, shape, err, sizeof(err)));
  call_t1(f, "__gpu_fetch", 5, &r);
  expect_fail(&r, "bad_args", "__gpu_fetch: tensor 5 is on the CPU");
  done(&r);
  call_t1(f, "__gpu_free", 5, &r);
  expect_fail(&r, "bad_args", "tensor 5 is on the CPU (free it with __tensor_free)");
  done(&r);
}


int main(void) {
  if (mn_gpu_register() != 0 || mn_gpu_register() != 0) {
    fprintf(stderr, "test_gpu: cannot register the GPU built-ins\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_bogus_runtime_is_a_clear_error, setup_real, teardown),
    cmocka_unit_test_setup_teardown(test_real_runtime_answers_or_explains, setup_real, teardown),
    cmocka_unit_test_setup_teardown(test_bogus_nccl_is_a_clear_error, setup_fake_runtime, teardown),
    cmocka_unit_test(test_pin_narrows_the_visible_devices),
    cmocka_unit_test_setup_teardown(test_info_describes_the_device, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_no_device_is_a_clear_error, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_bad_arguments_are_named, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_cpu_tensors_are_refused, setup_fake, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
