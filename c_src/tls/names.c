/* Host classification for the TLS code (see names.h). */
#include "tls/names.h"

#include <string.h>

#include "common/error.h"
#include "policy/host.h"

int ce__tls_name_parse(const char *host, ce__tls_name_t *out) {
  if (host == NULL)
    return CE_EINVAL;
  /* strnlen keeps a hostile, very long string from being scanned twice;
   * anything past the longest name is refused before normalising. */
  size_t len = strnlen(host, CE_HOST_NAME_MAX + 1);
  if (len == 0 || len > CE_HOST_NAME_MAX)
    return CE_EINVAL;
  ce_host_t h;
  if (ce_host_normalize(host, len, &h) != 0)
    return CE_EINVAL;
  if (h.len != len || memcmp(h.text, host, len) != 0)
    return CE_EINVAL;
  switch (h.kind) {
  case CE_HOST_NAME:
    out->kind = CE__TLS_NAME_DNS;
    break;
  case CE_HOST_IPV4:
    out->kind = CE__TLS_NAME_IPV4;
    break;
  case CE_HOST_IPV6:
    out->kind = CE__TLS_NAME_IPV6;
    break;
  default:
    return CE_EINVAL;
  }
  memcpy(out->addr, h.addr, sizeof(out->addr));
  out->len = len;
  return CE_OK;
}
