/*
 * test_gpu_tensors.c - unit tests for host/proc/gpu.c on the fake CUDA
 * runtime and NCCL (fake_gpu.h): tensors in device memory, the NCCL
 * collectives and their communicators, and the collectives kernels call on
 * GPU tensors. They need the registry's device hooks (MN_DEVICE_HOOKS);
 * without them one test checks that GPU tensors are refused by name.
 * test_gpu.c covers loading and the device.
 */
#include "gpu_fixture.h"

#ifdef MN_DEVICE_HOOKS
static void pack_bin(msgpack_packer *pk, const void *p, size_t n) {
  msgpack_pack_bin(pk, n);
  msgpack_pack_bin_body(pk, p, n);
}

/* Checks a call succeeded and releases its reply. */
static void expect_done(reply_t *r) {
  expect_ok(r);
  done(r);
}

static void test_tensors_live_in_device_memory(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  float in[4] = {1, 2, 3, 4};
  tensor_new(f, 7, "f32", 4, &r);
  expect_done(&r);
  assert_int_equal(F.live, 1);
  mk_tensor_t *t = mn_tensor_get(&f->x.reg, 7);
  assert_non_null(t);
  assert_int_equal(t->device, 0);
  assert_int_equal(t->nbytes, 16);
  call_t1(f, "__gpu_fetch", 7, &r); /* zeroed */
  expect_ok(&r);
  assert_int_equal(r.values->via.array.ptr[0].via.bin.size, 16);
  assert_memory_equal(r.values->via.array.ptr[0].via.bin.ptr, (float[4]){0}, 16);
  done(&r);
  msgpack_packer *pk = begin(f, &c, "__gpu_put", 2);
  pack_tensor(pk, 7);
  pack_bin(pk, in, sizeof(in));
  run(f, &c, &r);
  expect_done(&r);
  call_t1(f, "__gpu_fetch", 7, &r);
  expect_ok(&r);
  assert_memory_equal(r.values->via.array.ptr[0].via.bin.ptr, in, 16);
  done(&r);
  pk = begin(f, &c, "__gpu_put", 2);
  pack_tensor(pk, 7);
  pack_bin(pk, in, 8);
  run(f, &c, &r);
  expect_fail(&r, "bad_args", "__gpu_put: 8 bytes into a tensor of 16 bytes");
  done(&r);
  /* The CPU path refuses device memory instead of reading it. */
  call_t1(f, "__tensor_fetch", 7, &r);
  expect_fail(&r, "bad_args", "is on cuda:0");
  done(&r);
  tensor_new(f, 7, "f32", 4, &r);
  expect_fail(&r, "bad_args", "tensor 7 already exists");
  done(&r);
  call_t1(f, "__gpu_free", 7, &r);
  expect_ok(&r);
  assert_true(r.values->via.array.ptr[0].via.boolean);
  done(&r);
  assert_int_equal(F.live, 0);
  /* __tensor_free and closing the registry release device memory through the hooks too. */
  tensor_new(f, 8, "u8", 3, &r);
  expect_done(&r);
  tensor_new(f, 9, "f64", 0, &r);
  expect_done(&r);
  assert_int_equal(F.live, 2);
  call_t1(f, "__tensor_free", 8, &r);
  expect_done(&r);
  assert_int_equal(F.live, 1);
  mn_registry_close(&f->x.reg);
  assert_int_equal(F.live, 0);
}

static void test_allocation_failure_is_a_gpu_error(void **state) {
  fix_t *f = *state;
  reply_t r;
  F.fail_malloc = 1;
  tensor_new(f, 3, "f32", 1 << 20, &r);
  expect_fail(&r, "gpu", "cudaMalloc of 4194304 bytes on cuda:0 failed: out of memory");
  done(&r);
  assert_null(mn_tensor_get(&f->x.reg, 3));
  tensor_new(f, 3, "f32", -1, &r);
  expect_fail(&r, "bad_args", "invalid size -1");
  done(&r);
}

