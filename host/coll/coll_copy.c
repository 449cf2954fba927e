/* coll_copy.c - proc-to-proc tensor copies over the data port; see collective.h. */
#include "coll_int.h"

/* ---- proc-to-proc copies ----------------------------------------------------------------- */

/*
 * Reads a header; 0 for any header but ABORT. Else with err: MN_ETIMEDOUT,
 * the link's code, MN_EPROTO for bytes that are no header, or MN_EPEER for
 * ABORT (its reason goes into err).
 */
static int read_reply(int fd, mn_coll_hdr_t *h, int64_t deadline, const char *who, char *err, size_t errlen) {
  unsigned char b[MN_COLL_HDR_LEN];
  int rc = mn__coll_read_exact(fd, b, sizeof(b), deadline);
  if (rc == MN_ETIMEDOUT) {
    snprintf(err, errlen, "copy: %s did not run the matching recv within the timeout (MONARCH_COLL_TIMEOUT)", who);
    return rc;
  }
  if (rc != 0) return mn__coll_fail_io(err, errlen, "copy", who, 0, rc);
  if (mn_coll_hdr_unpack(b, h) != 0) {
    snprintf(err, errlen, "copy: %s answered with something that is not a step header", who);
    return MN_EPROTO;
  }
  if (h->kind == MN_COLL_ABORT) {
    char reason[MN_COLL_MAX_ABORT_MSG + 1];
    size_t rl = h->nbytes > MN_COLL_MAX_ABORT_MSG ? 0 : (size_t)h->nbytes;
    if (mn__coll_read_exact(fd, reason, rl, mn_now_ms() + 1000) != 0) rl = 0;
    reason[rl] = '\0';
    snprintf(err, errlen, "copy refused by %s: %s", who, rl ? reason : "(no reason given)");
    return MN_EPEER;
  }
  return 0;
}

int mn_coll_send(mn_coll_t *c, const mk_tensor_t *t, const char *addr, uint64_t tag, char *err, size_t errlen) {
  char why[512], who[MN_COLL_MAX_ADDR + 16];
  mn_coll_hdr_t h;
  int rc = mn__coll_check_cpu(t, "copy", "the source tensor", err, errlen);
  if (rc != 0) return rc;
  snprintf(who, sizeof(who), "the proc at %s", addr);
  int fd = mn__coll_link_open(c, addr, MN_COLL_LINK_P2P, tag, (uint32_t)(c->rank < 0 ? 0 : c->rank), t->nbytes, (int)t->dtype,
                              t->data, why, sizeof(why));
  if (fd < 0) {
    snprintf(err, errlen, "copy: %s", why);
    return fd;
  }
  if ((rc = read_reply(fd, &h, mn_now_ms() + c->timeout_ms, who, err, errlen)) != 0) goto done;
  int64_t wait = c->timeout_ms;
  if (h.op == MN_COLL_COPY_PULL) {
    wait += (int64_t)(t->nbytes / MN_COLL_PULL_MIN_RATE * 1000); /* it is copying from our memory meanwhile */
  } else {
    xfer_t x = {fd, 1, t->data, t->nbytes, 0, who};
    if ((rc = mn__coll_xfer_run(c, &x, 1, "copy", err, errlen)) != 0) goto done;
  }
  /* The receiver confirms once every byte has landed; until then our memory must stay as it is. */
  rc = read_reply(fd, &h, mn_now_ms() + wait, who, err, errlen);
done:
  close(fd);
  return rc;
}

/*
 * Copies n bytes from pid's memory at addr into dst, in chunks so
 * cancellation is seen. 0, or with err: MN_ECANCELED, -errno from
 * process_vm_readv, or MN_EPEER when it read nothing.
 */
