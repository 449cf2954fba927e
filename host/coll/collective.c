/* collective.c - groups and the collectives on them; see collective.h and docs/collectives.md. */
#include "coll_int.h"

/* ---- what each ring step moves ------------------------------------------------------------ */

/*
 * all_reduce: n-1 reduce-scatter steps (send segment me-j, reduce segment
 * me-j-1 into place), then n-1 all-gather steps (send segment me+1-k, land
 * segment me-k). What step j+1 sends is exactly what step j received.
 */
static void piece_all_reduce(const ring_t *r, int j, int sending, piece_t *p) {
  int n = r->n, seg;
  size_t first, len;
  if (j < n - 1) seg = sending ? mn__coll_mod(r->me - j, n) : mn__coll_mod(r->me - j - 1, n);
  else seg = sending ? mn__coll_mod(r->me + 1 - (j - n + 1), n) : mn__coll_mod(r->me - (j - n + 1), n);
  mn_coll_segment(r->count, n, seg, &first, &len);
  p->buf = r->data + first * r->esize;
  p->len = len * r->esize;
  p->a = !sending && j < n - 1 ? p->buf : NULL;
  p->divide = !sending && j == n - 2 && r->op == MN_COLL_AVG;
}

/* broadcast: one step; the root only sends, the member before it only receives. */
static void piece_broadcast(const ring_t *r, int j, int sending, piece_t *p) {
  p->buf = r->data;
  p->len = r->count * r->esize;
  p->a = NULL;
  p->divide = 0;
}

/* all_gather: n-1 steps; send block me-k, land block me-k-1 in dst. */
static void piece_all_gather(const ring_t *r, int k, int sending, piece_t *p) {
  int blk = sending ? mn__coll_mod(r->me - k, r->n) : mn__coll_mod(r->me - k - 1, r->n);
  p->len = r->count * r->esize;
  p->buf = r->data + (size_t)blk * p->len;
  p->a = NULL;
  p->divide = 0;
}

/*
 * reduce_scatter: n-1 steps. Receive step j reduces src block me-j-2 with
 * the incoming partial into buf[j % 2]; send step j>0 sends buf[(j-1) % 2],
 * step 0 sends src block me-1. The last step's buffer is dst.
 */
static void piece_reduce_scatter(const ring_t *r, int j, int sending, piece_t *p) {
  size_t bl = r->count * r->esize;
  p->len = bl;
  p->a = NULL;
  p->divide = 0;
  if (sending) {
    p->buf = j == 0 ? (char *)r->src + (size_t)mn__coll_mod(r->me - 1, r->n) * bl : r->buf[(j - 1) % 2];
  } else {
    p->buf = r->buf[j % 2];
    p->a = r->src + (size_t)mn__coll_mod(r->me - j - 2, r->n) * bl;
    p->divide = j == r->n - 2 && r->op == MN_COLL_AVG;
  }
}

/* ---- groups ------------------------------------------------------------------------------ */

group_t *mn__coll_group_find(mn_coll_t *c, uint64_t gid) {
  for (group_t *g = c->groups; g != NULL; g = g->next)
    if (g->id == gid) return g;
  return NULL;
}

void mn__coll_group_destroy(mn_coll_t *c, group_t *g) {
  for (group_t **pp = &c->groups; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == g) {
      *pp = g->next;
      c->ngroups--;
      break;
    }
  }
  mn__coll_close_fd(&g->next_fd);
  mn__coll_close_fd(&g->prev_fd);
  mn__coll_close_fd(&g->lnext_fd);
  mn__coll_close_fd(&g->lprev_fd);
  int nstar = g->me == 0 ? g->n : 1;
  for (int i = 0; g->star != NULL && i < nstar; i++) mn__coll_close_fd(&g->star[i]);
  for (int i = 0; g->addrs != NULL && i < g->n; i++) free(g->addrs[i]);
  mn_shm_close(g->shm);
  free(g->lmembers);
  free(g->addrs);
  free(g->ranks);
  free(g->star);
  free(g);
}

int mn_coll_group_layout(mn_coll_t *c, uint64_t gid) {
  group_t *g = mn__coll_group_find(c, gid);
  return g == NULL ? MN_ENOTFOUND : g->layout;
}

int mn_coll_group_free(mn_coll_t *c, uint64_t gid) {
  group_t *g = mn__coll_group_find(c, gid);
  if (g != NULL) mn__coll_group_destroy(c, g);
  return 0;
}

/* "rank 3 (host:port)" for member i. */
void mn__coll_member_name(const group_t *g, int i, char *buf, size_t n) {
  if (g->ranks[i] >= 0) snprintf(buf, n, "rank %d (%s)", g->ranks[i], g->addrs[i]);
  else snprintf(buf, n, "member %d (%s)", i, g->addrs[i]);
}

int mn__coll_claim_member(mn_coll_t *c, group_t *g, int kind, int from, int *fd, char *err, size_t errlen) {
  parked_t e;
  int rc = mn__coll_claim(c, kind, g->id, from, &e);
  if (rc == 0) {
    *fd = e.fd;
    return 0;
  }
  char who[MN_COLL_MAX_ADDR + 32];
  mn__coll_member_name(g, from, who, sizeof(who));
  if (rc == MN_ECANCELED)
    snprintf(err, errlen, "setting up group %llu: cancelled while waiting for %s", (unsigned long long)g->id, who);
  else
    snprintf(err, errlen, "setting up group %llu: %s did not connect within %g s (it must join the group too)",
             (unsigned long long)g->id, who, c->timeout_ms / 1000.0);
  return rc;
}

