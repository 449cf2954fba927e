/* coll_ops.c - the pure helpers of the CPU data plane: reduction ops, segments, step headers. */
#include "coll_int.h"

#define MN_COLL_BLOCK 16 /* elements per reduction block: a fixed trip count -O2 vectorizes */

/* ---- reduction ops ---------------------------------------------------------- */

static const char *const op_names[] = {"sum", "max", "min", "avg"};

int mn_coll_op_parse(const char *s, size_t n) {
  for (int i = 0; i < 4; i++)
    if (strlen(op_names[i]) == n && memcmp(s, op_names[i], n) == 0) return i;
  return MN_EINVAL;
}

const char *mn_coll_op_name(int op) { return op >= 0 && op < 4 ? op_names[op] : "?"; }

const char *mn_coll_kind_name(int kind) {
  switch (kind) {
  case MN_COLL_ALL_REDUCE: return "all_reduce";
  case MN_COLL_BROADCAST: return "broadcast";
  case MN_COLL_ALL_GATHER: return "all_gather";
  case MN_COLL_REDUCE_SCATTER: return "reduce_scatter";
  case MN_COLL_BARRIER: return "barrier";
  case MN_COLL_SEND: return "copy";
  case MN_COLL_ABORT: return "abort";
  case MN_COLL_KERNEL_END: return "return (the end of its kernel)";
  default: return "an unknown collective";
  }
}

int mn_coll_dtype_ok(mk_dtype_t dt) { return dt == MK_F32 || dt == MK_F64 || dt == MK_I32 || dt == MK_I64; }

/* `#pragma GCC ivdep`: out may equal a, which is safe element by element. */
#if defined(__GNUC__) && !defined(__clang__)
#define MN_IVDEP _Pragma("GCC ivdep")
#else
#define MN_IVDEP
#endif

/*
 * One reduction loop per dtype and op. The blocks of MN_COLL_BLOCK elements
 * have a fixed trip count, which is what lets gcc -O2 emit vector code.
 * Integer sums go through the unsigned type so that overflow wraps.
 */
#define MN_REDUCE_LOOP(T, EXPR)                                                  \
  do {                                                                           \
    T *o_ = out;                                                                 \
    const T *a_ = a, *b_ = b;                                                    \
    size_t i_ = 0;                                                               \
    for (; i_ + MN_COLL_BLOCK <= count; i_ += MN_COLL_BLOCK) {                   \
      MN_IVDEP for (size_t k_ = i_; k_ < i_ + MN_COLL_BLOCK; k_++) {             \
        T x = a_[k_], y = b_[k_];                                                \
        o_[k_] = (EXPR);                                                         \
      }                                                                          \
    }                                                                            \
    for (; i_ < count; i_++) {                                                   \
      T x = a_[i_], y = b_[i_];                                                  \
      o_[i_] = (EXPR);                                                           \
    }                                                                            \
  } while (0)

#define MN_REDUCE_TYPE(T, SUM)                                                   \
  do {                                                                           \
    if (op == MN_COLL_MAX) MN_REDUCE_LOOP(T, x > y ? x : y);                     \
    else if (op == MN_COLL_MIN) MN_REDUCE_LOOP(T, x < y ? x : y);                \
    else MN_REDUCE_LOOP(T, SUM);                                                 \
  } while (0)

void mn_coll_reduce(void *out, const void *a, const void *b, size_t count, mk_dtype_t dt, int op) {
  switch (dt) {
  case MK_F32: MN_REDUCE_TYPE(float, x + y); break;
  case MK_F64: MN_REDUCE_TYPE(double, x + y); break;
  case MK_I32: MN_REDUCE_TYPE(int32_t, (int32_t)((uint32_t)x + (uint32_t)y)); break;
  case MK_I64: MN_REDUCE_TYPE(int64_t, (int64_t)((uint64_t)x + (uint64_t)y)); break;
  default: break; /* callers check mn_coll_dtype_ok first */
  }
}

