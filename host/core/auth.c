/* auth.c - token handling and HMAC challenge-response; see auth.h. */
#include "auth.h"
#include "wire.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mn_auth_global_init(void) { return sodium_init() < 0 ? MN_EAUTH : 0; }

int mn_auth_init(mn_auth_t *a, const char *token, size_t len) {
  if (mn_auth_global_init() != 0) return MN_EAUTH;
  crypto_generichash(a->key, sizeof(a->key), (const unsigned char *)token, len, NULL, 0);
  a->set = 1;
  return 0;
}

int mn_auth_load(mn_auth_t *a, const char *file, char *err, size_t errlen) {
  const char *env = getenv("MONARCH_TOKEN");
  if (env != NULL && *env != '\0') {
    if (strlen(env) > MN_MAX_TOKEN) {
      snprintf(err, errlen, "MONARCH_TOKEN is longer than %d bytes", MN_MAX_TOKEN);
      return MN_EAUTH;
    }
    return mn_auth_init(a, env, strlen(env));
  }
  if (file == NULL) file = getenv("MONARCH_TOKEN_FILE");
  if (file == NULL || *file == '\0') {
    snprintf(err, errlen, "no cluster token: set MONARCH_TOKEN or MONARCH_TOKEN_FILE");
    return MN_EAUTH;
  }
  FILE *f = fopen(file, "rb");
  if (f == NULL) {
    snprintf(err, errlen, "cannot read token file %s", file);
    return MN_EAUTH;
  }
  char buf[MN_MAX_TOKEN + 64];
  size_t n = fread(buf, 1, sizeof(buf), f);
  int more = fgetc(f) != EOF;
  fclose(f);
  if (more) n = sizeof(buf); /* too long: rejected below */
  /* Trailing whitespace is not part of the token (the Lua side trims the same way). */
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t')) n--;
  if (n == 0 || n > MN_MAX_TOKEN) {
    snprintf(err, errlen, "token file %s is empty or longer than %d bytes", file, MN_MAX_TOKEN);
    return MN_EAUTH;
  }
  int rc = mn_auth_init(a, buf, n);
  sodium_memzero(buf, sizeof(buf));
  return rc;
}

void mn_auth_generate(char *out, size_t len) {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  (void)mn_auth_global_init(); /* randombytes works even if init already ran */
  for (size_t i = 0; i < len; i++) out[i] = alphabet[randombytes_uniform(sizeof(alphabet) - 1)];
  out[len] = '\0';
}

void mn_auth_nonce(uint8_t nonce[MN_NONCE_LEN]) { randombytes_buf(nonce, MN_NONCE_LEN); }

void mn_auth_mac_data(const mn_auth_t *a, char role, const uint8_t *na, const uint8_t *nb, const void *data,
                      size_t len, uint8_t mac[MN_MAC_LEN]) {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, a->key, sizeof(a->key));
  crypto_auth_hmacsha256_update(&st, (const unsigned char *)&role, 1);
  crypto_auth_hmacsha256_update(&st, na, MN_NONCE_LEN);
  crypto_auth_hmacsha256_update(&st, nb, MN_NONCE_LEN);
  if (len > 0) crypto_auth_hmacsha256_update(&st, data, len);
  crypto_auth_hmacsha256_final(&st, mac);
}

void mn_auth_mac(const mn_auth_t *a, char role, const uint8_t *na, const uint8_t *nb,
                 uint8_t mac[MN_MAC_LEN]) {
  mn_auth_mac_data(a, role, na, nb, NULL, 0, mac);
}

int mn_auth_check_data(const mn_auth_t *a, char role, const uint8_t *na, const uint8_t *nb, const void *data,
                       size_t len, const uint8_t *mac, size_t maclen) {
  uint8_t want[MN_MAC_LEN];
  if (maclen != MN_MAC_LEN) return MN_EAUTH;
  mn_auth_mac_data(a, role, na, nb, data, len, want);
  return crypto_verify_32(want, mac) == 0 ? 0 : MN_EAUTH;
}

int mn_auth_check(const mn_auth_t *a, char role, const uint8_t *na, const uint8_t *nb,
                  const uint8_t *mac, size_t maclen) {
  return mn_auth_check_data(a, role, na, nb, NULL, 0, mac, maclen);
}