/* 1 when process pid holds cookie at addr: it shares our host and lets us copy from its memory. */
int mn__coll_same_host(const mn_coll_t *c, uint64_t pid, uint64_t addr, uint64_t cookie) {
  uint64_t seen = 0;
  if (!c->cma || cookie == 0 || pid == 0 || pid > INT32_MAX) return 0;
  struct iovec local = {&seen, sizeof(seen)}, remote = {(void *)(uintptr_t)addr, sizeof(seen)};
  return process_vm_readv((pid_t)pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof(seen) && seen == cookie;
}

/*
 * Finds out whether each ring link can copy memory directly: every member
 * sends the next one its pid, the address of its random cookie and its host
 * key; the next member, if the keys match, tries to read the cookie with
 * process_vm_readv (which works only on the same host, with permission to
 * trace the peer) and answers yes or no, so both ends of every link agree
 * on how it moves data.
 */
static int probe_same_host(mn_coll_t *c, group_t *g, char *err, size_t errlen) {
  unsigned char out[24 + MN_COLL_HOST_KEY], in[24 + MN_COLL_HOST_KEY], yes = 0, answer = 0;
  char nw[MN_COLL_MAX_ADDR + 32], pw[MN_COLL_MAX_ADDR + 32];
  mn__coll_member_name(g, (g->me + 1) % g->n, nw, sizeof(nw));
  mn__coll_member_name(g, mn__coll_mod(g->me - 1, g->n), pw, sizeof(pw));
  mn__coll_put_be64(out, (uint64_t)getpid());
  mn__coll_put_be64(out + 8, (uint64_t)(uintptr_t)&c->cookie);
  mn__coll_put_be64(out + 16, c->cma ? c->cookie : 0);
  memcpy(out + 24, c->host_key, MN_COLL_HOST_KEY);
  xfer_t xs[2] = {{g->next_fd, 1, (char *)out, sizeof(out), 0, nw}, {g->prev_fd, 0, (char *)in, sizeof(in), 0, pw}};
  int rc = mn__coll_xfer_run(c, xs, 2, "group setup", err, errlen);
  if (rc != 0) return rc;
  uint64_t pid = mn__coll_get_be64(in);
  /* Different host keys are different hosts, even where the kernel would allow the copy (tests, containers). */
  int same_key = memcmp(in + 24, c->host_key, MN_COLL_HOST_KEY) == 0;
  yes = (unsigned char)(same_key &&
                        mn__coll_same_host(c, pid, mn__coll_get_be64(in + 8), mn__coll_get_be64(in + 16)));
  yes |= (unsigned char)(same_key << 1); /* bit 1: the keys match, so the copy should have worked */
  xfer_t ys[2] = {{g->prev_fd, 1, (char *)&yes, 1, 0, pw}, {g->next_fd, 0, (char *)&answer, 1, 0, nw}};
  if ((rc = mn__coll_xfer_run(c, ys, 2, "group setup", err, errlen)) != 0) return rc;
  g->prev_cma = yes & 1;
  g->prev_pid = (pid_t)pid;
  g->next_cma = answer & 1;
  /* A neighbour with our host key that we cannot copy from (another PID namespace, another user): sharing
   * memory through /proc/<pid>/fd would reach the wrong process or fail, so this member votes against. */
  g->key_no_copy = ((yes & 2) && !(yes & 1)) || ((answer & 2) && !(answer & 1));
  return 0;
}

int mn_coll_group(mn_coll_t *c, uint64_t gid, int me, int n, const char *const *addrs, const int *ranks,
                  char *err, size_t errlen) {
  if (n < 1 || n > MN_COLL_MAX_MEMBERS || me < 0 || me >= n) {
    snprintf(err, errlen, "group %llu: member %d of %d is out of range (1..%d members)", (unsigned long long)gid, me,
             n, MN_COLL_MAX_MEMBERS);
    return MN_EINVAL;
  }
  mn_coll_group_free(c, gid);
  if (c->ngroups >= MN_COLL_MAX_GROUPS) {
    snprintf(err, errlen, "this proc already holds %d groups (MN_COLL_MAX_GROUPS); free some with __coll_free",
             MN_COLL_MAX_GROUPS);
    return MN_ELIMIT;
  }
  group_t *g = calloc(1, sizeof(*g));
  int nstar = me == 0 ? n : 1;
  if (g == NULL || (g->addrs = calloc((size_t)n, sizeof(char *))) == NULL ||
      (g->ranks = malloc(sizeof(int) * (size_t)n)) == NULL || (g->star = malloc(sizeof(int) * (size_t)nstar)) == NULL) {
    if (g != NULL) {
      free(g->addrs);
      free(g->ranks);
      free(g);
    }
    snprintf(err, errlen, "out of memory setting up group %llu", (unsigned long long)gid);
    return MN_ENOMEM;
  }
  int rc = MN_EINVAL;
  g->id = gid;
  g->n = n;
  g->me = me;
  g->next_fd = g->prev_fd = g->lnext_fd = g->lprev_fd = -1;
  for (int i = 0; i < nstar; i++) g->star[i] = -1;
  g->next = c->groups;
  c->groups = g;
  c->ngroups++;
  for (int i = 0; i < n; i++) {
    g->ranks[i] = ranks != NULL ? ranks[i] : -1;
    if (addrs[i] == NULL || strlen(addrs[i]) > MN_COLL_MAX_ADDR || (g->addrs[i] = strdup(addrs[i])) == NULL) {
      snprintf(err, errlen, "group %llu: address of member %d is missing or too long", (unsigned long long)gid, i);
      if (addrs[i] != NULL && strlen(addrs[i]) <= MN_COLL_MAX_ADDR) rc = MN_ENOMEM; /* strdup failed */
      goto fail;
    }
  }
  if (n == 1) return 0;
  /* Connect first, then wait: every member can join at once without deadlock. */
  char why[512];
  int next = (me + 1) % n;
  g->next_fd = mn__coll_link_open(c, addrs[next], MN_COLL_LINK_RING, gid, (uint32_t)me, 0, 0, NULL, why, sizeof(why));
  if (g->next_fd < 0) {
    rc = g->next_fd;
    snprintf(err, errlen, "setting up group %llu: ring link to the next member: %s", (unsigned long long)gid, why);
    goto fail;
  }
  if (me != 0) {
    g->star[0] = mn__coll_link_open(c, addrs[0], MN_COLL_LINK_STAR, gid, (uint32_t)me, 0, 0, NULL, why, sizeof(why));
    if (g->star[0] < 0) {
      rc = g->star[0];
      snprintf(err, errlen, "setting up group %llu: star link to member 0: %s", (unsigned long long)gid, why);
      goto fail;
    }
  }
  if ((rc = mn__coll_claim_member(c, g, MN_COLL_LINK_RING, mn__coll_mod(me - 1, n), &g->prev_fd, err, errlen)) != 0)
    goto fail;
  for (int i = 1; me == 0 && i < n; i++)
    if ((rc = mn__coll_claim_member(c, g, MN_COLL_LINK_STAR, i, &g->star[i], err, errlen)) != 0) goto fail;
  if ((rc = probe_same_host(c, g, err, errlen)) != 0 || (rc = mn__coll_setup_layout(c, g, err, errlen)) != 0)
    goto fail;
  return 0;
fail:
  mn__coll_group_destroy(c, g);
  return rc;
}

/* Looks the group up; NULL with a message when this proc has none by that id (callers return MN_ENOTFOUND). */
static group_t *group_get(mn_coll_t *c, uint64_t gid, const char *what, char *err, size_t errlen) {
  group_t *g = mn__coll_group_find(c, gid);
  if (g == NULL)
    snprintf(err, errlen,
             "%s: rank %d has no group %llu (set it up with __coll_group first; a failed collective tears its group "
             "down)",
             what, c->rank, (unsigned long long)gid);
  return g;
}

/*
 * Gives up on a group before any byte of this collective was sent: tells
 * the next member why (an ABORT header where it expects this step's header),
 * then closes every link so the other members fail at once instead of at the
 * timeout. The err text is kept. Returns code, for the caller to return.
 */
static int group_abort(mn_coll_t *c, group_t *g, const char *err, int code) {
  if (g->shm != NULL) mn_shm_abort(g->shm, (uint32_t)c->rank, err);
  if (g->next_fd >= 0) {
    unsigned char h[MN_COLL_HDR_LEN];
    size_t ml = strlen(err) > MN_COLL_MAX_ABORT_MSG ? MN_COLL_MAX_ABORT_MSG : strlen(err);
    mn_coll_hdr_t a = {.kind = MN_COLL_ABORT, .rank = (uint32_t)c->rank, .seq = g->seq, .nbytes = ml};
    mn_coll_hdr_pack(&a, h);
    int64_t deadline = mn_now_ms() + 100; /* best effort: a peer that is not reading learns from the close */
    if (mn__coll_write_exact(g->next_fd, h, sizeof(h), deadline) == 0 && mn__coll_write_exact(g->next_fd, err, ml, deadline) != 0) {
      /* The close below tells it anyway. */
    }
  }
  mn__coll_group_destroy(c, g);
  return code;
}

int mn_coll_group_abort(mn_coll_t *c, uint64_t gid, const char *why) {
  group_t *g = mn__coll_group_find(c, gid);
  return g == NULL ? 0 : group_abort(c, g, why, 0);
}

/*
 * A failure in the middle of a collective: the byte streams are out of step,
 * so the group is gone. Returns code (the failure's), for the caller to return.
 */
static int group_fail(mn_coll_t *c, group_t *g, const char *err, int code) {
  /* Members waiting in the region may have no link to this one: tell them there. */
  if (g->shm != NULL) mn_shm_abort(g->shm, (uint32_t)c->rank, err);
  mn__coll_group_destroy(c, g);
  return code;
}

/*
 * Every collective starts with one header from each member to the next.
 * A member whose predecessor called something else reports the mismatch;
 * one that gave up earlier sent ABORT and its reason instead. 0, or with
 * err: the link's code, MN_EPROTO for bytes that are no header, MN_EPEER
 * for an ABORT or a mismatch.
 */
static int exchange_headers(mn_coll_t *c, group_t *g, const mn_coll_hdr_t *mine, const char *what, char *err,
                            size_t errlen, int *mismatch) {
  unsigned char out[MN_COLL_HDR_LEN], in[MN_COLL_HDR_LEN];
  char nw[MN_COLL_MAX_ADDR + 32], pw[MN_COLL_MAX_ADDR + 32];
  mn_coll_hdr_t theirs;
  mn__coll_member_name(g, (g->me + 1) % g->n, nw, sizeof(nw));
  mn__coll_member_name(g, mn__coll_mod(g->me - 1, g->n), pw, sizeof(pw));
  mn_coll_hdr_pack(mine, out);
  xfer_t xs[2] = {{g->next_fd, 1, (char *)out, sizeof(out), 0, nw}, {g->prev_fd, 0, (char *)in, sizeof(in), 0, pw}};
  int rc = mn__coll_xfer_run(c, xs, 2, what, err, errlen);
  if (rc != 0) return rc;
  if (mn_coll_hdr_unpack(in, &theirs) != 0) {
    snprintf(err, errlen, "%s: %s sent bytes that are not a step header (the group's streams are out of step)",
             what, pw);
    return MN_EPROTO;
  }
  if (theirs.kind == MN_COLL_ABORT) {
    char reason[MN_COLL_MAX_ABORT_MSG + 1];
    size_t rl = theirs.nbytes > MN_COLL_MAX_ABORT_MSG ? 0 : (size_t)theirs.nbytes;
    if (mn__coll_read_exact(g->prev_fd, reason, rl, mn_now_ms() + 1000) != 0) rl = 0;
    reason[rl] = '\0';
    snprintf(err, errlen, "%s: rank %u gave up on group %llu: %s", what, theirs.rank, (unsigned long long)g->id,
             rl ? reason : "(no reason given)");
    return MN_EPEER;
  }
  if ((rc = mn_coll_hdr_check(mine, &theirs, err, errlen)) != 0) {
    if (mismatch != NULL) *mismatch = 1;
    return rc;
  }
  return 0;
}

/* Grows the instance's receive buffer for small collectives to `need` bytes; 0, or MN_ENOMEM with err. */
static int star_reserve(mn_coll_t *c, size_t need, const char *what, char *err, size_t errlen) {
  if (need <= c->star_cap) return 0;
  char *p = realloc(c->star_buf, need);
  if (p == NULL) {
    snprintf(err, errlen, "out of memory during %s", what);
    return MN_ENOMEM;
  }
  c->star_buf = p;
  c->star_cap = need;
  return 0;
}

/*
 * Small all_reduce and barrier: every member sends to member 0, which
 * reduces in member order (so the result is the same every run) and sends
 * the result back to all. With reduce == 0 it only gathers and releases.
 * 0, or a negative code with err.
 */
static int star_run(mn_coll_t *c, group_t *g, char *data, size_t nbytes, mk_dtype_t dt, int op, int reduce,
                    const char *what, char *err, size_t errlen) {
  char who[MN_COLL_MAX_ADDR + 32];
  int n = g->n;
  if (g->me != 0) {
    mn__coll_member_name(g, 0, who, sizeof(who));
    xfer_t x = {g->star[0], 1, data, nbytes, 0, who};
    int rc = mn__coll_xfer_run(c, &x, 1, what, err, errlen);
    if (rc != 0) return rc;
    x.send = 0;
    x.done = 0;
    return mn__coll_xfer_run(c, &x, 1, what, err, errlen);
  }
  int rc = star_reserve(c, (size_t)(n - 1) * nbytes, what, err, errlen);
  if (rc != 0) return rc;
  xfer_t *xs = calloc((size_t)(n - 1), sizeof(xfer_t));
  char (*names)[MN_COLL_MAX_ADDR + 32] = calloc((size_t)(n - 1), sizeof(*names));
  rc = MN_ENOMEM;
  if (xs == NULL || names == NULL) {
    snprintf(err, errlen, "out of memory during %s", what);
    goto done;
  }
  for (int i = 1; i < n; i++) {
    mn__coll_member_name(g, i, names[i - 1], sizeof(names[0]));
    xs[i - 1] = (xfer_t){g->star[i], 0, c->star_buf + (size_t)(i - 1) * nbytes, nbytes, 0, names[i - 1]};
  }
  if ((rc = mn__coll_xfer_run(c, xs, n - 1, what, err, errlen)) != 0) goto done;
  if (reduce) {
    size_t count = nbytes / mk_dtype_size(dt);
    for (int i = 1; i < n; i++) mn_coll_reduce(data, data, c->star_buf + (size_t)(i - 1) * nbytes, count, dt, op);
    if (op == MN_COLL_AVG) mn_coll_divide(data, count, dt, n);
  }
  for (int i = 1; i < n; i++) xs[i - 1] = (xfer_t){g->star[i], 1, data, nbytes, 0, names[i - 1]};
  rc = mn__coll_xfer_run(c, xs, n - 1, what, err, errlen);
done:
  free(xs);
  free(names);
  return rc;
}

/*
 * Small all_reduce of two members: each sends its tensor to the other and
 * both reduce member 0's op member 1's, so both hold the same bytes after
 * one hop (the star takes two). 0, or a negative code with err.
 */
static int pair_run(mn_coll_t *c, group_t *g, char *data, size_t nbytes, mk_dtype_t dt, int op, const char *what,
                    char *err, size_t errlen) {
  char who[MN_COLL_MAX_ADDR + 32];
  int rc = star_reserve(c, nbytes, what, err, errlen);
  if (rc != 0) return rc;
  mn__coll_member_name(g, 1 - g->me, who, sizeof(who));
  xfer_t xs[2] = {{g->next_fd, 1, data, nbytes, 0, who}, {g->prev_fd, 0, c->star_buf, nbytes, 0, who}};
  if ((rc = mn__coll_xfer_run(c, xs, 2, what, err, errlen)) != 0) return rc;
  size_t count = nbytes / mk_dtype_size(dt);
  if (g->me == 0) {
    mn_coll_reduce(data, data, c->star_buf, count, dt, op);
  } else {
    mn_coll_reduce(c->star_buf, c->star_buf, data, count, dt, op);
    memcpy(data, c->star_buf, nbytes);
  }
  if (op == MN_COLL_AVG) mn_coll_divide(data, count, dt, 2);
  return 0;
}

/*
 * Runs the ring over g's links, naming the neighbours in messages. Links to
 * members on this host copy directly for collectives of at least
 * MN_COLL_CMA_MIN bytes; below that TCP's buffering wins (every member sees
 * the same byte count, so both ends of a link choose alike). 0, or a
 * negative code with err.
 */
static int ring_over(mn_coll_t *c, group_t *g, ring_t *r, size_t nbytes, const char *what, char *err,
                     size_t errlen) {
  char nw[MN_COLL_MAX_ADDR + 32], pw[MN_COLL_MAX_ADDR + 32];
  mn__coll_member_name(g, (g->me + 1) % g->n, nw, sizeof(nw));
  mn__coll_member_name(g, mn__coll_mod(g->me - 1, g->n), pw, sizeof(pw));
  r->send_fd = g->next_fd;
  r->recv_fd = g->prev_fd;
  r->send_cma = g->next_cma && nbytes >= MN_COLL_CMA_MIN;
  r->recv_cma = g->prev_cma && nbytes >= MN_COLL_CMA_MIN;
  r->prev_pid = g->prev_pid;
  r->n = g->n;
  r->me = g->me;
  r->what = what;
  r->next_who = nw;
  r->prev_who = pw;
  return mn__coll_ring_run(c, r, err, errlen);
}

int mn__coll_check_cpu(const mk_tensor_t *t, const char *what, const char *arg, char *err, size_t errlen) {
  if (t->device < 0) return 0;
  snprintf(err, errlen, "%s: %s is on GPU device %d; CPU collectives need CPU tensors", what, arg, t->device);
  return MN_EINVAL;
}

/* 0 when all_reduce / reduce_scatter can reduce t with op, else MN_EINVAL with err. */
static int check_reducible(const mk_tensor_t *t, const char *what, int op, char *err, size_t errlen) {
  if (op < 0 || op > MN_COLL_AVG) {
    snprintf(err, errlen, "%s: unknown op %d (sum, max, min, avg)", what, op);
    return MN_EINVAL;
  }
  if (!mn_coll_dtype_ok(t->dtype)) {
    snprintf(err, errlen, "%s does not support dtype %s (f32, f64, i32, i64)", what, mn_dtype_name(t->dtype));
    return MN_EINVAL;
  }
  return 0;
}

/* ---- the collectives ----------------------------------------------------------------------- */

/* ---- shared-memory groups ---------------------------------------------------------------- */

typedef struct {
  mn_coll_t *c;
  group_t *g;
  const char *what;
  int strict; /* the group sends nothing on its links (one host): any byte is a failure */
} shm_ctx_t;

/* j is a member of this host's region: name it by its place in the group. */
static void shm_name(void *arg, int j, char *buf, size_t n) {
  const group_t *g = ((shm_ctx_t *)arg)->g;
  mn__coll_member_name(g, g->lmembers != NULL && j < g->nlocal ? g->lmembers[j] : j, buf, n);
}

/*
 * Whether a member is gone, from the group's links, without waiting. strict
 * (a group that sends nothing on its links: one host, or a watch group): a
 * readable link means its member died (EOF) or gave up (an ABORT header).
 * Otherwise (the links also carry the next collective's bytes) only an EOF
 * with nothing before it counts. 0, or with err naming the member and what
 * it was running: MN_EPEER (it closed its link or gave up), the link's
 * -errno, or MN_EPROTO (strict: bytes the group never sends).
 */
static int peer_gone(group_t *g, const char *what, int strict, char *err, size_t errlen) {
  int fds[5] = {g->next_fd, g->prev_fd, g->me != 0 ? g->star[0] : -1, g->lnext_fd, g->lprev_fd};
  int who[5] = {(g->me + 1) % g->n, mn__coll_mod(g->me - 1, g->n), 0, g->lnext, g->lprev};
  int nfd = 5;
  for (int i = 0; i < nfd + (g->me == 0 ? g->n - 1 : 0); i++) {
    int fd = i < nfd ? fds[i] : g->star[i - nfd + 1], member = i < nfd ? who[i] : i - nfd + 1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (fd < 0 || poll(&p, 1, 0) <= 0) continue;
    char name[MN_COLL_MAX_ADDR + 32];
    mn__coll_member_name(g, member, name, sizeof(name));
    if (!strict) {
      char b;
      ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
      int e = r < 0 ? errno : 0;
      if (r > 0 || e == EAGAIN || e == EWOULDBLOCK || e == EINTR) continue;
      return mn__coll_fail_io(err, errlen, what, name, 0, r == 0 ? MN_ECLOSED : -e);
    }
    unsigned char h[MN_COLL_HDR_LEN];
    mn_coll_hdr_t a;
    int rc = mn__coll_read_exact(fd, h, sizeof(h), mn_now_ms() + 100);
    if (rc == 0 && mn_coll_hdr_unpack(h, &a) == 0 && a.kind == MN_COLL_ABORT) {
      char reason[MN_COLL_MAX_ABORT_MSG + 1];
      size_t rl = a.nbytes > MN_COLL_MAX_ABORT_MSG ? 0 : (size_t)a.nbytes;
      if (mn__coll_read_exact(fd, reason, rl, mn_now_ms() + 100) != 0) rl = 0;
      reason[rl] = '\0';
      snprintf(err, errlen, "%s: rank %u gave up on group %llu: %s", what, a.rank, (unsigned long long)g->id,
               rl ? reason : "(no reason given)");
      return MN_EPEER;
    }
    if (rc != 0) return mn__coll_fail_io(err, errlen, what, name, 0, rc);
    snprintf(err, errlen, "%s: %s sent bytes this group never sends (out of step)", what, name);
    return MN_EPROTO;
  }
  return 0;
}

int mn__coll_group_peer_check(group_t *g, const char *what, char *err, size_t errlen) {
  return peer_gone(g, what, 1, err, errlen);
}

static int shm_check(void *arg, char *err, size_t errlen) {
  shm_ctx_t *x = arg;
  return peer_gone(x->g, x->what, x->strict, err, errlen);
}

/* One collective in the region of this member's host; 0, or mn_shm_run's code with err (the group is not torn down). */
static int shm_phase(mn_coll_t *c, group_t *g, const mn_coll_hdr_t *h, char *data, const char *src, size_t count,
                     size_t esize, int timeout_ms, const char *what, char *err, size_t errlen, int *mismatch) {
  shm_ctx_t x = {c, g, what, g->layout == MN_COLL_ONE_HOST};
  mn_shm_op_t op = {.hdr = h, .gid = g->id, .what = what, .data = data, .src = src, .count = count, .esize = esize,
                    .timeout_ms = timeout_ms, .cancel = c->cancel, .check = shm_check, .name = shm_name, .arg = &x};
  return mn_shm_run(g->shm, &op, err, errlen, mismatch);
}

/* A whole collective in the region: 0, or its code with err once the group is torn down. */
static int shm_over(mn_coll_t *c, group_t *g, const mn_coll_hdr_t *h, char *data, const char *src, size_t count,
                    size_t esize, const char *what, char *err, size_t errlen, int *mismatch) {
  int rc = shm_phase(c, g, h, data, src, count, esize, c->timeout_ms, what, err, errlen, mismatch);
  return rc == 0 ? 0 : group_fail(c, g, err, rc);
}

/*
 * all_reduce over several hosts (MN_COLL_HOSTS): the step header goes round
 * the whole ring as always (so a mismatch is still reported by everyone);
 * then each host sums in its region, the hosts' first members all_reduce
 * those sums over their own ring, and each hands the result to its host
 * (a broadcast in the region). One stream per host crosses the network
 * instead of one per member. Every member ends with the same bytes: the
 * leaders' ring gives its members identical results and the rest copy them.
 * 0, or a negative code with err once the group is torn down.
 */
static int hosts_all_reduce(mn_coll_t *c, group_t *g, mk_tensor_t *t, int op, const mn_coll_hdr_t *h, char *err,
                            size_t errlen, int *mismatch) {
  const char *what = "all_reduce";
  int rc = exchange_headers(c, g, h, what, err, errlen, mismatch);
  if (rc != 0) return group_fail(c, g, err, rc);
  int sum = op == MN_COLL_AVG ? MN_COLL_SUM : op; /* an average of the hosts' averages is not the average */
  size_t es = mk_dtype_size(t->dtype);
  mn_coll_hdr_t local = *h;
  local.op = (uint8_t)sum;
  if (g->shm != NULL &&
      (rc = shm_phase(c, g, &local, t->data, NULL, (size_t)t->numel, es, c->timeout_ms, what, err, errlen, mismatch)) != 0)
    return group_fail(c, g, err, rc);
  if (g->lead && g->nhosts > 1) {
    char nw[MN_COLL_MAX_ADDR + 32], pw[MN_COLL_MAX_ADDR + 32];
    mn__coll_member_name(g, g->lnext, nw, sizeof(nw));
    mn__coll_member_name(g, g->lprev, pw, sizeof(pw));
    ring_t r = {.send_fd = g->lnext_fd, .recv_fd = g->lprev_fd, .nsend = 2 * (g->nhosts - 1),
                .nrecv = 2 * (g->nhosts - 1), .lag = 1, .reuse_from = g->nhosts - 1, .reuse_dist = g->nhosts - 1,
                .piece = piece_all_reduce, .dtype = t->dtype, .op = sum, .n = g->nhosts, .me = g->host, .esize = es,
                .next_who = nw, .prev_who = pw, .what = what, .data = t->data, .count = (size_t)t->numel};
    if ((rc = mn__coll_ring_run(c, &r, err, errlen)) != 0) return group_fail(c, g, err, rc);
  }
  /* Meanwhile the others wait on their leader, whose counter stands still while the tensor crosses the network:
   * the timeout grows by the time the bytes take at MN_COLL_PULL_MIN_RATE. */
  mn_coll_hdr_t bcast = {MN_COLL_BROADCAST, 0, (uint8_t)t->dtype, (uint32_t)c->rank, 0, g->seq, t->nbytes};
  double slack = (double)t->nbytes / MN_COLL_PULL_MIN_RATE * 1000.0;
  int wait_ms = c->timeout_ms + (slack > 1e8 ? (int)1e8 : (int)slack);
  if (g->shm != NULL &&
      (rc = shm_phase(c, g, &bcast, t->data, NULL, t->nbytes, 1, wait_ms, what, err, errlen, mismatch)) != 0)
    return group_fail(c, g, err, rc);
  if (op == MN_COLL_AVG) mn_coll_divide(t->data, (size_t)t->numel, t->dtype, g->n);
  return 0;
}

int mn_coll_all_reduce(mn_coll_t *c, uint64_t gid, mk_tensor_t *t, int op, char *err, size_t errlen,
                       int *mismatch) {
  const char *what = "all_reduce";
  group_t *g = group_get(c, gid, what, err, errlen);
  if (g == NULL) return MN_ENOTFOUND;
  g->seq++;
  int rc;
  if ((rc = mn__coll_check_cpu(t, what, "the tensor", err, errlen)) != 0 ||
      (rc = check_reducible(t, what, op, err, errlen)) != 0)
    return group_abort(c, g, err, rc);
  if (g->n == 1) return 0; /* the sum, max, min and average of one value is that value */
  mn_coll_hdr_t h = {MN_COLL_ALL_REDUCE, (uint8_t)op, (uint8_t)t->dtype, (uint32_t)c->rank, 0, g->seq, t->nbytes};
  if (g->layout == MN_COLL_ONE_HOST)
    return shm_over(c, g, &h, t->data, NULL, (size_t)t->numel, mk_dtype_size(t->dtype), what, err, errlen, mismatch);
  /* Small ones are bound by latency: the star's two hops beat the three phases (bench/hosts.sh). */
  if (g->layout == MN_COLL_HOSTS && t->nbytes >= MN_COLL_SMALL) return hosts_all_reduce(c, g, t, op, &h, err, errlen, mismatch);
  if ((rc = exchange_headers(c, g, &h, what, err, errlen, mismatch)) != 0) return group_fail(c, g, err, rc);
  if (g->n == 2 && t->nbytes < MN_COLL_SMALL) {
    rc = pair_run(c, g, t->data, t->nbytes, t->dtype, op, what, err, errlen);
  } else if (t->nbytes < MN_COLL_SMALL && (size_t)(g->n - 1) * t->nbytes <= MN_COLL_STAR_MAX) {
    rc = star_run(c, g, t->data, t->nbytes, t->dtype, op, 1, what, err, errlen);
  } else {
    /* The gather phase's step k lands on the segment the scatter phase's step k sent. */
    ring_t r = {.nsend = 2 * (g->n - 1), .nrecv = 2 * (g->n - 1), .lag = 1, .reuse_from = g->n - 1,
                .reuse_dist = g->n - 1, .piece = piece_all_reduce, .dtype = t->dtype, .op = op, .esize = mk_dtype_size(t->dtype), .data = t->data,
                .count = (size_t)t->numel};
    rc = ring_over(c, g, &r, t->nbytes, what, err, errlen);
  }
  return rc == 0 ? 0 : group_fail(c, g, err, rc);
}

int mn_coll_broadcast(mn_coll_t *c, uint64_t gid, mk_tensor_t *t, int root, char *err, size_t errlen,
                      int *mismatch) {
  const char *what = "broadcast";
  group_t *g = group_get(c, gid, what, err, errlen);
  if (g == NULL) return MN_ENOTFOUND;
  g->seq++;
  int rc = mn__coll_check_cpu(t, what, "the tensor", err, errlen);
  if (rc != 0) return group_abort(c, g, err, rc);
  if (root < 0 || root >= g->n) {
    snprintf(err, errlen, "%s: root %d is outside the group's members 0..%d", what, root, g->n - 1);
    return group_abort(c, g, err, MN_EINVAL);
  }
  if (g->n == 1) return 0;
  mn_coll_hdr_t h = {MN_COLL_BROADCAST, 0, (uint8_t)t->dtype, (uint32_t)c->rank, (uint32_t)root, g->seq, t->nbytes};
  if (g->layout == MN_COLL_ONE_HOST) return shm_over(c, g, &h, t->data, NULL, t->nbytes, 1, what, err, errlen, mismatch);
  if ((rc = exchange_headers(c, g, &h, what, err, errlen, mismatch)) != 0) return group_fail(c, g, err, rc);
  /* A chain from the root around the ring, forwarded chunk by chunk as it lands. */
  int last = (g->me + 1) % g->n == root;
  ring_t r = {.nsend = last ? 0 : 1, .nrecv = g->me == root ? 0 : 1, .lag = g->me == root ? -1 : 0,
              .piece = piece_broadcast, .dtype = t->dtype, .esize = 1, .data = t->data, .count = t->nbytes};
  rc = ring_over(c, g, &r, t->nbytes, what, err, errlen);
  return rc == 0 ? 0 : group_fail(c, g, err, rc);
}

int mn_coll_all_gather(mn_coll_t *c, uint64_t gid, const mk_tensor_t *src, mk_tensor_t *dst, char *err,
                       size_t errlen, int *mismatch) {
  const char *what = "all_gather";
  group_t *g = group_get(c, gid, what, err, errlen);
  if (g == NULL) return MN_ENOTFOUND;
  g->seq++;
  int rc;
  if ((rc = mn__coll_check_cpu(src, what, "src", err, errlen)) != 0 ||
      (rc = mn__coll_check_cpu(dst, what, "dst", err, errlen)) != 0)
    return group_abort(c, g, err, rc);
  if (src->dtype != dst->dtype || dst->numel != (int64_t)g->n * src->numel) {
    snprintf(err, errlen, "%s: dst must be %s with %d x %lld = %lld elements (the group has %d members); it is %s with %lld",
             what, mn_dtype_name(src->dtype), g->n, (long long)src->numel, (long long)g->n * (long long)src->numel,
             g->n, mn_dtype_name(dst->dtype), (long long)dst->numel);
    return group_abort(c, g, err, MN_EINVAL);
  }
  memmove((char *)dst->data + (size_t)g->me * src->nbytes, src->data, src->nbytes);
  if (g->n == 1) return 0;
  mn_coll_hdr_t h = {MN_COLL_ALL_GATHER, 0, (uint8_t)src->dtype, (uint32_t)c->rank, 0, g->seq, src->nbytes};
  if (g->layout == MN_COLL_ONE_HOST) return shm_over(c, g, &h, dst->data, src->data, src->nbytes, 1, what, err, errlen, mismatch);
  if ((rc = exchange_headers(c, g, &h, what, err, errlen, mismatch)) != 0) return group_fail(c, g, err, rc);
  ring_t r = {.nsend = g->n - 1, .nrecv = g->n - 1, .lag = 1, .piece = piece_all_gather, .dtype = src->dtype,
              .esize = 1, .data = dst->data, .count = src->nbytes};
  rc = ring_over(c, g, &r, src->nbytes, what, err, errlen);
  return rc == 0 ? 0 : group_fail(c, g, err, rc);
}

int mn_coll_reduce_scatter(mn_coll_t *c, uint64_t gid, const mk_tensor_t *src, mk_tensor_t *dst, int op,
                           char *err, size_t errlen, int *mismatch) {
  const char *what = "reduce_scatter";
  group_t *g = group_get(c, gid, what, err, errlen);
  if (g == NULL) return MN_ENOTFOUND;
  g->seq++;
  int rc;
  if ((rc = mn__coll_check_cpu(src, what, "src", err, errlen)) != 0 ||
      (rc = mn__coll_check_cpu(dst, what, "dst", err, errlen)) != 0 || (rc = check_reducible(src, what, op, err, errlen)) != 0)
    return group_abort(c, g, err, rc);
  if (src->dtype != dst->dtype || src->numel != (int64_t)g->n * dst->numel) {
    snprintf(err, errlen, "%s: src must be %s with %d x %lld = %lld elements (the group has %d members); it is %s with %lld",
             what, mn_dtype_name(dst->dtype), g->n, (long long)dst->numel, (long long)g->n * (long long)dst->numel,
             g->n, mn_dtype_name(src->dtype), (long long)src->numel);
    return group_abort(c, g, err, MN_EINVAL);
  }
  if (g->n == 1) {
    memmove(dst->data, src->data, dst->nbytes); /* one member: its block is all of src */
    return 0;
  }
  if (src->data == dst->data) {
    snprintf(err, errlen, "%s: src and dst must be different tensors", what);
    return group_abort(c, g, err, MN_EINVAL);
  }
  mn_coll_hdr_t h = {MN_COLL_REDUCE_SCATTER, (uint8_t)op, (uint8_t)src->dtype, (uint32_t)c->rank, 0, g->seq,
                     src->nbytes};
  if (g->layout == MN_COLL_ONE_HOST)
    return shm_over(c, g, &h, dst->data, src->data, (size_t)dst->numel, mk_dtype_size(src->dtype), what, err, errlen,
                    mismatch);
  if ((rc = exchange_headers(c, g, &h, what, err, errlen, mismatch)) != 0) return group_fail(c, g, err, rc);
  /* Two buffers alternate; the one the last step fills is dst. */
  char *scratch = NULL;
  if (g->n > 2 && (scratch = malloc(dst->nbytes ? dst->nbytes : 1)) == NULL) {
    snprintf(err, errlen, "out of memory during %s", what);
    return group_fail(c, g, err, MN_ENOMEM);
  }
  ring_t r = {.nsend = g->n - 1, .nrecv = g->n - 1, .lag = 1, .reuse_from = 2, .reuse_dist = 1,
              .piece = piece_reduce_scatter,
              .dtype = src->dtype, .op = op, .esize = mk_dtype_size(src->dtype), .src = src->data,
              .count = (size_t)dst->numel};
  r.buf[(g->n - 2) % 2] = dst->data;
  r.buf[(g->n - 1) % 2] = scratch;
  rc = ring_over(c, g, &r, src->nbytes, what, err, errlen);
  free(scratch);
  return rc == 0 ? 0 : group_fail(c, g, err, rc);
}

/* A barrier announced as `kind` (MN_COLL_BARRIER or MN_COLL_KERNEL_END). */
static int barrier_as(mn_coll_t *c, uint64_t gid, int kind, const char *what, char *err, size_t errlen,
                      int *mismatch) {
  group_t *g = group_get(c, gid, what, err, errlen);
  if (g == NULL) return MN_ENOTFOUND;
  g->seq++;
  if (g->n == 1) return 0;
  mn_coll_hdr_t h = {(uint8_t)kind, 0, 0, (uint32_t)c->rank, 0, g->seq, 0};
  if (g->layout == MN_COLL_ONE_HOST) return shm_over(c, g, &h, NULL, NULL, 0, 1, what, err, errlen, mismatch);
  char token = 1;
  int rc;
  if ((rc = exchange_headers(c, g, &h, what, err, errlen, mismatch)) != 0 ||
      (rc = star_run(c, g, &token, 1, MK_U8, 0, 0, what, err, errlen)) != 0)
    return group_fail(c, g, err, rc);
  return 0;
}

int mn_coll_barrier(mn_coll_t *c, uint64_t gid, char *err, size_t errlen, int *mismatch) {
  return barrier_as(c, gid, MN_COLL_BARRIER, "barrier", err, errlen, mismatch);
}

int mn_coll_fence(mn_coll_t *c, uint64_t gid, char *err, size_t errlen, int *mismatch) {
  return barrier_as(c, gid, MN_COLL_KERNEL_END, "the end of the kernel", err, errlen, mismatch);
}

int mn_coll_group_info(mn_coll_t *c, uint64_t gid, int *me, int *n) {
  group_t *g = mn__coll_group_find(c, gid);
  if (g == NULL) return MN_ENOTFOUND;
  *me = g->me;
  *n = g->n;
  return 0;
}