/* Makes communicator `comm` of nranks, as member `rank`; returns nothing. */
static void comm_init_n(fix_t *f, uint64_t comm, int nranks, int rank) {
  reply_t r;
  call_t c;
  call0(f, "__gpu_nccl_id", &r);
  expect_ok(&r);
  assert_int_equal(r.values->via.array.ptr[0].via.bin.size, MN_GPU_NCCL_ID_BYTES);
  char id[MN_GPU_NCCL_ID_BYTES];
  memcpy(id, r.values->via.array.ptr[0].via.bin.ptr, sizeof(id));
  done(&r);
  msgpack_packer *pk = begin(f, &c, "__gpu_nccl_init", 4);
  msgpack_pack_uint64(pk, comm);
  pack_bin(pk, id, sizeof(id));
  msgpack_pack_int(pk, nranks);
  msgpack_pack_int(pk, rank);
  run(f, &c, &r);
  expect_done(&r);
}

static void comm_init(fix_t *f, uint64_t comm) { comm_init_n(f, comm, 1, 0); }

static void coll(fix_t *f, const char *name, uint64_t comm, uint64_t a, uint64_t b, const char *op, reply_t *r) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, name, 2 + (b != 0) + (op != NULL));
  msgpack_pack_uint64(pk, comm);
  pack_tensor(pk, a);
  if (b) pack_tensor(pk, b);
  if (op) mn_pack_cstr(pk, op);
  run(f, &c, r);
}

/* Communicator 41 of one rank and GPU tensors 1 and 2, f32[6], that the
 * collectives tests work on. */
static void comm_with_two_tensors(fix_t *f) {
  reply_t r;
  comm_init(f, 41);
  assert_int_equal(F.comms, 1);
  tensor_new(f, 1, "f32", 6, &r);
  expect_done(&r);
  tensor_new(f, 2, "f32", 6, &r);
  expect_done(&r);
}

static void test_all_reduce_reaches_nccl(void **state) {
  fix_t *f = *state;
  reply_t r;
  int64_t shape[1] = {6};
  char err[128];
  comm_with_two_tensors(f);
  mk_tensor_t *t1 = mn_tensor_get(&f->x.reg, 1);
  coll(f, "__gpu_all_reduce", 41, 1, 0, "max", &r);
  expect_done(&r);
  assert_int_equal(F.last_count, 6);
  assert_int_equal(F.last_dtype, 7);
  assert_int_equal(F.last_op, 2);
  assert_ptr_equal(F.last_send, t1->data);
  assert_ptr_equal(F.last_recv, t1->data);
  coll(f, "__gpu_all_reduce", 41, 1, 0, "prod", &r);
  expect_fail(&r, "bad_args", "argument 3 must be a reduction: \"sum\", \"max\", \"min\" or \"avg\"");
  done(&r);
  coll(f, "__gpu_all_reduce", 42, 1, 0, "sum", &r);
  expect_fail(&r, "bad_args", "communicator 42 does not exist on this proc");
  done(&r);
  assert_non_null(mn_tensor_new(&f->x.reg, 3, MK_F32, 1, shape, err, sizeof(err)));
  coll(f, "__gpu_all_reduce", 41, 3, 0, "sum", &r);
  expect_fail(&r, "bad_args", "tensor 3 is on the CPU");
  done(&r);
}

/* __gpu_broadcast(comm, tensor 2, root). */
static void broadcast(fix_t *f, int root, reply_t *r) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, "__gpu_broadcast", 3);
  msgpack_pack_uint64(pk, 41);
  pack_tensor(pk, 2);
  msgpack_pack_int(pk, root);
  run(f, &c, r);
}

static void test_broadcast_reaches_nccl(void **state) {
  fix_t *f = *state;
  reply_t r;
  comm_with_two_tensors(f);
  broadcast(f, 0, &r);
  expect_done(&r);
  assert_int_equal(F.last_root, 0);
  broadcast(f, 1, &r);
  expect_fail(&r, "bad_args", "argument 3 must be the root rank, 0..0");
  done(&r);
}

