/*
 * The URL rules of docs/host-matching.md §4, used by dry runs
 * (`condukt-egress policy eval`) to find the host of a URL. This is not a
 * general URL parser: it only cuts out the authority's host[:port] and
 * refuses the spellings that parsers read differently.
 */
#ifndef CE_POLICY_URL_H
#define CE_POLICY_URL_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
  bool is_url;      /* the input contained "://" */
  bool plain;       /* the scheme is http or ws: no TLS (a bare host: false) */
  const char *host; /* host[:port] inside the input, not NUL-terminated */
  size_t host_len;
  const char *path; /* URL: the path and query up to '#' ("/" when empty
                       or only a query); bare host: NULL */
  size_t path_len;
} ce_url_t;

/* Splits a dry-run input. A string without "://" is a bare host[:port] and
 * is returned whole with is_url false. A URL must have the scheme http,
 * https, ws or wss (any case) and no '\' in its authority (the authority
 * runs to the first '/', '?' or '#'); its userinfo ends at the last '@'.
 * The host span is not normalised: pass it to ce_host_normalize().
 * Returns 0 and fills *out, or CE_EINVAL for an invalid URL, in which case
 * out->is_url is true and the host span is empty. */
int ce_url_split(const char *in, size_t len, ce_url_t *out);

#endif
