/* coll_layout.c - how a group is laid out over hosts: shared-memory regions and the leaders' ring. */
#include "coll_int.h"

/* ---- group layout: hosts, shared memory, leaders ------------------------------------------ */

/*
 * The setup messages between member 0 and the others, over the star. Member
 * 0 plays its own part inline. Each step is: every member > 0 sends `olen`
 * bytes and receives `ilen` back; member 0 gathers all into `in` (member i
 * at in + i * olen), and `answer` fills `out` (member i at out + i * ilen).
 * star_round returns 0, or the links' code with err.
 */
typedef struct {
  mn_coll_t *c;
  group_t *g;
  xfer_t *xs;
  char (*names)[MN_COLL_MAX_ADDR + 32];
} star_t;

static int star_round(star_t *st, const unsigned char *mine, size_t olen, unsigned char *in, unsigned char *out,
                      size_t ilen, void (*answer)(void *arg, const unsigned char *in, unsigned char *out), void *arg,
                      char *err, size_t errlen) {
  group_t *g = st->g;
  const char *what = "group setup";
  if (g->me != 0) {
    xfer_t x = {g->star[0], 1, (char *)mine, olen, 0, st->names[0]};
    int rc = mn__coll_xfer_run(st->c, &x, 1, what, err, errlen);
    if (rc != 0) return rc;
    x = (xfer_t){g->star[0], 0, (char *)out, ilen, 0, st->names[0]};
    return mn__coll_xfer_run(st->c, &x, 1, what, err, errlen);
  }
  memcpy(in, mine, olen);
  for (int i = 1; i < g->n; i++) st->xs[i - 1] = (xfer_t){g->star[i], 0, (char *)in + (size_t)i * olen, olen, 0, st->names[i]};
  int rc = mn__coll_xfer_run(st->c, st->xs, g->n - 1, what, err, errlen);
  if (rc != 0) return rc;
  answer(arg, in, out);
  for (int i = 1; i < g->n; i++)
    st->xs[i - 1] = (xfer_t){g->star[i], 1, (char *)out + (size_t)i * ilen, ilen, 0, st->names[i]};
  return mn__coll_xfer_run(st->c, st->xs, g->n - 1, what, err, errlen);
}

static void put32(unsigned char *p, uint32_t v) { mn_put_be32((char *)p, v); }
static uint32_t get32(const unsigned char *p) { return mn_be32((const char *)p); }

#define VOTE_LEN (1 + MN_COLL_HOST_KEY) /* may share memory, host key */
#define PLAN_HEAD 25                    /* use regions, host, local index, local count, hosts, next/prev leader */
#define OFFER_LEN 33                    /* region made, pid, fd, piece, nonce */

/* A plan: its head, then (for groups small enough to share memory) every member's host, 2 bytes each. */
static size_t plan_len(int n) { return PLAN_HEAD + (n <= MN_SHM_MAX_MEMBERS ? 2 * (size_t)n : 0); }

/* Member 0: numbers the hosts by their first member and tells each member its place. */
static void plan_answer(void *arg, const unsigned char *in, unsigned char *out) {
  int n = *(int *)arg, nhosts = 0, use = n <= MN_SHM_MAX_MEMBERS, shared = 0;
  size_t pl = plan_len(n);
  int *host = calloc((size_t)n, sizeof(int)), *lead = calloc((size_t)n, sizeof(int)), *count = calloc((size_t)n, sizeof(int));
  int *idx = calloc((size_t)n, sizeof(int));
  if (host == NULL || lead == NULL || count == NULL || idx == NULL) use = 0;
  for (int i = 0; use && i < n; i++) {
    const unsigned char *v = in + (size_t)i * VOTE_LEN;
    use = use && v[0] == 1;
    int h = 0;
    while (h < nhosts && memcmp(in + (size_t)lead[h] * VOTE_LEN + 1, v + 1, MN_COLL_HOST_KEY) != 0) h++;
    if (h == nhosts) lead[nhosts++] = i;
    host[i] = h;
    idx[i] = count[h]++;
    shared = shared || count[h] > 1;
  }
  use = use && shared; /* with one member per host there is nothing to share */
  for (int i = 0; i < n; i++) {
    unsigned char *o = out + (size_t)i * pl;
    memset(o, 0, pl);
    o[0] = (unsigned char)use;
    if (!use) continue;
    int h = host[i];
    put32(o + 1, (uint32_t)h);
    put32(o + 5, (uint32_t)idx[i]);
    put32(o + 9, (uint32_t)count[h]);
    put32(o + 13, (uint32_t)nhosts);
    put32(o + 17, (uint32_t)lead[(h + 1) % nhosts]);
    put32(o + 21, (uint32_t)lead[(h + nhosts - 1) % nhosts]);
    for (int j = 0; j < n; j++) o[PLAN_HEAD + 2 * j] = (unsigned char)(host[j] >> 8), o[PLAN_HEAD + 2 * j + 1] = (unsigned char)host[j];
  }
  free(host);
  free(lead);
  free(count);
  free(idx);
}