/* One rank: gather and scatter sides have the same size, but must be separate tensors. */
static void test_gather_and_scatter_reach_nccl(void **state) {
  fix_t *f = *state;
  reply_t r;
  comm_with_two_tensors(f);
  mk_tensor_t *t1 = mn_tensor_get(&f->x.reg, 1), *t2 = mn_tensor_get(&f->x.reg, 2);
  coll(f, "__gpu_all_gather", 41, 1, 2, NULL, &r);
  expect_done(&r);
  assert_ptr_equal(F.last_send, t1->data);
  assert_ptr_equal(F.last_recv, t2->data);
  coll(f, "__gpu_all_gather", 41, 1, 1, NULL, &r);
  expect_fail(&r, "bad_args", "recv must be a separate f32 tensor of 1 x 6 elements");
  done(&r);
  tensor_new(f, 4, "f32", 5, &r);
  expect_done(&r);
  coll(f, "__gpu_reduce_scatter", 41, 4, 1, "sum", &r);
  expect_fail(&r, "bad_args", "send must be a separate f32 tensor of 1 x 6 elements (1 ranks), got f32 of 5");
  done(&r);
  coll(f, "__gpu_reduce_scatter", 41, 2, 1, "avg", &r);
  expect_done(&r);
  assert_int_equal(F.last_op, 4);
}

static void test_nccl_failure_and_free(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  comm_with_two_tensors(f);
  /* NCCL's own failure comes back with its message and last error. */
  F.nccl_rc = 5;
  coll(f, "__gpu_all_reduce", 41, 1, 0, "sum", &r);
  expect_fail(&r, "gpu", "__gpu_all_reduce failed: invalid usage (Duplicate GPU detected)");
  done(&r);
  F.nccl_rc = 0;

  call_t1(f, "__gpu_nccl_free", 41, &r); /* an id, not a tensor: refused */
  expect_fail(&r, "bad_args", "__gpu_nccl_free takes a communicator id");
  done(&r);
  msgpack_packer *pk = begin(f, &c, "__gpu_nccl_free", 1);
  msgpack_pack_uint64(pk, 41);
  run(f, &c, &r);
  expect_ok(&r);
  assert_true(r.values->via.array.ptr[0].via.boolean);
  done(&r);
  assert_int_equal(F.comms, 0);
}

static void test_nccl_init_checks_its_arguments(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  char id[MN_GPU_NCCL_ID_BYTES];
  memset(id, 0xab, sizeof(id));
  msgpack_packer *pk = begin(f, &c, "__gpu_nccl_init", 4);
  msgpack_pack_uint64(pk, 1);
  pack_bin(pk, id, 5);
  msgpack_pack_int(pk, 2);
  msgpack_pack_int(pk, 0);
  run(f, &c, &r);
  expect_fail(&r, "bad_args", "the NCCL id must be 128 bytes, got 5");
  done(&r);
  pk = begin(f, &c, "__gpu_nccl_init", 4);
  msgpack_pack_uint64(pk, 1);
  pack_bin(pk, id, sizeof(id));
  msgpack_pack_int(pk, 2);
  msgpack_pack_int(pk, 2);
  run(f, &c, &r);
  expect_fail(&r, "bad_args", "rank 2 is outside 0..nranks-1 (nranks 2)");
  done(&r);
  comm_init(f, 1);
  comm_init(f, 2);
  pk = begin(f, &c, "__gpu_nccl_init", 4);
  msgpack_pack_uint64(pk, 1);
  pack_bin(pk, id, sizeof(id));
  msgpack_pack_int(pk, 1);
  msgpack_pack_int(pk, 0);
  run(f, &c, &r);
  expect_fail(&r, "bad_args", "communicator 1 already exists");
  done(&r);
  id[0] = 0; /* the fake refuses ids it did not make */
  pk = begin(f, &c, "__gpu_nccl_init", 4);
  msgpack_pack_uint64(pk, 3);
  pack_bin(pk, id, sizeof(id));
  msgpack_pack_int(pk, 1);
  msgpack_pack_int(pk, 0);
  run(f, &c, &r);
  expect_fail(&r, "gpu", "ncclCommInitRank failed");
  done(&r);
  assert_int_equal(F.comms, 2);
}

