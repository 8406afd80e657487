/*
 * Host and pattern normalisation (see host.h). The two public functions
 * walk the numbered steps of docs/host-matching.md §1 and §2 in order and
 * share the label conversion of §1 step 7, which in pattern mode also
 * accepts '*' and reports the §2 error codes.
 */
#include "policy/host.h"

#include <stdlib.h>
#include <string.h>

#include <unicase.h>
#include <uninorm.h>
#include <unistr.h>

#include "common/error.h"
#include "policy/ip.h"
#include "policy/punycode.h"

/* A non-ASCII label longer than this many input bytes cannot convert to 63
 * bytes or fewer: every output code point comes from at most a dozen input
 * bytes (the longest canonical compositions, e.g. Hangul L+V+T or Greek
 * omega with three marks), and an A-label is at least "xn--" plus one byte
 * per code point. Such labels are reported as too long without being
 * converted, which keeps the scratch buffers below fixed. */
#define LABEL_INPUT_MAX 1024
/* Room for the case-mapped label in the common case; libunistring falls
 * back to malloc when its result is longer. */
#define LOWER_BUF_SIZE (2 * LABEL_INPUT_MAX)
/* "xn--", the ACE prefix of RFC 5890 §2.3.2.1. */
#define ACE_PREFIX "xn--"
#define ACE_PREFIX_LEN 4
/* The largest port of docs/host-matching.md §1 step 4 and its digit count. */
#define PORT_MAX 65535u
#define PORT_DIGITS_MAX 5

typedef enum { MODE_HOST, MODE_PATTERN } norm_mode_t;

const char *ce_pattern_err_code(ce_pattern_err_t err) {
  switch (err) {
  case CE_PATTERN_OK:
    return "ok";
#define XX(name, code, hint)                                                   \
  case CE_PATTERN_##name:                                                      \
    return code;
    CE_PATTERN_ERR_MAP(XX)
#undef XX
  default:
    return "unknown";
  }
}

const char *ce_pattern_err_hint(ce_pattern_err_t err) {
  switch (err) {
  case CE_PATTERN_OK:
    return "the pattern is valid";
#define XX(name, code, hint)                                                   \
  case CE_PATTERN_##name:                                                      \
    return hint;
    CE_PATTERN_ERR_MAP(XX)
#undef XX
  default:
    return "unknown pattern error";
  }
}

static int is_label_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int is_lower_label_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

static char ascii_lower(unsigned char c) {
  return (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
}

static size_t count_byte(const char *s, size_t n, char c) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    k += s[i] == c;
  return k;
}

static int contains(const char *s, size_t n, const char *needle) {
  size_t m = strlen(needle);
  for (size_t i = 0; i + m <= n; i++) {
    if (memcmp(s + i, needle, m) == 0)
      return 1;
  }
  return 0;
}

/* Stores an IP literal in *out, turning IPv4-mapped IPv6 into IPv4 as
 * docs/host-matching.md §1 asks, so one rule covers both spellings. */
static void set_ipv6(ce_host_t *out, const uint8_t addr[16]) {
  memset(out->addr, 0, sizeof(out->addr));
  if (ce_ipv6_is_v4_mapped(addr)) {
    out->kind = CE_HOST_IPV4;
    memcpy(out->addr, addr + 12, 4);
    out->len = ce_ipv4_format(out->addr, out->text);
  } else {
    out->kind = CE_HOST_IPV6;
    memcpy(out->addr, addr, 16);
    out->len = ce_ipv6_format(out->addr, out->text);
  }
}

static void set_ipv4(ce_host_t *out, const uint8_t addr[4]) {
  memset(out->addr, 0, sizeof(out->addr));
  out->kind = CE_HOST_IPV4;
  memcpy(out->addr, addr, 4);
  out->len = ce_ipv4_format(out->addr, out->text);
}

/* Checks the ASCII code points of a converted (or, for over-long input,
 * unconverted) non-ASCII label. Case mapping turns non-ASCII characters
 * into letters only, so an ASCII byte outside a-z 0-9 - _ after conversion
 * was already such a byte (or an upper-case letter) before it. */
static int idn_ascii_ok(const uint8_t *s, size_t n, int lowered) {
  for (size_t i = 0; i < n; i++) {
    if (s[i] >= 0x80)
      continue;
    if (lowered ? !is_lower_label_byte(s[i]) : !is_label_byte(s[i]))
      return 0;
  }
  return 1;
}

/* Converts one non-ASCII label (docs/host-matching.md §1 step 7, third
 * bullet) into out[0..CE_HOST_LABEL_MAX). The caller has checked UTF-8
 * validity and, in pattern mode, the absence of '*'. */
