/*
 * join.h - the JOIN exchange on a controller's join port (docs/protocol.md,
 * section 4, "Joining a running job"), as pure functions over decoded
 * messages: the controller's listener (host/controller/ctl_join.c) and the
 * host agent that joins (host/agent/agent_join.c) share them.
 *
 *   controller -> agent  [HELLO, version, nonce_j, "join"]
 *   agent -> controller  [JOIN, version, nonce_a, addr, HMAC(key, 'j' || nonce_j || nonce_a || addr)]
 *   controller -> agent  [JOINED, HMAC(key, 'J' || nonce_a || nonce_j)], or an ERROR; then it closes
 *
 * A controller makes no connection for a JOIN whose MAC is wrong, so only
 * holders of the token can make it dial; the MAC covers addr, so nobody can
 * redirect a join in flight. The controller then dials addr as it dials any
 * host agent, and that connection authenticates with the usual handshake.
 */
#ifndef MN_JOIN_H
#define MN_JOIN_H

#include "auth.h"
#include "msg.h"
#include "wire.h"

#define MN_JOIN_ROLE "join" /* the role a join port's HELLO names */

/* Controller: packs HELLO with a fresh nonce (kept in nonce_j). 0 or MN_ENOMEM. */
int mn_join_hello(mn_buf_t *out, uint8_t nonce_j[MN_NONCE_LEN]);
/*
 * Agent: answers the join port's greeting with JOIN asking to be dialled
 * at addr; keeps both nonces. Returns 0; MN_EPROTO when the peer is not a
 * join port (err says what it seems to be); MN_EVERSION; the code of an
 * ERROR the peer sent instead (err has its text); MN_ENOMEM.
 */
int mn_join_answer(mn_buf_t *out, const mn_auth_t *a, const msgpack_object *hello, const char *addr,
                   uint8_t nonce_j[MN_NONCE_LEN], uint8_t nonce_a[MN_NONCE_LEN], char *err, size_t errlen);
/*
 * Controller: checks an agent's first message, which must be a JOIN with
 * our version, a numeric address (mn_join_check_addr) and the right MAC.
 * On success copies the address, NUL-terminated, into addr (addrlen >
 * MN_MSG_JOIN_MAX_ADDR) and packs JOINED into out. Returns 0, MN_EPROTO,
 * MN_EVERSION, MN_EAUTH (a wrong MAC) or MN_ENOMEM, with err saying what was wrong.
 */
int mn_join_accept(mn_buf_t *out, const mn_auth_t *a, const msgpack_object *msg,
                   const uint8_t nonce_j[MN_NONCE_LEN], char *addr, size_t addrlen, char *err, size_t errlen);
/*
 * Agent: checks the controller's answer. 0 for a JOINED with the right
 * MAC; MN_EAUTH for a wrong one; the code of an ERROR sent instead (err
 * has its text; MN_EPEER when the code is not a negative one); MN_EPROTO.
 */
int mn_join_check_joined(const mn_auth_t *a, const msgpack_object *msg, const uint8_t nonce_j[MN_NONCE_LEN],
                         const uint8_t nonce_a[MN_NONCE_LEN], char *err, size_t errlen);
/* 0 when addr is "IPv4:PORT" or "[IPv6]:PORT" with a port 1..65535, else MN_EINVAL. */
int mn_join_check_addr(const char *addr);

#endif
