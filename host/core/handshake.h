/*
 * handshake.h - the HELLO / AUTH / WELCOME exchange, as pure functions over
 * decoded messages so that blocking (proc) and libuv (agent, controller)
 * code share one implementation.
 *
 *   server -> client  [HELLO, version, nonce_s, role]
 *   client -> server  [AUTH, version, nonce_c, HMAC(key, 'c' || nonce_s || nonce_c)]
 *   server -> client  [WELCOME, HMAC(key, 's' || nonce_c || nonce_s), info]
 */
#ifndef MN_HANDSHAKE_H
#define MN_HANDSHAKE_H

#include "auth.h"
#include "wire.h"

#define MN_HANDSHAKE_TIMEOUT_MS 5000 /* a peer must finish the handshake this fast */

/* Server: packs HELLO with a fresh nonce (kept in nonce_s). */
int mn_hs_hello(mn_buf_t *out, const char *role, uint8_t nonce_s[MN_NONCE_LEN]);
/* Server: checks an AUTH message; on success copies the client nonce out. */
int mn_hs_check_auth(const mn_auth_t *a, const msgpack_object *msg,
                     const uint8_t nonce_s[MN_NONCE_LEN], uint8_t nonce_c[MN_NONCE_LEN],
                     char *err, size_t errlen);
/* Server: packs WELCOME; info is a map of strings (hostname, pid...). */
int mn_hs_welcome(mn_buf_t *out, const mn_auth_t *a, const uint8_t nonce_s[MN_NONCE_LEN],
                  const uint8_t nonce_c[MN_NONCE_LEN], const char *role);
/* The same for a host agent: info adds its ELF class and machine, whether it takes shipped files and its ship
 * cache's id (ship.h). */
int mn_hs_welcome_agent(mn_buf_t *out, const mn_auth_t *a, const uint8_t nonce_s[MN_NONCE_LEN],
                        const uint8_t nonce_c[MN_NONCE_LEN], int elf_class, int elf_machine, int ship,
                        const char *cache_id);
/* Client: answers HELLO with AUTH; remembers both nonces. */
int mn_hs_answer(mn_buf_t *out, const mn_auth_t *a, const msgpack_object *hello,
                 uint8_t nonce_s[MN_NONCE_LEN], uint8_t nonce_c[MN_NONCE_LEN], char *err,
                 size_t errlen);
/* Client: checks the server's proof in WELCOME. */
int mn_hs_check_welcome(const mn_auth_t *a, const msgpack_object *msg,
                        const uint8_t nonce_s[MN_NONCE_LEN], const uint8_t nonce_c[MN_NONCE_LEN],
                        char *err, size_t errlen);

#endif
