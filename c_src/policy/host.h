/*
 * Request-host and host-pattern normalisation, docs/host-matching.md §1
 * and §2. The result of either is a ce_host_t: a DNS name in its ASCII
 * form, an IPv4 literal or an IPv6 literal, with its canonical text.
 *
 * Both functions work on (pointer, length) spans that need not be
 * NUL-terminated, keep their output in the caller's ce_host_t, and do not
 * allocate for all-ASCII input. A label with non-ASCII bytes goes through
 * libunistring's case mapping, which may allocate (and frees before
 * returning); SNI and HTTP Host values are ASCII on the wire, so the proxy
 * path never gets there in practice.
 */
#ifndef CE_POLICY_HOST_H
#define CE_POLICY_HOST_H

#include <stddef.h>
#include <stdint.h>

/* RFC 1035 §2.3.4: a label is at most 63 octets. */
#define CE_HOST_LABEL_MAX 63
/* RFC 1035 §2.3.4 caps a name at 255 octets on the wire, which is 253
 * bytes of dotted text without the trailing dot. */
#define CE_HOST_NAME_MAX 253
/* The longest normalised text of any kind; IP literals are shorter. */
#define CE_HOST_TEXT_MAX CE_HOST_NAME_MAX

typedef enum {
  CE_HOST_NAME = 1, /* a DNS name; text is its ASCII form */
  CE_HOST_IPV4 = 2, /* addr[0..4) holds the address */
  CE_HOST_IPV6 = 3, /* addr[0..16) holds the address; never v4-mapped */
} ce_host_kind_t;

typedef struct {
  ce_host_kind_t kind;
  uint8_t addr[16];                  /* zero for names */
  size_t len;                        /* strlen(text) */
  char text[CE_HOST_TEXT_MAX + 1];   /* canonical text, NUL-terminated */
} ce_host_t;

/* The pattern error codes of docs/host-matching.md §2: the symbolic code
 * that appears in messages and in the vector file, and a sentence telling
 * the author what to write instead. */
#define CE_PATTERN_ERR_MAP(XX)                                                  \
  XX(EMPTY, "empty", "a pattern cannot be empty")                               \
  XX(SCHEME, "scheme", "write the host only, without \"://\"")                  \
  XX(CIDR, "cidr",                                                              \
     "CIDR ranges are not host patterns; a rule names host names and single IP " \
     "addresses, so list the addresses one by one (\"10.0.0.1\") or name the "   \
     "hosts (private ranges are refused anyway unless --allow-private covers "  \
     "them)")                                                                   \
  XX(PATH, "path", "write the host only, without a path, query or fragment")    \
  XX(PORT, "port", "policies match hosts on every port; drop the \":port\"")    \
  XX(STAR_RUN, "star_run",                                                      \
     "use * for part of one label or ** across labels; *** means nothing")      \
  XX(EMPTY_LABEL, "empty_label",                                                \
     "a name cannot have an empty label (\"..\", a leading dot, or only a dot)") \
  XX(BAD_CHAR, "bad_char",                                                      \
     "a label may only contain letters, digits, \"-\", \"_\" and \"*\"")        \
  XX(BAD_UTF8, "bad_utf8", "the pattern is not valid UTF-8")                    \
  XX(WILDCARD_IDN, "wildcard_idn",                                              \
     "\"*\" cannot share a label with non-ASCII characters")                    \
  XX(LABEL_TOO_LONG, "label_too_long",                                          \
     "a label is longer than 63 bytes after conversion")                        \
  XX(NAME_TOO_LONG, "name_too_long",                                            \
     "the name is longer than 253 bytes after conversion")                      \
  XX(BAD_IP, "bad_ip", "this is not a valid IPv4 or IPv6 address")

typedef enum {
  CE_PATTERN_OK = 0,
#define XX(name, code, hint) CE_PATTERN_##name,
  CE_PATTERN_ERR_MAP(XX)
#undef XX
} ce_pattern_err_t;

/* Returns the code of docs/host-matching.md §2 ("scheme"), or "ok" for
 * CE_PATTERN_OK and "unknown" for anything else; never NULL. */
const char *ce_pattern_err_code(ce_pattern_err_t err);

/* Returns a static sentence explaining err; never NULL. */
const char *ce_pattern_err_hint(ce_pattern_err_t err);

/* Normalises a request host (SNI, Host header, :authority, URL authority
 * without userinfo) per docs/host-matching.md §1: an optional ":port" is
 * dropped, IPv4-mapped IPv6 becomes IPv4, names are lower-cased and
 * converted to their ASCII form.
 * Returns:
 *   0           *out holds the host;
 *   CE_EINVAL   the host is invalid (any §1 step failed);
 *   CE_ENOMEM   libunistring could not allocate while case-mapping a
 *               non-ASCII label.
 * On failure *out is unspecified; callers must treat the host as invalid. */
int ce_host_normalize(const char *in, size_t len, ce_host_t *out);

/* Checks and normalises a host pattern per docs/host-matching.md §2.
 * Returns:
 *   0           *out holds the pattern (a name may contain '*');
 *   CE_EINVAL   the pattern is invalid and *err names the first failing
 *               step's code;
 *   CE_ENOMEM   libunistring could not allocate.
 * err may be NULL. *err is CE_PATTERN_OK unless CE_EINVAL is returned; on
 * failure *out is unspecified. */
int ce_pattern_normalize(const char *in, size_t len, ce_host_t *out,
                         ce_pattern_err_t *err);

#endif
