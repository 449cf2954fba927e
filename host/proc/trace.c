/* trace.c - the proc's ring of spans; see trace.h. */
#include "trace.h"

#include "err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(mn_trace_span_t) == MN_TRACE_REC, "a span is packed as MN_TRACE_REC bytes, field by field");

void mn_trace_init(mn_trace_t *t, int rank) {
  memset(t, 0, sizeof(*t));
  const char *skew = getenv("MONARCH_TRACE_SKEW_NS");
  if (skew != NULL) t->skew_ns = strtoll(skew, NULL, 10) * rank;
}

void mn_trace_close(mn_trace_t *t) {
  free(t->ring);
  t->ring = NULL;
  t->on = 0;
  t->cap = t->head = t->count = 0;
}

int mn_trace_start(mn_trace_t *t, uint32_t cap, char *err, size_t errlen) {
  if (cap > MN_TRACE_SPANS_MAX) {
    snprintf(err, errlen, "__trace: a ring of %u spans is over MN_TRACE_SPANS_MAX (%u)", cap, MN_TRACE_SPANS_MAX);
    return MN_EINVAL;
  }
  if (t->ring == NULL) {
    uint32_t n = cap > 0 ? cap : MN_TRACE_SPANS_DEFAULT;
    /* Allocated once, up front: recording a span must never allocate. */
    t->ring = calloc(n, sizeof(*t->ring));
    if (t->ring == NULL) {
      snprintf(err, errlen, "__trace: out of memory for a ring of %u spans (%zu MiB)", n,
               (size_t)n * sizeof(*t->ring) >> 20);
      return MN_ENOMEM;
    }
    t->cap = n;
  }
  t->on = 1;
  return 0;
}

static void copy_name(mn_trace_span_t *s, const char *name, size_t nl) {
  if (nl > MN_TRACE_NAME) nl = MN_TRACE_NAME;
  if (nl > 0) memcpy(s->name, name, nl);
  s->name_len = (uint8_t)nl;
}

mn_trace_span_t *mn_trace_push(mn_trace_t *t, mn_trace_kind_t kind, const char *name, size_t nl, int64_t t0) {
  uint32_t at = t->head + t->count;
  if (at >= t->cap) at -= t->cap;
  if (t->count == t->cap) { /* full: the oldest goes */
    t->head = t->head + 1 == t->cap ? 0 : t->head + 1;
    t->dropped++;
  } else {
    t->count++;
  }
  mn_trace_span_t *s = &t->ring[at];
  memset(s, 0, offsetof(mn_trace_span_t, name));
  s->kind = (uint8_t)kind;
  s->t0 = t0;
  s->t1 = mn_trace_now(t);
  copy_name(s, name, nl);
  return s;
}

void mn_trace_label(mn_trace_t *t, mn_trace_kind_t kind, const char *a, size_t al, const char *b, size_t bl) {
  int n = snprintf(t->label, sizeof(t->label), "%.*s.%.*s", (int)(al > MN_TRACE_NAME ? MN_TRACE_NAME : al), a,
                   (int)(bl > MN_TRACE_NAME ? MN_TRACE_NAME : bl), b);
  /* snprintf keeps a byte for its NUL, which the span does not store. */
  t->label_len = (uint8_t)(n < 0 ? 0 : n >= (int)sizeof(t->label) ? (int)sizeof(t->label) - 1 : n);
  t->label_kind = (uint8_t)kind;
}

static unsigned char *put_le(unsigned char *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
  return p + bytes;
}

/* s as MN_TRACE_REC bytes: the fields of mn_trace_span_t in order, little-endian, whatever this host is. */
static void pack(const mn_trace_span_t *s, unsigned char *p) {
  p = put_le(p, (uint64_t)s->t0, 8);
  p = put_le(p, (uint64_t)s->t1, 8);
  p = put_le(p, s->seq, 8);
  p = put_le(p, s->tensor_bytes, 8);
  p = put_le(p, s->bytes_in, 4);
  p = put_le(p, s->bytes_out, 4);
  *p++ = s->kind;
  *p++ = s->failed;
  *p++ = s->name_len;
  *p++ = 0;
  memset(p, 0, MN_TRACE_NAME);
  memcpy(p, s->name, s->name_len);
}

uint32_t mn_trace_take(mn_trace_t *t, unsigned char *out, uint32_t max) {
  uint32_t n = t->count < max ? t->count : max;
  for (uint32_t i = 0; i < n; i++) {
    pack(&t->ring[t->head], out + (size_t)i * MN_TRACE_REC);
    t->head = t->head + 1 == t->cap ? 0 : t->head + 1;
  }
  t->count -= n;
  return n;
}