/* A collective whose peers never come is aborted, not waited on forever. */
static void test_stuck_collective_aborts_its_communicator(void **state) {
  fix_t *f = *state;
  reply_t r;
  comm_init(f, 5);
  tensor_new(f, 1, "i64", 3, &r);
  expect_done(&r);
  setenv("MONARCH_GPU_TIMEOUT", "0.05", 1);
  F.not_ready = 1;
  coll(f, "__gpu_all_reduce", 5, 1, 0, "sum", &r);
  expect_fail(&r, "gpu", "__gpu_all_reduce on communicator 5 timed out after 0 s (did every rank join?); communicator aborted");
  done(&r);
  assert_int_equal(F.aborted, 1);
  assert_int_equal(F.last_dtype, 4);
  coll(f, "__gpu_all_reduce", 5, 1, 0, "sum", &r);
  expect_fail(&r, "bad_args", "communicator 5 does not exist");
  done(&r);
  comm_init(f, 6);
  atomic_store(&f->cancel, 1);
  coll(f, "__gpu_all_reduce", 6, 1, 0, "min", &r);
  expect_fail(&r, "cancelled", "on communicator 6 cancelled");
  done(&r);
  assert_int_equal(F.aborted, 2);
  assert_int_equal(F.comms, 0);
}

/* ---- collectives kernels call, on GPU tensors ------------------------------------------
 * The kcoll library's kernels (kc_all_reduce ...) on a group of two whose
 * CPU half is a fake (exec.h's mn_exec_coll_t): it records what the
 * executor asks of it and plays member 1, who describes the same call as
 * member 0 (this proc) or, with peer_differs, a broadcast instead. */
static struct {
  int calls[MN_KCOLL_FENCE + 1];
  int aborted;
  int peer_differs;
} C;

static int fc_group(mn_exec_t *x, uint64_t gid, mk_group_t *g, char *err, size_t errlen) {
  g->id = gid, g->rank = 0, g->size = 2;
  return 0;
}
static int fc_run(mn_exec_t *x, const mn_kcoll_t *k, char *err, size_t errlen, int *mismatch) {
  C.calls[k->what]++;
  if (k->what == MN_KCOLL_ALL_GATHER) { /* the members' descriptions of a GPU collective */
    memcpy(k->dst->data, k->t->data, k->t->nbytes);
    memcpy((char *)k->dst->data + k->t->nbytes, k->t->data, k->t->nbytes);
    int64_t *peer = (int64_t *)((char *)k->dst->data + k->t->nbytes);
    peer[0] = 1;
    if (C.peer_differs) peer[1] = MN_KCOLL_BROADCAST, peer[2] = 1;
  }
  return 0;
}
static void fc_abort(mn_exec_t *x, uint64_t gid, const char *why) { C.aborted++; }
static const mn_exec_coll_t fake_coll = {fc_group, fc_run, fc_abort};

/* A fixture with the fake group, kcoll loaded, GPU group 77 (a communicator of two ranks), and GPU tensors 1
 * (f32 x 6), 2 (f32 x 12) and CPU tensor 3 (f32 x 6). */
static int setup_kcoll(void **state) {
  if (setup_fake(state) != 0) return -1;
  fix_t *f = *state;
  reply_t r;
  call_t c;
  char path[1024], err[128];
  int64_t shape[1] = {6};
  const char *dir = getenv("MONARCH_KERNEL_DIR");
  snprintf(path, sizeof(path), "%s/kcoll.so", dir ? dir : "build/lib/monarch");
  memset(&C, 0, sizeof(C));
  mn_exec_set_coll(&fake_coll);
  mn_pack_cstr(begin(f, &c, "__load", 1), path);
  run(f, &c, &r);
  expect_done(&r);
  comm_init_n(f, 77, 2, 0);
  tensor_new(f, 1, "f32", 6, &r);
  expect_done(&r);
  tensor_new(f, 2, "f32", 12, &r);
  expect_done(&r);
  return mn_tensor_new(&f->x.reg, 3, MK_F32, 1, shape, err, sizeof(err)) != NULL ? 0 : -1;
}
static int teardown_kcoll(void **state) {
  mn_exec_set_coll(NULL);
  return teardown(state);
}

/* kernel(g, a [, b] [, op | root]) */
static void kc(fix_t *f, const char *kernel, uint64_t g, uint64_t a, uint64_t b, const char *op, int root, reply_t *r) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, kernel, 1 + (a != 0) + (b != 0) + (op != NULL) + (root >= 0));
  msgpack_pack_uint64(pk, g);
  if (a) pack_tensor(pk, a);
  if (b) pack_tensor(pk, b);
  if (op) mn_pack_cstr(pk, op);
  if (root >= 0) msgpack_pack_int(pk, root);
  run(f, &c, r);
}