static int convert_idn_label(const uint8_t *s, size_t n, char *out,
                             size_t *out_len, ce_pattern_err_t *err) {
  if (n > LABEL_INPUT_MAX) {
    *err = idn_ascii_ok(s, n, 0) ? CE_PATTERN_LABEL_TOO_LONG : CE_PATTERN_BAD_CHAR;
    return CE_EINVAL;
  }

  /* Unicode's Final_Sigma rule would lower-case a word-final capital sigma
   * to U+03C2 and any other to U+03C3. The spec asks for the plain full
   * case mapping (Elixir's String.downcase/1 default mode, which ignores
   * that context), so map every U+03A3 to U+03C3 first; both are two bytes
   * in UTF-8. */
  uint8_t in[LABEL_INPUT_MAX];
  memcpy(in, s, n);
  for (size_t i = 0; i + 1 < n; i++) {
    if (in[i] == 0xCE && in[i + 1] == 0xA3) {
      in[i] = 0xCF;
      in[i + 1] = 0x83;
    }
  }

  uint8_t lower_buf[LOWER_BUF_SIZE];
  size_t lower_len = sizeof(lower_buf);
  uint8_t *lower = u8_tolower(in, n, NULL, UNINORM_NFC, lower_buf, &lower_len);
  if (lower == NULL)
    return CE_ENOMEM; /* the input is valid UTF-8, so only ENOMEM is left */

  int rc = 0;
  int all_ascii = 1;
  for (size_t i = 0; i < lower_len; i++)
    all_ascii &= lower[i] < 0x80;

  if (!idn_ascii_ok(lower, lower_len, 1)) {
    *err = CE_PATTERN_BAD_CHAR;
    rc = CE_EINVAL;
    goto done;
  }
  if (all_ascii) {
    /* Case mapping alone made it ASCII (KELVIN SIGN -> 'k'). */
    if (lower_len > CE_HOST_LABEL_MAX) {
      *err = CE_PATTERN_LABEL_TOO_LONG;
      rc = CE_EINVAL;
      goto done;
    }
    memcpy(out, lower, lower_len);
    *out_len = lower_len;
    goto done;
  }

  /* An A-label holds "xn--" plus at least one byte per code point, so more
   * than CE_HOST_LABEL_MAX code points can never fit. */
  uint32_t cps[CE_HOST_LABEL_MAX];
  size_t ncp = 0;
  for (size_t i = 0; i < lower_len;) {
    ucs4_t uc;
    int step = u8_mbtouc(&uc, lower + i, lower_len - i);
    if (ncp == CE_HOST_LABEL_MAX) {
      *err = CE_PATTERN_LABEL_TOO_LONG;
      rc = CE_EINVAL;
      goto done;
    }
    cps[ncp++] = uc;
    i += (size_t)(step > 0 ? step : 1);
  }

  size_t puny_len = 0;
  memcpy(out, ACE_PREFIX, ACE_PREFIX_LEN);
  rc = ce_punycode_encode(cps, ncp, out + ACE_PREFIX_LEN,
                          CE_HOST_LABEL_MAX - ACE_PREFIX_LEN, &puny_len);
  if (rc != 0) {
    *err = CE_PATTERN_LABEL_TOO_LONG;
    rc = CE_EINVAL;
    goto done;
  }
  *out_len = ACE_PREFIX_LEN + puny_len;

done:
  if (lower != lower_buf)
    free(lower);
  return rc;
}

/* Converts one label per §1 step 7 (host mode) or §2 step 9 (pattern mode)
 * into out[0..CE_HOST_LABEL_MAX). Returns 0, CE_EINVAL with *err set, or
 * CE_ENOMEM. */
static int convert_label(const char *s, size_t n, norm_mode_t mode, char *out,
                         size_t *out_len, ce_pattern_err_t *err) {
  const uint8_t *u = (const uint8_t *)s;
  int non_ascii = 0;

  if (n == 0) {
    *err = CE_PATTERN_EMPTY_LABEL;
    return CE_EINVAL;
  }
  for (size_t i = 0; i < n; i++)
    non_ascii |= u[i] >= 0x80;

  if (non_ascii) {
    if (u8_check(u, n) != NULL) {
      *err = CE_PATTERN_BAD_UTF8;
      return CE_EINVAL;
    }
    if (mode == MODE_PATTERN && memchr(s, '*', n) != NULL) {
      *err = CE_PATTERN_WILDCARD_IDN;
      return CE_EINVAL;
    }
    return convert_idn_label(u, n, out, out_len, err);
  }

  for (size_t i = 0; i < n; i++) {
    if (!is_label_byte(u[i]) && !(mode == MODE_PATTERN && u[i] == '*')) {
      *err = CE_PATTERN_BAD_CHAR;
      return CE_EINVAL;
    }
  }
  if (n > CE_HOST_LABEL_MAX) {
    *err = CE_PATTERN_LABEL_TOO_LONG;
    return CE_EINVAL;
  }
  for (size_t i = 0; i < n; i++)
    out[i] = ascii_lower(u[i]);
  *out_len = n;
  return 0;
}

