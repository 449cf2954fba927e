/*
 * trace.h - the proc's side of the job's timeline (docs/tracing.md): a
 * fixed ring of spans (calls, collectives a kernel runs, kernels an actor
 * runs) that the executor thread records and the __trace built-in hands to
 * the controller (lua/monarch/trace.lua), which aligns the clocks and
 * writes the trace.
 *
 * Only the executor thread records, and __trace runs on it too, so the ring
 * needs no lock. While tracing is off a call pays one branch on `on`; while
 * it is on, two clock reads and one ring slot, never an allocation.
 */
#ifndef MN_TRACE_H
#define MN_TRACE_H

#include "clock.h"

#include <stddef.h>
#include <stdint.h>

#define MN_TRACE_NAME 52                 /* bytes of a span's name kept; a longer name is cut */
#define MN_TRACE_SPANS_DEFAULT (1u << 16) /* ring size when __trace("start") names none: 6 MiB */
#define MN_TRACE_SPANS_MAX (1u << 20)     /* largest ring a start may ask for: 96 MiB */
#define MN_TRACE_TAKE_MAX (1u << 14)      /* most spans one __trace("take") returns: 1.5 MiB */
#define MN_TRACE_REC 96                   /* bytes of one span as __trace("take") packs it */

/* What a span is; the controller names its category from it. */
typedef enum {
  MN_TRACE_CALL = 0,     /* a CALL: a kernel or a built-in */
  MN_TRACE_ENDPOINT = 1, /* a CALL that ran an actor endpoint (its name is "actor.endpoint") */
  MN_TRACE_KCOLL = 2,    /* a collective a kernel called (mk_all_reduce, ...), inside its CALL */
  MN_TRACE_KCALL = 3,    /* a kernel an actor ran with proc.call, inside its CALL */
} mn_trace_kind_t;

/* One span. Packed for the wire as MN_TRACE_REC little-endian bytes in this order (mn_trace_take). */
typedef struct {
  int64_t t0, t1;        /* start and end on the trace clock, ns */
  uint64_t seq;          /* the CALL's sequence number in its session; 0 for a span inside a call */
  uint64_t tensor_bytes; /* bytes of the tensors it was given (a collective's payload) */
  uint32_t bytes_in;     /* bytes of the CALL frame */
  uint32_t bytes_out;    /* bytes of its RESULT frame, payload included */
  uint8_t kind;          /* mn_trace_kind_t */
  uint8_t failed;        /* 1 when it answered with an error */
  uint8_t name_len;
  uint8_t pad;
  char name[MN_TRACE_NAME];
} mn_trace_span_t;

typedef struct {
  int on;                 /* the one branch the hot path takes */
  mn_trace_span_t *ring;  /* cap slots, made by the first start, freed by mn_trace_close */
  uint32_t cap;
  uint32_t head;          /* slot of the oldest span not yet taken */
  uint32_t count;         /* spans not yet taken */
  uint64_t dropped;       /* spans overwritten (the ring was full) before they were taken */
  int64_t skew_ns;        /* added to the clock: MONARCH_TRACE_SKEW_NS x rank, for tests of the alignment */
  uint8_t label_len;      /* a name the running call gave itself (mn_trace_label); 0: none */
  uint8_t label_kind;
  char label[MN_TRACE_NAME];
} mn_trace_t;

/* The trace clock: CLOCK_MONOTONIC (plus the test skew), ns. */
static inline int64_t mn_trace_now(const mn_trace_t *t) { return mn_now_ns() + t->skew_ns; }

/* Zeroes t, reading MONARCH_TRACE_SKEW_NS for the proc of this rank. Never fails. */
void mn_trace_init(mn_trace_t *t, int rank);
/* Frees the ring. */
void mn_trace_close(mn_trace_t *t);
/*
 * Starts recording. The first start makes a ring of cap spans (0: the
 * default); later ones keep the ring they find, with its spans. Returns 0,
 * or MN_EINVAL (cap over MN_TRACE_SPANS_MAX) or MN_ENOMEM with err.
 */
int mn_trace_start(mn_trace_t *t, uint32_t cap, char *err, size_t errlen);
/* Stops recording; the spans stay until taken. */
static inline void mn_trace_stop(mn_trace_t *t) { t->on = 0; }

/*
 * A new span of `kind` named name[0..nl) (cut to MN_TRACE_NAME) from t0 to
 * now, its other fields zero, for the caller to complete. Overwrites the
 * oldest span when the ring is full. Only while t->on.
 */
mn_trace_span_t *mn_trace_push(mn_trace_t *t, mn_trace_kind_t kind, const char *name, size_t nl, int64_t t0);
/* The running call names its span "a.b" (an actor endpoint: kind MN_TRACE_ENDPOINT); only while t->on. */
void mn_trace_label(mn_trace_t *t, mn_trace_kind_t kind, const char *a, size_t al, const char *b, size_t bl);

/*
 * Moves up to max of the oldest spans into out (max x MN_TRACE_REC bytes),
 * packed little-endian; returns how many.
 */
uint32_t mn_trace_take(mn_trace_t *t, unsigned char *out, uint32_t max);

#endif