/*
 * Takes a plan from member 0, checking every number against the group
 * before anything indexes with it; fills the group's place and its host's
 * members. 0, or the plan is refused (the group stays flat): MN_EPROTO
 * for numbers out of range, MN_ENOMEM.
 */
static int take_plan(group_t *g, const unsigned char *plan, uint32_t *local, uint32_t *count) {
  uint32_t n = (uint32_t)g->n, host = get32(plan + 1), nhosts = get32(plan + 13);
  uint32_t lnext = get32(plan + 17), lprev = get32(plan + 21);
  *local = get32(plan + 5);
  *count = get32(plan + 9);
  if (n > MN_SHM_MAX_MEMBERS || nhosts < 1 || nhosts > n || host >= nhosts || *count < 1 || *count > n ||
      *local >= *count || lnext >= n || lprev >= n)
    return MN_EPROTO;
  g->lmembers = malloc(sizeof(int) * *count);
  if (g->lmembers == NULL) return MN_ENOMEM;
  g->nlocal = 0;
  for (uint32_t j = 0; j < n; j++) {
    uint32_t h = ((uint32_t)plan[PLAN_HEAD + 2 * j] << 8) | plan[PLAN_HEAD + 2 * j + 1];
    if (h >= nhosts) return MN_EPROTO;
    if (h == host) {
      if ((uint32_t)g->nlocal == *count) return MN_EPROTO;
      g->lmembers[g->nlocal++] = (int)j;
    }
  }
  if ((uint32_t)g->nlocal != *count || g->lmembers[*local] != g->me) return MN_EPROTO;
  g->host = (int)host;
  g->nhosts = (int)nhosts;
  g->lnext = (int)lnext;
  g->lprev = (int)lprev;
  g->lead = *local == 0;
  return 0;
}

/* Member 0: sends each member the region its host's leader made (leaders get their own back). */
typedef struct {
  int n;
  const unsigned char *plans;
} offers_arg_t;

static void offer_answer(void *arg, const unsigned char *in, unsigned char *out) {
  offers_arg_t *a = arg;
  size_t pl = plan_len(a->n);
  int *first = malloc(sizeof(int) * (size_t)a->n);
  for (int i = 0; first != NULL && i < a->n; i++) first[i] = -1;
  for (int i = 0; i < a->n; i++) {
    uint32_t h = get32(a->plans + (size_t)i * pl + 1);
    int leader = i;
    if (first != NULL && h < (uint32_t)a->n) {
      if (first[h] < 0) first[h] = i;
      leader = first[h];
    }
    memcpy(out + (size_t)i * OFFER_LEN, in + (size_t)leader * OFFER_LEN, OFFER_LEN);
  }
  free(first);
}

/* Member 0: the group uses its regions only if every member could map its own. */
static void final_answer(void *arg, const unsigned char *in, unsigned char *out) {
  int n = *(int *)arg, all = 1;
  for (int i = 0; i < n; i++) all = all && in[i] == 1;
  memset(out, all, (size_t)n);
}

/* Leaders: the ring of one member per host, for the hosts' sums. 0, or the link's code with err. */
static int setup_leaders(mn_coll_t *c, group_t *g, char *err, size_t errlen) {
  char why[512];
  g->lnext_fd = mn__coll_link_open(c, g->addrs[g->lnext], MN_COLL_LINK_LEADER, g->id, (uint32_t)g->me, 0, 0, NULL, why,
                                   sizeof(why));
  if (g->lnext_fd < 0) {
    snprintf(err, errlen, "setting up group %llu: link to the next host's leader: %s", (unsigned long long)g->id, why);
    return g->lnext_fd;
  }
  return mn__coll_claim_member(c, g, MN_COLL_LINK_LEADER, g->lprev, &g->lprev_fd, err, errlen);
}

/*
 * Lays the group out by host. Every member sends member 0 whether it may
 * share memory (and both its ring links copy directly, or its host is
 * another) and its host key; member 0 numbers the hosts and sends each
 * member its place. If some host has two or more members, the first member
 * of each such host makes a region for them (a memfd) and offers it; the
 * others map it through /proc/<pid>/fd/<n> (the same permission as reading
 * that member's memory) and say whether they could. The group uses the
 * regions only if everyone could: all on one host, every collective runs in
 * shared memory (MN_COLL_ONE_HOST); over several hosts, all_reduce sums per
 * host in shared memory and across hosts over a ring of the hosts' first
 * members (MN_COLL_HOSTS). Otherwise it keeps the links (MN_COLL_FLAT).
 * Fails (a negative code with err) only when a link fails or memory runs out.
 */