/* docs/host-matching.md §1 step 9 / §2 step 11: a last label that is all
 * digits or "0x" plus hex digits is an IPv4 spelling some resolvers accept
 * ("127.1", "0x7f.1"), so it must not pass as a name. */
static int ipv4_like_label(const char *s, size_t n) {
  size_t i = 0;
  if (n >= 2 && s[0] == '0' && s[1] == 'x') {
    for (i = 2; i < n; i++) {
      if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
        return 0;
    }
    return 1;
  }
  for (i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return 0;
  }
  return n > 0;
}

/* §2 step 11: a glob made only of digits, '*' and dots ("10.*.*.*",
 * "169.254.169.*") reads as an address range, but globs never match IP
 * literals (§3), so such a rule would silently match nothing. Refusing it
 * keeps a deny rule from failing open. */
static int ipv4_shaped_glob(const char *s, size_t n) {
  int star = 0, digit = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '*')
      star = 1;
    else if (s[i] >= '0' && s[i] <= '9')
      digit = 1;
    else if (s[i] != '.')
      return 0;
  }
  return star && digit;
}

/* Steps 7-9 of §1 (host mode) or 9-11 of §2 (pattern mode) on a name whose
 * trailing dot is already gone. In pattern mode every label is checked even
 * after the name has outgrown CE_HOST_NAME_MAX, because a label error
 * further right takes precedence over name_too_long (§2 step order). */
static int normalize_name(const char *s, size_t n, norm_mode_t mode,
                          ce_host_t *out, ce_pattern_err_t *err) {
  char label[CE_HOST_LABEL_MAX];
  char last[CE_HOST_LABEL_MAX];
  size_t label_len = 0, last_len = 0;
  size_t total = 0; /* length of the whole converted name, even past the cap */
  size_t i = 0;

  for (;;) {
    const char *dot = memchr(s + i, '.', n - i);
    size_t end = dot != NULL ? (size_t)(dot - s) : n;
    int rc = convert_label(s + i, end - i, mode, label, &label_len, err);
    if (rc != 0)
      return rc;

    size_t sep = total > 0 ? 1 : 0;
    if (total + sep + label_len <= CE_HOST_NAME_MAX) {
      if (sep)
        out->text[total] = '.';
      memcpy(out->text + total + sep, label, label_len);
    } else if (mode == MODE_HOST) {
      return CE_EINVAL; /* any failure makes a host invalid; stop early */
    }
    total += sep + label_len;
    memcpy(last, label, label_len);
    last_len = label_len;

    if (dot == NULL)
      break;
    i = end + 1;
  }

  if (total > CE_HOST_NAME_MAX) {
    *err = CE_PATTERN_NAME_TOO_LONG;
    return CE_EINVAL;
  }
  if (ipv4_like_label(last, last_len) ||
      (mode == MODE_PATTERN && ipv4_shaped_glob(out->text, total))) {
    *err = CE_PATTERN_BAD_IP;
    return CE_EINVAL;
  }
  out->kind = CE_HOST_NAME;
  memset(out->addr, 0, sizeof(out->addr));
  out->text[total] = '\0';
  out->len = total;
  return 0;
}

/* §1 step 4: "1-5 ASCII digits with a value of at most 65535". */
static int valid_port(const char *s, size_t n) {
  unsigned value = 0;
  if (n == 0 || n > PORT_DIGITS_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return 0;
    value = value * 10 + (unsigned)(s[i] - '0');
  }
  return value <= PORT_MAX;
}

