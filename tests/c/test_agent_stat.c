/* test_agent_stat.c - what STATUS adds per proc for --top (host/agent/agent_stat.c, agent_gpu.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "agent_int.h"

#include <time.h>

/* A status line of p as take_status applies it: noted first, then taken. */
static void line(aproc_t *p, uint64_t executed, const char *running, uint64_t now) {
  mn__agent_stat_line(p, executed, running, now);
  p->executed = executed;
  snprintf(p->running, sizeof(p->running), "%s", running);
}

static void a_call_runs_from_the_first_line_that_shows_it(void **state) {
  aproc_t p;
  memset(&p, 0, sizeof(p));
  snprintf(p.running, sizeof(p.running), "-");
  line(&p, 0, "-", 500);
  assert_int_equal(p.running_since, 0);
  line(&p, 0, "sleep", 1000);
  assert_int_equal(p.running_since, 1000);
  line(&p, 0, "sleep", 2000); /* the same call still */
  assert_int_equal(p.running_since, 1000);
  line(&p, 1, "sleep", 3000); /* one finished: the one running is another */
  assert_int_equal(p.running_since, 3000);
  line(&p, 1, "noop", 4000);
  assert_int_equal(p.running_since, 4000);
  line(&p, 2, "-", 5000);
  assert_int_equal(p.running_since, 0);
}

/* Packs the stat fields of p as process pid into a map and returns it decoded (in zone z). */
static msgpack_object packed(const aproc_t *p, int64_t pid, uint64_t now, msgpack_zone *z, msgpack_sbuffer *sb) {
  msgpack_packer pk;
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, MN_STAT_FIELDS);
  mn__agent_stat_pack(&pk, p, pid, now);
  msgpack_object o;
  msgpack_zone_init(z, 1024);
  assert_int_equal(msgpack_unpack(sb->data, sb->size, NULL, z, &o), MSGPACK_UNPACK_SUCCESS);
  assert_int_equal(o.type, MSGPACK_OBJECT_MAP);
  assert_int_equal(o.via.map.size, MN_STAT_FIELDS);
  return o;
}

static const msgpack_object *field(const msgpack_object *m, const char *key) {
  for (uint32_t i = 0; i < m->via.map.size; i++) {
    const msgpack_object *k = &m->via.map.ptr[i].key;
    if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) && memcmp(k->via.str.ptr, key, k->via.str.size) == 0)
      return &m->via.map.ptr[i].val;
  }
  fail_msg("no field %s", key);
  return NULL;
}

static void a_live_process_has_cpu_and_memory(void **state) {
  aproc_t p;
  memset(&p, 0, sizeof(p));
  p.reported = 1;
  p.running_since = 1000;
  p.last_status = 2500;
  clock_t t0 = clock();
  while (clock() - t0 < CLOCKS_PER_SEC / 20) { /* 50 ms of CPU time, a few of the kernel's ticks */
  }
  msgpack_zone z;
  msgpack_sbuffer sb;
  msgpack_object m = packed(&p, getpid(), 3000, &z, &sb);
  assert_int_equal(field(&m, "cpu")->type, MSGPACK_OBJECT_FLOAT64);
  assert_true(field(&m, "cpu")->via.f64 > 0);
  assert_int_equal(field(&m, "rss")->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
  assert_true(field(&m, "rss")->via.u64 > 100 * 1024); /* this test's own pages */
  assert_int_equal(field(&m, "gpu_mem")->type, MSGPACK_OBJECT_NIL);
  assert_true(field(&m, "running_for")->via.f64 == 2.0);
  assert_true(field(&m, "status_age")->via.f64 == 0.5);
  assert_false(field(&m, "hung")->via.boolean);
  assert_true(field(&m, "ready")->via.boolean);
  msgpack_zone_destroy(&z);
  msgpack_sbuffer_destroy(&sb);
}

static void a_gone_process_is_unknown(void **state) {
  aproc_t p;
  memset(&p, 0, sizeof(p));
  msgpack_zone z;
  msgpack_sbuffer sb;
  msgpack_object m = packed(&p, 0x7ffffff0, 3000, &z, &sb); /* above any pid_max */
  assert_int_equal(field(&m, "cpu")->type, MSGPACK_OBJECT_NIL);
  assert_int_equal(field(&m, "rss")->type, MSGPACK_OBJECT_NIL);
  assert_true(field(&m, "running_for")->via.f64 == 0.0);
  assert_false(field(&m, "ready")->via.boolean);
  msgpack_zone_destroy(&z);
  msgpack_sbuffer_destroy(&sb);
}

/* Writes the fake NVML's process list and runs one query to its end. */
static void query_fake(uv_loop_t *loop, const char *path, const char *list) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(list, f);
  fclose(f);
  mn__agent_gpu_refresh(loop);
  assert_int_equal(uv_run(loop, UV_RUN_DEFAULT), 0); /* returns once the query is back */
}

static void gpu_memory_comes_from_nvml_per_pid(void **state) {
  char lib[512], list[64], path[] = "/tmp/monarch-test-nvml-XXXXXX";
  const char *b = getenv("MONARCH_BUILD");
  snprintf(lib, sizeof(lib), "%s/tests/libmonarch_fakenvml.so", b && *b ? b : "build");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  setenv("MONARCH_NVML", lib, 1);
  setenv("MONARCH_FAKE_NVML", path, 1);
  uv_loop_t loop;
  uv_loop_init(&loop);
  assert_int_equal(mn__agent_gpu_bytes(getpid()), -1); /* nothing asked yet */
  /* A process on the device twice (two contexts) counts once, summed. */
  snprintf(list, sizeof(list), "%d 1000\n77 5\n%d 24\n", (int)getpid(), (int)getpid());
  query_fake(&loop, path, list);
  assert_int_equal(mn__agent_gpu_bytes(getpid()), 1024);
  assert_int_equal(mn__agent_gpu_bytes(77), 5);
  assert_int_equal(mn__agent_gpu_bytes(78), -1);
  query_fake(&loop, path, "77 6\n"); /* each query replaces the last */
  assert_int_equal(mn__agent_gpu_bytes(getpid()), -1);
  assert_int_equal(mn__agent_gpu_bytes(77), 6);
  assert_int_equal(uv_loop_close(&loop), 0);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_call_runs_from_the_first_line_that_shows_it),
      cmocka_unit_test(a_live_process_has_cpu_and_memory),
      cmocka_unit_test(a_gone_process_is_unknown),
      cmocka_unit_test(gpu_memory_comes_from_nvml_per_pid),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
