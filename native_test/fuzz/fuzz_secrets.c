/*
 * libFuzzer target for the sidecar's secrets file (docs/credentials.md,
 * c_src/policy/credential.c: ce_secrets_load_buffer).
 *
 * Beyond "no crash, no sanitizer report", it checks what injection relies
 * on: every value the loader accepts is a valid header value (no CR, LF,
 * NUL or other control byte, no surrounding whitespace) that can be set
 * again, and a refusal leaves nothing allocated.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "policy/credential.h"

static void check(int ok) {
  if (!ok)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ce_secrets_t *s = NULL;
  char err[CE_SECRETS_ERROR_MAX];
  int rc = ce_secrets_load_buffer((const char *)data, size, &s, err);
  if (rc != 0) {
    check(s == NULL && err[0] != '\0');
    return 0;
  }
  /* Every secret the loader took reads back valid; setting it again with
   * the same value works. */
  static const char *const names[] = {"gh", "a", "SEKRIT", "x-y.z_0"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    size_t len = 0;
    const char *v = ce_secrets_get(s, names[i], strlen(names[i]), &len);
    if (v == NULL)
      continue;
    check(ce_credential_value_check(v, len) == NULL);
    char copy[CE_CRED_VALUE_MAX];
    memcpy(copy, v, len);
    check(ce_secrets_set(s, names[i], strlen(names[i]), copy, len) == 0);
  }
  ce_secrets_free(s);
  return 0;
}