static void test_kernel_collectives_run_through_nccl(void **state) {
  fix_t *f = *state;
  reply_t r;
  mk_tensor_t *t1 = mn_tensor_get(&f->x.reg, 1), *t2 = mn_tensor_get(&f->x.reg, 2);
  kc(f, "kc_all_reduce", 77, 1, 0, "max", -1, &r);
  expect_done(&r);
  assert_int_equal(F.last_count, 6);
  assert_int_equal(F.last_dtype, 7);
  assert_int_equal(F.last_op, 2);
  assert_ptr_equal(F.last_send, t1->data);
  assert_ptr_equal(F.last_recv, t1->data);
  /* The members agreed on the call over the CPU group first, and met at the kernel's end there. */
  assert_int_equal(C.calls[MN_KCOLL_ALL_GATHER], 1);
  assert_int_equal(C.calls[MN_KCOLL_ALL_REDUCE], 0);
  assert_int_equal(C.calls[MN_KCOLL_FENCE], 1);
  kc(f, "kc_all_reduce", 77, 1, 0, "avg", -1, &r);
  expect_done(&r);
  assert_int_equal(F.last_op, 4);
  kc(f, "kc_broadcast", 77, 2, 0, NULL, 1, &r);
  expect_done(&r);
  assert_int_equal(F.last_root, 1);
  assert_int_equal(F.last_count, 12);
  kc(f, "kc_all_gather", 77, 1, 2, NULL, -1, &r);
  expect_done(&r);
  assert_int_equal(F.last_count, 6);
  assert_ptr_equal(F.last_send, t1->data);
  assert_ptr_equal(F.last_recv, t2->data);
  kc(f, "kc_reduce_scatter", 77, 2, 1, "sum", -1, &r);
  expect_done(&r);
  assert_int_equal(F.last_count, 6);
  assert_int_equal(F.last_op, 0);
  assert_ptr_equal(F.last_send, t2->data);
  assert_ptr_equal(F.last_recv, t1->data);
  /* A barrier drains the stream, then meets the others on the CPU group: no NCCL call. */
  F.last_count = 0;
  kc(f, "kc_barrier", 77, 0, 0, NULL, -1, &r);
  expect_done(&r);
  assert_int_equal(C.calls[MN_KCOLL_BARRIER], 1);
  assert_int_equal(F.last_count, 0);
  assert_int_equal(C.aborted, 0);
  assert_int_equal(F.comms, 1);
  /* Sizes that do not fit the group: all_gather of 6 into 6 on two members. */
  kc(f, "kc_all_gather", 77, 1, 1, NULL, -1, &r);
  expect_fail(&r, "collective", "all_gather: dst must be a separate f32 tensor of 2 x 6 elements (2 members)");
  done(&r);
  assert_int_equal(F.comms, 0); /* the group was given up on, its communicator with it */
  assert_int_equal(F.aborted, 1);
}

static void test_kernel_collectives_refuse_the_wrong_device(void **state) {
  fix_t *f = *state;
  reply_t r;
  kc(f, "kc_all_reduce", 77, 3, 0, "sum", -1, &r);
  expect_fail(&r, "collective", "all_reduce: the tensor is on the CPU but group 77 is a GPU group "
                                "(mesh:group{ gpu = true }); pass GPU tensors, or make a group with mesh:group()");
  done(&r);
  assert_true(C.aborted >= 1); /* the other members are told at once */
  assert_int_equal(F.comms, 0);
  kc(f, "kc_all_reduce", 78, 1, 0, "sum", -1, &r);
  expect_fail(&r, "collective", "all_reduce: the tensor is on cuda:0 but group 78 has no NCCL communicator; make the "
                                "group with mesh:group{ gpu = true }");
  done(&r);
  comm_init_n(f, 79, 2, 0);
  kc(f, "kc_all_gather", 79, 3, 2, NULL, -1, &r);
  expect_fail(&r, "collective", "all_gather: src is on the CPU but dst is on cuda:0; a collective's tensors must be "
                                "on one device");
  done(&r);
  assert_int_equal(F.comms, 0);
  assert_int_equal(F.last_count, 0); /* NCCL never ran */
}

