/*
 * Dry-run URL splitting (see url.h and docs/host-matching.md §4).
 */
#include "policy/url.h"

#include <string.h>
#include <strings.h>

#include "common/error.h"

static const char *const SCHEMES[] = {"http", "https", "ws", "wss"};

static const char *find_sep(const char *s, size_t n) {
  for (size_t i = 0; i + 3 <= n; i++) {
    if (s[i] == ':' && s[i + 1] == '/' && s[i + 2] == '/')
      return s + i;
  }
  return NULL;
}

int ce_url_split(const char *in, size_t len, ce_url_t *out) {
  const char *sep = find_sep(in, len);

  if (sep == NULL) {
    out->is_url = false;
    out->plain = false;
    out->host = in;
    out->host_len = len;
    out->path = NULL;
    out->path_len = 0;
    return 0;
  }
  out->is_url = true;
  out->plain = false;
  out->host = in;
  out->host_len = 0;
  out->path = "/";
  out->path_len = 1;

  size_t scheme_len = (size_t)(sep - in);
  int known = 0;
  for (size_t k = 0; k < sizeof(SCHEMES) / sizeof(SCHEMES[0]); k++) {
    if (scheme_len == strlen(SCHEMES[k]) &&
        strncasecmp(in, SCHEMES[k], scheme_len) == 0)
      known = 1;
  }
  if (!known)
    return CE_EINVAL;
  out->plain = (scheme_len == 4 && strncasecmp(in, "http", 4) == 0) ||
               (scheme_len == 2 && strncasecmp(in, "ws", 2) == 0);

  const char *auth = sep + 3;
  const char *end = in + len;
  const char *auth_end = auth;
  while (auth_end < end && *auth_end != '/' && *auth_end != '?' && *auth_end != '#')
    auth_end++;

  /* WHATWG URL parsers treat '\' like '/' in special schemes while RFC 3986
   * parsers keep it in the userinfo, so "https://evil.net\@api.github.com"
   * names a different host to each; refuse it outright. */
  if (memchr(auth, '\\', (size_t)(auth_end - auth)) != NULL)
    return CE_EINVAL;

  /* RFC 3986 §3.2.1: userinfo ends at '@'; taking the last one means an
   * unescaped '@' in a password cannot smuggle in another host. */
  const char *host = auth;
  for (const char *p = auth; p < auth_end; p++) {
    if (*p == '@')
      host = p + 1;
  }
  out->host = host;
  out->host_len = (size_t)(auth_end - host);
  const char *frag = memchr(auth_end, '#', (size_t)(end - auth_end));
  const char *path_end = frag != NULL ? frag : end;
  if (auth_end < path_end && *auth_end == '/') {
    out->path = auth_end;
    out->path_len = (size_t)(path_end - auth_end);
  }
  return 0;
}