int ce_host_normalize(const char *in, size_t len, ce_host_t *out) {
  ce_pattern_err_t ignored = CE_PATTERN_OK;
  uint8_t addr[16];

  /* Step 1. */
  if (len == 0)
    return CE_EINVAL;

  /* Step 2: "[addr]" or "[addr]:port". */
  if (in[0] == '[') {
    const char *close = memchr(in, ']', len);
    if (close == NULL)
      return CE_EINVAL;
    size_t inner = (size_t)(close - in) - 1;
    size_t rest = len - (size_t)(close - in) - 1;
    if (rest > 0 && (close[1] != ':' || !valid_port(close + 2, rest - 1)))
      return CE_EINVAL;
    if (ce_ipv6_parse(in + 1, inner, addr) != 0)
      return CE_EINVAL;
    set_ipv6(out, addr);
    return 0;
  }

  /* Step 3: two or more colons can only be a bare IPv6 address. */
  size_t colons = count_byte(in, len, ':');
  if (colons >= 2) {
    if (ce_ipv6_parse(in, len, addr) != 0)
      return CE_EINVAL;
    set_ipv6(out, addr);
    return 0;
  }

  /* Step 4: drop ":port". */
  size_t n = len;
  if (colons == 1) {
    const char *colon = memchr(in, ':', len);
    n = (size_t)(colon - in);
    if (!valid_port(colon + 1, len - n - 1))
      return CE_EINVAL;
  }

  /* Step 5: one trailing dot names the same host (RFC 1034 §3.1). */
  if (n > 0 && in[n - 1] == '.')
    n--;
  if (n == 0)
    return CE_EINVAL;

  /* Step 6. */
  if (ce_ipv4_parse(in, n, addr) == 0) {
    set_ipv4(out, addr);
    return 0;
  }

  /* Steps 7-9. */
  int rc = normalize_name(in, n, MODE_HOST, out, &ignored);
  return rc == CE_ENOMEM ? CE_ENOMEM : rc == 0 ? 0 : CE_EINVAL;
}

/* §2 step 3: ADDR/N, an address range, where ADDR is an IPv4 address or
 * an IPv6 one (bare or in brackets) and N one to three digits. */
static bool is_cidr(const char *in, size_t len) {
  const char *slash = memchr(in, '/', len);
  if (slash == NULL)
    return false;
  size_t al = (size_t)(slash - in), nl = len - al - 1;
  if (nl < 1 || nl > 3)
    return false;
  for (size_t i = 1; i <= nl; i++)
    if (slash[i] < '0' || slash[i] > '9')
      return false;
  uint8_t addr[16];
  if (al >= 2 && in[0] == '[' && in[al - 1] == ']')
    return ce_ipv6_parse(in + 1, al - 2, addr) == 0;
  return ce_ipv4_parse(in, al, addr) == 0 || ce_ipv6_parse(in, al, addr) == 0;
}

int ce_pattern_normalize(const char *in, size_t len, ce_host_t *out,
                         ce_pattern_err_t *err) {
  ce_pattern_err_t local = CE_PATTERN_OK;
  ce_pattern_err_t *e = err != NULL ? err : &local;
  uint8_t addr[16];

  *e = CE_PATTERN_OK;
  if (len == 0) {
    *e = CE_PATTERN_EMPTY;
    return CE_EINVAL;
  }
  if (contains(in, len, "://")) {
    *e = CE_PATTERN_SCHEME;
    return CE_EINVAL;
  }
  for (size_t i = 0; i < len; i++) {
    if (in[i] == '/' || in[i] == '?' || in[i] == '#') {
      *e = is_cidr(in, len) ? CE_PATTERN_CIDR : CE_PATTERN_PATH;
      return CE_EINVAL;
    }
  }
  if (in[0] == '[') {
    if (len < 2 || in[len - 1] != ']' || ce_ipv6_parse(in + 1, len - 2, addr) != 0) {
      *e = CE_PATTERN_BAD_IP;
      return CE_EINVAL;
    }
    set_ipv6(out, addr);
    return 0;
  }
  size_t colons = count_byte(in, len, ':');
  if (colons >= 2) {
    if (ce_ipv6_parse(in, len, addr) != 0) {
      *e = CE_PATTERN_BAD_IP;
      return CE_EINVAL;
    }
    set_ipv6(out, addr);
    return 0;
  }
  if (colons == 1) {
    *e = CE_PATTERN_PORT;
    return CE_EINVAL;
  }
  if (contains(in, len, "***")) {
    *e = CE_PATTERN_STAR_RUN;
    return CE_EINVAL;
  }
  size_t n = len;
  if (in[n - 1] == '.')
    n--;
  if (n == 0) {
    *e = CE_PATTERN_EMPTY_LABEL;
    return CE_EINVAL;
  }
  if (ce_ipv4_parse(in, n, addr) == 0) {
    set_ipv4(out, addr);
    return 0;
  }
  int rc = normalize_name(in, n, MODE_PATTERN, out, e);
  if (rc == CE_ENOMEM)
    *e = CE_PATTERN_OK;
  return rc;
}