static void test_kernel_collectives_that_differ_are_a_mismatch(void **state) {
  fix_t *f = *state;
  reply_t r;
  C.peer_differs = 1;
  kc(f, "kc_all_reduce", 77, 1, 0, "sum", -1, &r);
  expect_fail(&r, "collective_mismatch", "rank 1 called broadcast(root 1, f32) of 6 elements but rank 0 called "
                                         "all_reduce(sum, f32) of 6 elements on GPU group 77");
  done(&r);
  assert_int_equal(F.last_count, 0); /* NCCL never ran: it would have hung or mixed the data */
  assert_int_equal(F.comms, 0);
  assert_true(C.aborted >= 1);
}

/* A peer that aborts mid-collective (NCCL's async error), a stuck one (the timeout) and a cancel: each ends the wait. */
static void test_kernel_collective_fails_fast_when_a_peer_aborts(void **state) {
  fix_t *f = *state;
  reply_t r;
  F.hang = 1;
  F.async_rc = 6;
  double t0 = mn_now_s();
  kc(f, "kc_all_reduce", 77, 1, 0, "sum", -1, &r);
  expect_fail(&r, "collective", "all_reduce failed: remote process exited or there was a network error");
  done(&r);
  assert_true(mn_now_s() - t0 < 1.0); /* not MN_GPU_COLL_TIMEOUT_S */
  assert_int_equal(F.aborted, 1);
  assert_int_equal(F.comms, 0);
  assert_true(C.aborted >= 1);
  F.async_rc = 0;
  setenv("MONARCH_GPU_TIMEOUT", "0.05", 1);
  mn__gpu_reset(&fake_rt, &fake_nccl); /* forgets the cached timeout */
  comm_init_n(f, 77, 2, 0);
  F.not_ready = 1;
  kc(f, "kc_barrier", 77, 0, 0, NULL, -1, &r);
  expect_fail(&r, "collective", "barrier on communicator 77 timed out");
  done(&r);
  F.not_ready = 0;
  comm_init_n(f, 77, 2, 0);
  F.hang = 1;
  atomic_store(&f->cancel, 1);
  kc(f, "kc_all_reduce", 77, 1, 0, "sum", -1, &r);
  assert_false(r.ok);
  assert_string_equal(r.kind, "cancelled");
  done(&r);
  atomic_store(&f->cancel, 0);
  assert_int_equal(F.comms, 0);
}
#else
static void test_tensors_need_the_registry_hooks(void **state) {
  fix_t *f = *state;
  reply_t r;
  tensor_new(f, 7, "f32", 4, &r);
  expect_fail(&r, "bad_args", "GPU tensors need the registry's device hooks");
  done(&r);
}
#endif

int main(void) {
  if (mn_gpu_register() != 0 || mn_gpu_register() != 0) {
    fprintf(stderr, "test_gpu_tensors: cannot register the GPU built-ins\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
#ifdef MN_DEVICE_HOOKS
    cmocka_unit_test_setup_teardown(test_tensors_live_in_device_memory, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_allocation_failure_is_a_gpu_error, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_all_reduce_reaches_nccl, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_broadcast_reaches_nccl, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_gather_and_scatter_reach_nccl, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_nccl_failure_and_free, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_nccl_init_checks_its_arguments, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_stuck_collective_aborts_its_communicator, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_kernel_collectives_run_through_nccl, setup_kcoll, teardown_kcoll),
    cmocka_unit_test_setup_teardown(test_kernel_collectives_refuse_the_wrong_device, setup_kcoll, teardown_kcoll),
    cmocka_unit_test_setup_teardown(test_kernel_collectives_that_differ_are_a_mismatch, setup_kcoll, teardown_kcoll),
    cmocka_unit_test_setup_teardown(test_kernel_collective_fails_fast_when_a_peer_aborts, setup_kcoll, teardown_kcoll),
#else
    cmocka_unit_test_setup_teardown(test_tensors_need_the_registry_hooks, setup_fake, teardown),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