static int pull_copy(mn_coll_t *c, pid_t pid, char *dst, uint64_t addr, size_t n, const char *who, char *err,
                     size_t errlen) {
  size_t done = 0;
  while (done < n) {
    if (mn__coll_cancelled(c)) {
      snprintf(err, errlen, "copy cancelled");
      return MN_ECANCELED;
    }
    size_t want = n - done > MN_COLL_PULL_CHUNK ? MN_COLL_PULL_CHUNK : n - done;
    struct iovec local = {dst + done, want}, remote = {(void *)(uintptr_t)(addr + done), want};
    ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      int e = got < 0 ? errno : 0;
      if (e == EINTR) continue;
      snprintf(err, errlen, "copy: reading the source tensor of %s failed: %s (it failed or died)", who,
               e != 0 ? strerror(e) : "nothing read");
      return e != 0 ? -e : MN_EPEER;
    }
    done += (size_t)got;
  }
  return 0;
}

int mn_coll_recv(mn_coll_t *c, mk_tensor_t *t, uint64_t tag, char *err, size_t errlen) {
  parked_t e;
  char who[64];
  unsigned char b[MN_COLL_HDR_LEN];
  int rc = mn__coll_check_cpu(t, "copy", "the destination tensor", err, errlen);
  if (rc != 0) return rc;
  rc = mn__coll_claim(c, MN_COLL_LINK_P2P, tag, -1, &e);
  if (rc != 0) {
    if (rc == MN_ECANCELED) snprintf(err, errlen, "copy (tag %llu): cancelled", (unsigned long long)tag);
    else
      snprintf(err, errlen, "copy (tag %llu): no sender connected within %g s (MONARCH_COLL_TIMEOUT)",
               (unsigned long long)tag, c->timeout_ms / 1000.0);
    return rc;
  }
  snprintf(who, sizeof(who), "rank %u", e.from);
  mn_coll_hdr_t h = {MN_COLL_SEND, 0, (uint8_t)t->dtype, (uint32_t)c->rank, 0, tag, t->nbytes};
  int64_t deadline = mn_now_ms() + c->timeout_ms;
  if (e.nbytes != t->nbytes || e.dtype != (int)t->dtype) {
    rc = MN_EPEER; /* the two ends disagree */
    snprintf(err, errlen, "copy: rank %u sends %s data of %llu bytes but the destination tensor on rank %d is %s of %zu bytes",
             e.from, mn_dtype_name((mk_dtype_t)e.dtype), (unsigned long long)e.nbytes, c->rank, mn_dtype_name(t->dtype),
             t->nbytes);
    size_t ml = strlen(err) > MN_COLL_MAX_ABORT_MSG ? MN_COLL_MAX_ABORT_MSG : strlen(err);
    mn_coll_hdr_t a = {.kind = MN_COLL_ABORT, .rank = (uint32_t)c->rank, .seq = tag, .nbytes = ml};
    mn_coll_hdr_pack(&a, b);
    if (mn__coll_write_exact(e.fd, b, sizeof(b), deadline) == 0 && mn__coll_write_exact(e.fd, err, ml, deadline) != 0) {
      /* The sender sees the close instead. */
    }
    goto done;
  }
  /* On one host we copy straight out of the sender's tensor: one copy instead of TCP's two. */
  int pull = t->nbytes >= MN_COLL_CMA_MIN && mn__coll_same_host(c, e.pid, e.cookie_addr, e.cookie);
  h.op = pull ? MN_COLL_COPY_PULL : 0;
  mn_coll_hdr_pack(&h, b);
  if ((rc = mn__coll_write_exact(e.fd, b, sizeof(b), deadline)) != 0) {
    rc = mn__coll_fail_io(err, errlen, "copy", who, 1, rc);
    goto done;
  }
  if (pull) {
    if ((rc = pull_copy(c, (pid_t)e.pid, t->data, e.addr, t->nbytes, who, err, errlen)) != 0) goto done;
  } else {
    xfer_t x = {e.fd, 0, t->data, t->nbytes, 0, who};
    if ((rc = mn__coll_xfer_run(c, &x, 1, "copy", err, errlen)) != 0) goto done;
  }
  if ((rc = mn__coll_write_exact(e.fd, b, sizeof(b), mn_now_ms() + c->timeout_ms)) != 0)
    rc = mn__coll_fail_io(err, errlen, "copy", who, 1, rc);
done:
  close(e.fd);
  return rc;
}