void mn_coll_divide(void *p, size_t count, mk_dtype_t dt, int n) {
  size_t i;
  switch (dt) {
  case MK_F32: for (i = 0; i < count; i++) ((float *)p)[i] /= (float)n; break;
  case MK_F64: for (i = 0; i < count; i++) ((double *)p)[i] /= (double)n; break;
  case MK_I32: for (i = 0; i < count; i++) ((int32_t *)p)[i] /= n; break;
  case MK_I64: for (i = 0; i < count; i++) ((int64_t *)p)[i] /= n; break;
  default: break;
  }
}

void mn_coll_segment(size_t count, int n, int i, size_t *first, size_t *len) {
  size_t base = count / (size_t)n, extra = count % (size_t)n, u = (size_t)i;
  *first = u * base + (u < extra ? u : extra);
  *len = base + (u < extra ? 1 : 0);
}

/* ---- step headers --------------------------------------------------------------- */


void mn_coll_hdr_pack(const mn_coll_hdr_t *h, unsigned char out[MN_COLL_HDR_LEN]) {
  memset(out, 0, MN_COLL_HDR_LEN);
  mn_put_be32((char *)out, MN_COLL_MAGIC);
  out[4] = h->kind;
  out[5] = h->op;
  out[6] = h->dtype;
  mn_put_be32((char *)out + 8, h->rank);
  mn_put_be32((char *)out + 12, h->root);
  mn__coll_put_be64(out + 16, h->seq);
  mn__coll_put_be64(out + 24, h->nbytes);
}

int mn_coll_hdr_unpack(const unsigned char in[MN_COLL_HDR_LEN], mn_coll_hdr_t *h) {
  if (mn_be32((const char *)in) != MN_COLL_MAGIC) return MN_EPROTO;
  h->kind = in[4];
  h->op = in[5];
  h->dtype = in[6];
  h->rank = mn_be32((const char *)in + 8);
  h->root = mn_be32((const char *)in + 12);
  h->seq = mn__coll_get_be64(in + 16);
  h->nbytes = mn__coll_get_be64(in + 24);
  return 0;
}

/* "all_reduce(sum, f32) of 4096 bytes" */
static void describe_hdr(const mn_coll_hdr_t *h, char *buf, size_t n) {
  const char *k = mn_coll_kind_name(h->kind), *dt = mn_dtype_name((mk_dtype_t)h->dtype);
  unsigned long long b = (unsigned long long)h->nbytes;
  switch (h->kind) {
  case MN_COLL_ALL_REDUCE:
  case MN_COLL_REDUCE_SCATTER: snprintf(buf, n, "%s(%s, %s) of %llu bytes", k, mn_coll_op_name(h->op), dt, b); break;
  case MN_COLL_BROADCAST: snprintf(buf, n, "%s(root %u, %s) of %llu bytes", k, h->root, dt, b); break;
  case MN_COLL_BARRIER:
  case MN_COLL_KERNEL_END: snprintf(buf, n, "%s", k); break;
  default: snprintf(buf, n, "%s(%s) of %llu bytes", k, dt, b); break;
  }
}

int mn_coll_hdr_check(const mn_coll_hdr_t *mine, const mn_coll_hdr_t *theirs, char *err, size_t errlen) {
  int reduces = mine->kind == MN_COLL_ALL_REDUCE || mine->kind == MN_COLL_REDUCE_SCATTER;
  if (mine->kind == theirs->kind && mine->dtype == theirs->dtype && mine->nbytes == theirs->nbytes &&
      mine->seq == theirs->seq && (!reduces || mine->op == theirs->op) &&
      (mine->kind != MN_COLL_BROADCAST || mine->root == theirs->root))
    return 0;
  char a[128], b[128];
  describe_hdr(theirs, a, sizeof(a));
  describe_hdr(mine, b, sizeof(b));
  if (mine->seq != theirs->seq)
    snprintf(err, errlen, "rank %u called %s as collective #%llu of the group but rank %u called %s as #%llu",
             theirs->rank, a, (unsigned long long)theirs->seq, mine->rank, b, (unsigned long long)mine->seq);
  else
    snprintf(err, errlen, "rank %u called %s but rank %u called %s (collective #%llu of the group)", theirs->rank,
             a, mine->rank, b, (unsigned long long)mine->seq);
  return MN_EPEER;
}
