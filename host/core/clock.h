/*
 * clock.h - the one monotonic clock of the C code: CLOCK_MONOTONIC, for
 * deadlines, timeouts, spins and elapsed times (never wall-clock time).
 *
 * Values are signed so that `deadline - mn_now_ms()` simply goes negative
 * once a deadline has passed. The agent's and controller's libuv timers
 * keep using uv_now(): that is the loop's cached time, taken once per loop
 * iteration, which is what a timer armed on that loop must compare with.
 */
#ifndef MN_CLOCK_H
#define MN_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t mn_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for CLOCK_MONOTONIC with a valid pointer */
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t mn_now_us(void) { return mn_now_ns() / 1000; }
static inline int64_t mn_now_ms(void) { return mn_now_ns() / 1000000; }
static inline double mn_now_s(void) { return (double)mn_now_ns() * 1e-9; }

/*
 * The CLOCK_MONOTONIC time ms milliseconds from now, as the absolute
 * timespec pthread_cond_timedwait takes on a condition variable whose
 * clock was set to CLOCK_MONOTONIC (pthread_condattr_setclock).
 */
static inline struct timespec mn_deadline_ts(int64_t ms) {
  int64_t at = mn_now_ns() + ms * 1000000;
  struct timespec ts = {(time_t)(at / 1000000000), (long)(at % 1000000000)};
  return ts;
}

#endif