int mn__coll_setup_layout(mn_coll_t *c, group_t *g, char *err, size_t errlen) {
  int n = g->n, rc = MN_ENOMEM;
  size_t pl = plan_len(n);
  star_t st = {c, g, calloc((size_t)n, sizeof(xfer_t)), calloc((size_t)n, sizeof(*st.names))};
  unsigned char *in = calloc((size_t)n, VOTE_LEN > OFFER_LEN ? VOTE_LEN : OFFER_LEN), *out = calloc((size_t)n, pl);
  unsigned char *plan = malloc(pl), vote[VOTE_LEN] = {0}, offer[OFFER_LEN] = {0}, got[OFFER_LEN], ok, final;
  unsigned char *oout = calloc((size_t)n, OFFER_LEN);
  char why[512];
  uint32_t local = 0, count = 1;
  uint64_t nonce = 0;
  if (st.xs == NULL || st.names == NULL || in == NULL || out == NULL || plan == NULL || oout == NULL) {
    snprintf(err, errlen, "out of memory setting up group %llu", (unsigned long long)g->id);
    goto done;
  }
  for (int i = 0; i < n; i++)
    if (g->me == 0 || i == 0) mn__coll_member_name(g, i, st.names[i], sizeof(st.names[0]));
  vote[0] = (unsigned char)(c->shm && c->cma && n <= MN_SHM_MAX_MEMBERS && !g->key_no_copy);
  memcpy(vote + 1, c->host_key, MN_COLL_HOST_KEY);
  if ((rc = star_round(&st, vote, VOTE_LEN, in, out, pl, plan_answer, &n, err, errlen)) != 0) goto done;
  memcpy(plan, out, pl); /* member 0: its own plan is first */
  int use = plan[0] == 1 && take_plan(g, plan, &local, &count) == 0;
  /* The first member of a host with company makes its region. */
  size_t piece = mn_shm_piece_for((int)count, c->shm_piece);
  uint8_t rnd[MN_NONCE_LEN];
  mn_auth_nonce(rnd);
  memcpy(&nonce, rnd, sizeof(nonce)); /* proves an attached region is the one offered, not another group's */
  if (use && local == 0 && count > 1 && mn_shm_create(&g->shm, (int)count, piece, g->id, nonce, why, sizeof(why)) == 0) {
    offer[0] = 1;
    mn__coll_put_be64(offer + 1, (uint64_t)getpid());
    mn__coll_put_be64(offer + 9, (uint64_t)mn_shm_fd(g->shm));
    mn__coll_put_be64(offer + 17, (uint64_t)piece);
    mn__coll_put_be64(offer + 25, nonce);
  }
  offers_arg_t oa = {n, g->me == 0 ? out : NULL};
  if ((rc = star_round(&st, offer, OFFER_LEN, in, oout, OFFER_LEN, offer_answer, &oa, err, errlen)) != 0) goto done;
  memcpy(got, oout, OFFER_LEN);
  if (!use || count < 2) ok = 1;
  else if (local == 0) ok = g->shm != NULL;
  else
    ok = got[0] == 1 && mn_shm_attach(&g->shm, (int)count, (int)local, (long)mn__coll_get_be64(got + 1),
                                      (int)mn__coll_get_be64(got + 9), (size_t)mn__coll_get_be64(got + 17), g->id,
                                      mn__coll_get_be64(got + 25), why, sizeof(why)) == 0;
  if ((rc = star_round(&st, &ok, 1, in, out, 1, final_answer, &n, err, errlen)) != 0) goto done;
  final = out[0];
  if (g->shm != NULL) mn_shm_drop_fd(g->shm); /* mapped by every member of its host, or used by none */
  if (!use || !final) {
    mn_shm_close(g->shm);
    g->shm = NULL;
    g->layout = MN_COLL_FLAT;
    g->lead = 0;
    rc = 0;
    goto done;
  }
  g->layout = g->nhosts == 1 ? MN_COLL_ONE_HOST : MN_COLL_HOSTS;
  rc = g->layout == MN_COLL_HOSTS && g->lead ? setup_leaders(c, g, err, errlen) : 0;
done:
  free(st.xs);
  free(st.names);
  free(in);
  free(out);
  free(oout);
  free(plan);
  return rc;
}
