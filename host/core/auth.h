/*
 * auth.h - the cluster token and the HELLO challenge-response.
 *
 * The token never crosses the wire. Each side proves it holds the token by
 * returning HMAC-SHA256(key, role || their_nonce || my_nonce), where key is a
 * BLAKE2b hash of the token; fresh nonces on every connection make a
 * recorded exchange useless to replay.
 */
#ifndef MN_AUTH_H
#define MN_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define MN_NONCE_LEN 32
#define MN_MAC_LEN 32
#define MN_KEY_LEN 32
#define MN_MAX_TOKEN 4096 /* longest token accepted from env or file */

typedef struct {
  uint8_t key[MN_KEY_LEN];
  int set;
} mn_auth_t;

/* Initializes libsodium; returns 0 or MN_EAUTH. Safe to call repeatedly. */
int mn_auth_global_init(void);
/* Derives the key from a token string. */
int mn_auth_init(mn_auth_t *a, const char *token, size_t len);
/*
 * Loads the token: MONARCH_TOKEN, else the file named by MONARCH_TOKEN_FILE
 * (or `file` when not NULL). Returns 0, or MN_EAUTH with a message in err.
 */
int mn_auth_load(mn_auth_t *a, const char *file, char *err, size_t errlen);
/* Fills `out` with a random printable token of `len` characters plus NUL. */
void mn_auth_generate(char *out, size_t len);
void mn_auth_nonce(uint8_t nonce[MN_NONCE_LEN]);
/* mac = HMAC(key, role || a || b) */
void mn_auth_mac(const mn_auth_t *a, char role, const uint8_t *na, const uint8_t *nb,
                 uint8_t mac[MN_MAC_LEN]);
/* mac = HMAC(key, role || a || b || data): the same, binding `len` more bytes (a JOIN's address). */
void mn_auth_mac_data(const mn_auth_t *a, char role, const uint8_t *na, const uint8_t *nb, const void *data,
                      size_t len, uint8_t mac[MN_MAC_LEN]);
/* Constant-time check of mn_auth_mac_data's MAC; 0 when mac is right, MN_EAUTH otherwise. */
int mn_auth_check_data(const mn_auth_t *a, char role, const uint8_t *na, const uint8_t *nb, const void *data,
                       size_t len, const uint8_t *mac, size_t maclen);
/* Constant-time check; returns 0 when mac is right, MN_EAUTH otherwise. */
int mn_auth_check(const mn_auth_t *a, char role, const uint8_t *na, const uint8_t *nb,
                  const uint8_t *mac, size_t maclen);

#endif
