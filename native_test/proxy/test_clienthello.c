/* Tests for c_src/proxy/clienthello.c, written from RFC 8446 §4.1.2 and
 * §5.1, RFC 5246 §6.2.1 and §7.4.1.2, RFC 6066 §3 and RFC 7301 §3.1.
 *
 * Two kinds of input: hellos captured from real clients on the build
 * machine (the .hex files in native_test/proxy/fixtures, made by capture.py),
 * and hellos assembled by the small builder below, which remembers where
 * every length field is so that each one can be corrupted in turn.
 *
 * Loops over many inputs count their failures and report the first one
 * with a single expectation, so that a run stays fast and readable. */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "proxy/clienthello.h"
#include "support/failalloc.h"

#define FIXTURE_DIR CE_SOURCE_ROOT "/native_test/proxy/fixtures/"
/* Captured hellos are under 600 bytes; the cap only bounds the loader. */
#define FIXTURE_CAP 4096u
/* Big enough for a hello past CE_CLIENTHELLO_MAX_BYTES in 1-byte records. */
#define FRAMED_CAP (8u * CE_CLIENTHELLO_MAX_BYTES)
#define BUILD_CAP (2u * CE_CLIENTHELLO_MAX_BYTES)
#define MAX_FIELDS 64u
#define MAX_DEPTH 8u
#define RECORD_MAX 16384u

/* ---------------------------------------------------------------------- */
/* Byte helpers and the fixture loader.                                    */

static uint8_t *xmalloc(size_t n) {
  uint8_t *p = malloc(n);
  cr_assert_not_null(p);
  return p;
}

/* Reads a hex fixture: '#' lines are comments, whitespace is ignored. */
static size_t load_fixture(const char *name, uint8_t *out, size_t cap) {
  char path[512];
  snprintf(path, sizeof(path), "%s%s", FIXTURE_DIR, name);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "cannot open fixture %s", path);
  char line[256];
  size_t n = 0;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (line[0] == '#')
      continue;
    for (const char *p = line; p[0] != '\0' && p[0] != '\n'; p += 2) {
      unsigned v;
      cr_assert(p[1] != '\0' && sscanf(p, "%2x", &v) == 1, "%s: bad hex", name);
      cr_assert_lt(n, cap, "%s: larger than %zu bytes", name, cap);
      out[n++] = (uint8_t)v;
    }
  }
  fclose(f);
  cr_assert_gt(n, 0, "%s is empty", name);
  return n;
}

/* Concatenates the payloads of the records in rec[0..n): the handshake
 * message as the test sees it, independently of the parser. */
static size_t unframe(const uint8_t *rec, size_t n, uint8_t *msg) {
  size_t m = 0;
  for (size_t pos = 0; pos + 5 <= n;) {
    size_t len = (size_t)rec[pos + 3] << 8 | rec[pos + 4];
    cr_assert_leq(pos + 5 + len, n);
    memcpy(msg + m, rec + pos + 5, len);
    m += len;
    pos += 5 + len;
  }
  return m;
}

/* Writes one record header. */
static size_t put_record_header(uint8_t *out, uint8_t type, uint16_t version, size_t len) {
  out[0] = type;
  out[1] = (uint8_t)(version >> 8);
  out[2] = (uint8_t)version;
  out[3] = (uint8_t)(len >> 8);
  out[4] = (uint8_t)len;
  return 5;
}

/* Frames msg[0..m) as handshake records. Record i carries sizes[i %
 * nsizes] bytes (the last one what is left), so one size gives uniform
 * fragmentation and several an irregular pattern. Returns the length. */
static size_t frame_sizes(const uint8_t *msg, size_t m, const size_t *sizes,
                          size_t nsizes, uint16_t version, uint8_t *out) {
  size_t n = 0;
  for (size_t done = 0, i = 0; done < m; i++) {
    size_t k = sizes[i % nsizes];
    if (k > m - done)
      k = m - done;
    n += put_record_header(out + n, 22, version, k);
    memcpy(out + n, msg + done, k);
    n += k;
    done += k;
  }
  return n;
}

static size_t frame(const uint8_t *msg, size_t m, size_t k, uint8_t *out) {
  return frame_sizes(msg, m, &k, 1, 0x0301, out);
}

/* ---------------------------------------------------------------------- */
/* The builder: TLS vectors with their length prefixes patched on close.  */

typedef struct {
  uint8_t *b;
  size_t n;
  size_t open_at[MAX_DEPTH];
  unsigned open_width[MAX_DEPTH];
  size_t depth;
  /* Every closed length prefix, in the order the vectors were opened. */
  size_t field_at[MAX_FIELDS];
  unsigned field_width[MAX_FIELDS];
  size_t nfields;
} builder_t;

static builder_t *b_new(void) {
  builder_t *b = calloc(1, sizeof(*b));
  cr_assert_not_null(b);
  b->b = xmalloc(BUILD_CAP);
  return b;
}

static void b_free(builder_t *b) {
  free(b->b);
  free(b);
}

static void b_bytes(builder_t *b, const void *p, size_t n) {
  cr_assert_leq(b->n + n, BUILD_CAP);
  memcpy(b->b + b->n, p, n);
  b->n += n;
}

static void b_fill(builder_t *b, uint8_t v, size_t n) {
  cr_assert_leq(b->n + n, BUILD_CAP);
  memset(b->b + b->n, v, n);
  b->n += n;
}

static void b_uint(builder_t *b, unsigned width, size_t v) {
  for (unsigned i = width; i-- > 0;)
    b_fill(b, (uint8_t)(v >> (8 * i)), 1);
}

static void b_u8(builder_t *b, size_t v) { b_uint(b, 1, v); }
static void b_u16(builder_t *b, size_t v) { b_uint(b, 2, v); }

static void b_open(builder_t *b, unsigned width) {
  cr_assert_lt(b->depth, MAX_DEPTH);
  cr_assert_lt(b->nfields, MAX_FIELDS);
  b->open_at[b->depth] = b->n;
  b->open_width[b->depth] = width;
  b->depth++;
  b->field_at[b->nfields] = b->n;
  b->field_width[b->nfields] = width;
  b->nfields++;
  b_uint(b, width, 0);
}

static void b_close(builder_t *b) {
  cr_assert_gt(b->depth, 0);
  b->depth--;
  size_t at = b->open_at[b->depth];
  unsigned w = b->open_width[b->depth];
  size_t len = b->n - at - w;
  cr_assert_lt(len, (size_t)1 << (8 * w), "vector too long for its prefix");
  for (unsigned i = 0; i < w; i++)
    b->b[at + i] = (uint8_t)(len >> (8 * (w - 1 - i)));
}

/* The fixed part of a ClientHello, customisable field by field. */
typedef struct {
  uint8_t hs_type;
  uint16_t version;
  size_t session_id_len;
  size_t cipher_bytes;
  const uint8_t *compression;
  size_t compression_len;
  bool no_extensions; /* a TLS 1.2 hello ending after compression_methods */
} hello_opts_t;

static const uint8_t null_compression[] = {0};

static hello_opts_t defaults(void) {
  return (hello_opts_t){.hs_type = 1,
                        .version = 0x0303,
                        .session_id_len = 32,
                        .cipher_bytes = 6,
                        .compression = null_compression,
                        .compression_len = 1,
                        .no_extensions = false};
}

/* Writes the handshake header and the fixed fields, and opens the
 * extensions block unless opts say there is none. */
static void hello_begin(builder_t *b, const hello_opts_t *o) {
  b_u8(b, o->hs_type);
  b_open(b, 3);
  b_u16(b, o->version);
  b_fill(b, 0xa5, 32); /* random */
  b_open(b, 1);
  b_fill(b, 0x5e, o->session_id_len);
  b_close(b);
  b_open(b, 2);
  for (size_t i = 0; i < o->cipher_bytes; i++)
    b_u8(b, i % 2 == 0 ? 0x13 : 1 + (i / 2) % 3); /* TLS_AES_* suites */
  b_close(b);
  b_open(b, 1);
  b_bytes(b, o->compression, o->compression_len);
  b_close(b);
  if (!o->no_extensions)
    b_open(b, 2);
}

static void hello_end(builder_t *b) {
  while (b->depth > 0)
    b_close(b);
}

static void ext_raw(builder_t *b, unsigned type, const void *data, size_t n) {
  b_u16(b, type);
  b_open(b, 2);
  b_bytes(b, data, n);
  b_close(b);
}

/* server_name with one host_name entry of n bytes (RFC 6066 §3). */
static void ext_sni_n(builder_t *b, const char *name, size_t n) {
  b_u16(b, 0);
  b_open(b, 2);
  b_open(b, 2);
  b_u8(b, 0);
  b_open(b, 2);
  b_bytes(b, name, n);
  b_close(b);
  b_close(b);
  b_close(b);
}

static void ext_sni(builder_t *b, const char *name) { ext_sni_n(b, name, strlen(name)); }

/* ALPN with the names of a NULL-terminated list (RFC 7301 §3.1). */
static void ext_alpn(builder_t *b, const char *const *names) {
  b_u16(b, 16);
  b_open(b, 2);
  b_open(b, 2);
  for (; *names != NULL; names++) {
    b_open(b, 1);
    b_bytes(b, *names, strlen(*names));
    b_close(b);
  }
  b_close(b);
  b_close(b);
}

/* supported_versions offering TLS 1.3 and 1.2 (RFC 8446 §4.2.1). */
static void ext_supported_versions(builder_t *b) {
  static const uint8_t v[] = {4, 0x03, 0x04, 0x03, 0x03};
  ext_raw(b, 43, v, sizeof(v));
}

static const char *const h2_http11[] = {"h2", "http/1.1", NULL};

/* A plain TLS 1.3-style hello naming sni (NULL: none) and alpn. */
static void std_hello(builder_t *b, const char *sni, const char *const *alpn) {
  hello_opts_t o = defaults();
  hello_begin(b, &o);
  if (sni != NULL)
    ext_sni(b, sni);
  ext_supported_versions(b);
  if (alpn != NULL)
    ext_alpn(b, alpn);
  hello_end(b);
}

/* Frames the builder's message in records of k bytes and parses it. */
static int parse_built(const builder_t *b, size_t k, ce_clienthello_t *h, size_t *framed_len) {
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t n = frame(b->b, b->n, k, rec);
  int rc = ce_clienthello_parse(rec, n, h);
  if (framed_len != NULL)
    *framed_len = n;
  free(rec);
  return rc;
}

static int parse_msg(const uint8_t *msg, size_t m, ce_clienthello_t *h) {
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t n = frame(msg, m, RECORD_MAX, rec);
  int rc = ce_clienthello_parse(rec, n, h);
  free(rec);
  return rc;
}

/* ---------------------------------------------------------------------- */
/* Real hellos.                                                            */

#define LONG_NAME                                                                  \
  "l0-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx."                   \
  "l1-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx."                   \
  "l2-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx."                   \
  "l3-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx.example"

static const struct fixture {
  const char *file;
  const char *sni;  /* NULL: no server_name */
  const char *alpn; /* the names joined with ','; NULL: no ALPN extension */
  size_t records;   /* how many records the client used */
} fixtures[] = {
    {"openssl_sni_alpn.hex", "example.com", "h2,http/1.1", 1},
    {"openssl_tls12_nosni.hex", NULL, NULL, 1},
    {"openssl_ip_sni.hex", "192.0.2.1", "http/1.1", 1},
    {"curl_h2.hex", "www.example.org", "h2,http/1.1", 1},
    {"python_ssl.hex", "api.example.net", "http/1.1", 1},
    {"openssl_frag512.hex", LONG_NAME, "h2,http/1.1", 2},
};
#define NFIXTURES (sizeof(fixtures) / sizeof(fixtures[0]))

static void alpn_join(const ce_clienthello_t *h, char *out, size_t cap) {
  out[0] = '\0';
  for (size_t i = 0; i < h->alpn_count; i++) {
    if (i > 0)
      strncat(out, ",", cap - strlen(out) - 1);
    strncat(out, h->alpn[i].name, cap - strlen(out) - 1);
  }
}

/* Returns a description of how h differs from what f says, or NULL. */
static const char *mismatch(const ce_clienthello_t *h, const struct fixture *f) {
  char alpn[1024];
  if (h->has_sni != (f->sni != NULL))
    return "has_sni";
  if (f->sni != NULL && (strcmp(h->sni, f->sni) != 0 || h->sni_len != strlen(f->sni)))
    return "sni";
  if (h->has_alpn != (f->alpn != NULL))
    return "has_alpn";
  alpn_join(h, alpn, sizeof(alpn));
  if (f->alpn != NULL && strcmp(alpn, f->alpn) != 0)
    return "alpn";
  bool h2 = f->alpn != NULL && strstr(f->alpn, "h2") != NULL;
  bool h11 = f->alpn != NULL && strstr(f->alpn, "http/1.1") != NULL;
  if (h->offers_h2 != h2 || h->offers_http11 != h11)
    return "offers_*";
  if (h->legacy_version != 0x0303)
    return "legacy_version";
  return NULL;
}

Test(clienthello, real_hellos_parse) {
  for (size_t i = 0; i < NFIXTURES; i++) {
    uint8_t buf[FIXTURE_CAP], copy[FIXTURE_CAP];
    size_t n = load_fixture(fixtures[i].file, buf, sizeof(buf));
    memcpy(copy, buf, n);
    ce_clienthello_t h;
    int rc = ce_clienthello_parse(buf, n, &h);
    cr_expect_eq(rc, CE_OK, "%s: %s", fixtures[i].file, ce_err_name(rc));
    if (rc != CE_OK)
      continue;
    const char *bad = mismatch(&h, &fixtures[i]);
    cr_expect_null(bad, "%s: %s differs (sni \"%s\")", fixtures[i].file, bad, h.sni);
    cr_expect_eq(h.record_bytes, n, "%s", fixtures[i].file);
    cr_expect_arr_eq(buf, copy, n, "%s: the parser wrote to its input", fixtures[i].file);
  }
}

Test(clienthello, real_hellos_use_the_records_expected) {
  /* Guards the fixtures themselves: openssl_frag512 must stay a hello that
   * a real client split over two records. */
  for (size_t i = 0; i < NFIXTURES; i++) {
    uint8_t buf[FIXTURE_CAP];
    size_t n = load_fixture(fixtures[i].file, buf, sizeof(buf));
    size_t records = 0;
    for (size_t pos = 0; pos + 5 <= n; records++)
      pos += 5 + ((size_t)buf[pos + 3] << 8 | buf[pos + 4]);
    cr_expect_eq(records, fixtures[i].records, "%s", fixtures[i].file);
  }
}

/* Feeds every prefix of in[0..n): all but the whole must be CE_EAGAIN.
 * Returns the first prefix length that was not, or n. */
static size_t first_non_eagain_prefix(const uint8_t *in, size_t n) {
  ce_clienthello_t h;
  for (size_t p = 0; p < n; p++)
    if (ce_clienthello_parse(in, p, &h) != CE_EAGAIN)
      return p;
  return n;
}

Test(clienthello, every_split_point_of_real_hellos) {
  /* However TCP cuts the bytes, every read but the last says "more". */
  for (size_t i = 0; i < NFIXTURES; i++) {
    uint8_t buf[FIXTURE_CAP];
    size_t n = load_fixture(fixtures[i].file, buf, sizeof(buf));
    size_t p = first_non_eagain_prefix(buf, n);
    cr_expect_eq(p, n, "%s: prefix of %zu bytes is not CE_EAGAIN", fixtures[i].file, p);
  }
}

Test(clienthello, real_hellos_in_every_record_size) {
  /* RFC 8446 §5.1: handshake messages may be fragmented across records in
   * any way, down to one byte per record, which also splits the 4-byte
   * handshake header over up to four records. Each size is fed prefix by
   * prefix as well. */
  uint8_t *rec = xmalloc(FRAMED_CAP);
  for (size_t i = 0; i < NFIXTURES; i++) {
    uint8_t buf[FIXTURE_CAP], msg[FIXTURE_CAP];
    size_t n = load_fixture(fixtures[i].file, buf, sizeof(buf));
    size_t m = unframe(buf, n, msg);
    size_t failures = 0, first_k = 0;
    const char *why = NULL;
    for (size_t k = 1; k <= m; k++) {
      size_t rn = frame(msg, m, k, rec);
      ce_clienthello_t h;
      int rc = ce_clienthello_parse(rec, rn, &h);
      const char *bad = rc != CE_OK                            ? ce_err_name(rc)
                        : h.record_bytes != rn                 ? "record_bytes"
                        : first_non_eagain_prefix(rec, rn) != rn ? "a prefix"
                                                               : mismatch(&h, &fixtures[i]);
      if (bad != NULL && failures++ == 0) {
        first_k = k;
        why = bad;
      }
    }
    cr_expect_eq(failures, 0, "%s: %zu record sizes fail, first %zu (%s)", fixtures[i].file,
                 failures, first_k, why);
  }
  free(rec);
}

Test(clienthello, real_hellos_in_irregular_records) {
  /* Patterns a middlebox might produce: tiny records between full ones,
   * and the handshake header split 1+3 and 3+1. */
  static const size_t patterns[][4] = {
      {1, 3, 100, 7}, {3, 1, 2, 500}, {2, 2, 1, 1}, {4, 1, 16384, 1}, {1, 16384, 1, 1},
  };
  uint8_t *rec = xmalloc(FRAMED_CAP);
  for (size_t i = 0; i < NFIXTURES; i++) {
    uint8_t buf[FIXTURE_CAP], msg[FIXTURE_CAP];
    size_t n = load_fixture(fixtures[i].file, buf, sizeof(buf));
    size_t m = unframe(buf, n, msg);
    for (size_t p = 0; p < sizeof(patterns) / sizeof(patterns[0]); p++) {
      size_t rn = frame_sizes(msg, m, patterns[p], 4, 0x0303, rec);
      ce_clienthello_t h;
      int rc = ce_clienthello_parse(rec, rn, &h);
      cr_expect_eq(rc, CE_OK, "%s pattern %zu: %s", fixtures[i].file, p, ce_err_name(rc));
      if (rc == CE_OK) {
        cr_expect_null(mismatch(&h, &fixtures[i]), "%s pattern %zu", fixtures[i].file, p);
        cr_expect_eq(h.record_bytes, rn);
      }
      cr_expect_eq(first_non_eagain_prefix(rec, rn), rn, "%s pattern %zu", fixtures[i].file, p);
    }
  }
  free(rec);
}

Test(clienthello, trailing_bytes_after_the_hello_are_not_consumed) {
  /* A TLS 1.3 client may send change_cipher_spec (RFC 8446 §D.4) and early
   * data right behind its hello; those bytes belong to the TLS library. */
  static const uint8_t after[] = {20, 3, 3, 0, 1, 1, 23, 3, 3, 0, 2, 0xde, 0xad};
  for (size_t i = 0; i < NFIXTURES; i++) {
    uint8_t buf[FIXTURE_CAP + sizeof(after)];
    size_t n = load_fixture(fixtures[i].file, buf, FIXTURE_CAP);
    memcpy(buf + n, after, sizeof(after));
    for (size_t extra = 0; extra <= sizeof(after); extra++) {
      ce_clienthello_t h;
      cr_expect_eq(ce_clienthello_parse(buf, n + extra, &h), CE_OK);
      cr_expect_eq(h.record_bytes, n, "%s + %zu bytes", fixtures[i].file, extra);
    }
  }
  /* Even bytes that are not TLS at all. */
  builder_t *b = b_new();
  std_hello(b, "a.example", h2_http11);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t rn = frame(b->b, b->n, 100, rec);
  memcpy(rec + rn, "GET / HTTP/1.1\r\n", 16);
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(rec, rn + 16, &h), CE_OK);
  cr_expect_eq(h.record_bytes, rn);
  free(rec);
  b_free(b);
}

/* ---------------------------------------------------------------------- */
/* Synthetic hellos: what is accepted.                                     */

Test(clienthello, synthetic_hello_fields) {
  builder_t *b = b_new();
  std_hello(b, "Example.COM", h2_http11);
  ce_clienthello_t h;
  size_t rn;
  cr_assert_eq(parse_built(b, RECORD_MAX, &h, &rn), CE_OK);
  cr_expect_eq(h.legacy_version, 0x0303);
  cr_expect(h.has_sni);
  cr_expect_str_eq(h.sni, "Example.COM", "bytes are kept as sent, case included");
  cr_expect_eq(h.sni_len, 11);
  cr_expect(h.has_alpn);
  cr_expect_eq(h.alpn_count, 2);
  cr_expect_str_eq(h.alpn[0].name, "h2");
  cr_expect_eq(h.alpn[0].len, 2);
  cr_expect_str_eq(h.alpn[1].name, "http/1.1");
  cr_expect_eq(h.alpn[1].len, 8);
  cr_expect(h.offers_h2);
  cr_expect(h.offers_http11);
  cr_expect_eq(h.record_bytes, rn);
  b_free(b);
}

Test(clienthello, no_sni_and_no_alpn) {
  builder_t *b = b_new();
  std_hello(b, NULL, NULL);
  ce_clienthello_t h;
  cr_assert_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_OK);
  cr_expect_not(h.has_sni);
  cr_expect_eq(h.sni_len, 0);
  cr_expect_str_eq(h.sni, "");
  cr_expect_not(h.has_alpn);
  cr_expect_eq(h.alpn_count, 0);
  cr_expect_not(h.offers_h2);
  cr_expect_not(h.offers_http11);
  b_free(b);
}

Test(clienthello, sni_bytes_are_kept_as_sent) {
  /* RFC 6066 §3 forbids IP literals and trailing dots in HostName, but the
   * parser only transports the name: the policy layer normalises it and
   * treats a literal as what it is (docs/host-matching.md §1). */
  static const char *names[] = {"192.0.2.1", "::1", "[2001:db8::1]", "example.com.",
                                "xn--bcher-kva.example", "caf\xc3\xa9.example", "a", "-_*"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    builder_t *b = b_new();
    std_hello(b, names[i], NULL);
    ce_clienthello_t h;
    cr_expect_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_OK, "%s", names[i]);
    cr_expect_str_eq(h.sni, names[i]);
    cr_expect_eq(h.sni_len, strlen(names[i]));
    b_free(b);
  }
}

Test(clienthello, sni_of_255_bytes_is_the_longest) {
  char name[257];
  memset(name, 'a', sizeof(name));
  for (size_t n = 254; n <= 256; n++) {
    builder_t *b = b_new();
    hello_opts_t o = defaults();
    hello_begin(b, &o);
    ext_sni_n(b, name, n);
    hello_end(b);
    ce_clienthello_t h;
    int rc = parse_built(b, RECORD_MAX, &h, NULL);
    cr_expect_eq(rc, n <= CE_CLIENTHELLO_MAX_SNI ? CE_OK : CE_EPARSE, "%zu bytes", n);
    if (rc == CE_OK)
      cr_expect_eq(strlen(h.sni), n);
    b_free(b);
  }
}

/* server_name whose list is written by hand: entries of (type, bytes). */
static int parse_with_sni_list(const uint8_t *list, size_t n, ce_clienthello_t *h) {
  builder_t *b = b_new();
  hello_opts_t o = defaults();
  hello_begin(b, &o);
  b_u16(b, 0);
  b_open(b, 2);
  b_open(b, 2);
  b_bytes(b, list, n);
  hello_end(b);
  int rc = parse_built(b, RECORD_MAX, h, NULL);
  b_free(b);
  return rc;
}

Test(clienthello, unknown_name_types_are_skipped) {
  /* RFC 6066 §3: a future NameType's data begins with a 16-bit length. */
  static const uint8_t before[] = {7, 0, 3, 'x', 'y', 'z', 0, 0, 3, 'a', '.', 'b'};
  static const uint8_t after[] = {0, 0, 3, 'a', '.', 'b', 1, 0, 0, 255, 0, 1, 0};
  static const uint8_t only_unknown[] = {1, 0, 3, 'a', '.', 'b'};
  ce_clienthello_t h;
  cr_expect_eq(parse_with_sni_list(before, sizeof(before), &h), CE_OK);
  cr_expect_str_eq(h.sni, "a.b");
  cr_expect_eq(parse_with_sni_list(after, sizeof(after), &h), CE_OK);
  cr_expect_str_eq(h.sni, "a.b");
  cr_expect_eq(parse_with_sni_list(only_unknown, sizeof(only_unknown), &h), CE_OK);
  cr_expect_not(h.has_sni, "no host_name entry, no SNI");
}

Test(clienthello, alpn_names_past_the_kept_ones_still_set_the_flags) {
  const char *names[CE_CLIENTHELLO_MAX_ALPN + 3];
  char text[CE_CLIENTHELLO_MAX_ALPN][8];
  for (size_t i = 0; i < CE_CLIENTHELLO_MAX_ALPN; i++) {
    snprintf(text[i], sizeof(text[i]), "p%zu", i);
    names[i] = text[i];
  }
  names[CE_CLIENTHELLO_MAX_ALPN] = "http/1.1";
  names[CE_CLIENTHELLO_MAX_ALPN + 1] = "h2";
  names[CE_CLIENTHELLO_MAX_ALPN + 2] = NULL;
  builder_t *b = b_new();
  hello_opts_t o = defaults();
  hello_begin(b, &o);
  ext_alpn(b, names);
  hello_end(b);
  ce_clienthello_t h;
  cr_assert_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_OK);
  cr_expect_eq(h.alpn_count, CE_CLIENTHELLO_MAX_ALPN);
  cr_expect_str_eq(h.alpn[CE_CLIENTHELLO_MAX_ALPN - 1].name, text[CE_CLIENTHELLO_MAX_ALPN - 1]);
  cr_expect(h.offers_h2);
  cr_expect(h.offers_http11);
  b_free(b);
}

Test(clienthello, alpn_names_are_opaque_bytes) {
  /* RFC 7301 §3.1: ProtocolName is opaque<1..2^8-1>; a 255-byte name and
   * look-alikes of h2 are kept without setting the flags. */
  char big[256];
  memset(big, 'z', 255);
  big[255] = '\0';
  const char *const names[] = {big, "H2", "h2c", "http/1.10", "h", "http/1.0", NULL};
  builder_t *b = b_new();
  hello_opts_t o = defaults();
  hello_begin(b, &o);
  ext_alpn(b, names);
  hello_end(b);
  ce_clienthello_t h;
  cr_assert_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_OK);
  cr_expect_eq(h.alpn_count, 6);
  cr_expect_eq(h.alpn[0].len, 255);
  cr_expect_str_eq(h.alpn[0].name, big);
  cr_expect_str_eq(h.alpn[2].name, "h2c");
  cr_expect_not(h.offers_h2);
  cr_expect_not(h.offers_http11);
  b_free(b);
}

Test(clienthello, tls12_hello_without_extensions) {
  /* RFC 5246 §7.4.1.2: extensions may be absent altogether, or present
   * and empty. */
  for (int empty_block = 0; empty_block <= 1; empty_block++) {
    builder_t *b = b_new();
    hello_opts_t o = defaults();
    o.no_extensions = !empty_block;
    o.session_id_len = 0;
    hello_begin(b, &o);
    hello_end(b);
    ce_clienthello_t h;
    cr_expect_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_OK, "empty block %d", empty_block);
    cr_expect_not(h.has_sni);
    cr_expect_not(h.has_alpn);
    b_free(b);
  }
}

Test(clienthello, fixed_field_limits_that_pass) {
  /* Session ids of 0 and 32 bytes, a long cipher list, and
   * a compression list that merely contains null (RFC 5246 §7.4.1.2). */
  static const uint8_t methods[] = {1, 0, 64};
  size_t sessions[] = {0, 32};
  for (size_t i = 0; i < 2; i++) {
    builder_t *b = b_new();
    hello_opts_t o = defaults();
    o.session_id_len = sessions[i];
    o.cipher_bytes = 2 * 30000;
    o.compression = methods;
    o.compression_len = sizeof(methods);
    hello_begin(b, &o);
    ext_sni(b, "a.example");
    hello_end(b);
    ce_clienthello_t h;
    cr_expect_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_OK, "session id %zu", sessions[i]);
    cr_expect_str_eq(h.sni, "a.example");
    b_free(b);
  }
}

Test(clienthello, legacy_versions_of_the_03_family_pass_through) {
  /* The TLS library negotiates the version (RFC 8446 §4.2.1) and answers
   * with an alert where it must; the parser only needs TLS framing. */
  static const uint16_t versions[] = {0x0300, 0x0301, 0x0302, 0x0303, 0x0304, 0x03ff};
  for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
    builder_t *b = b_new();
    hello_opts_t o = defaults();
    o.version = versions[i];
    hello_begin(b, &o);
    hello_end(b);
    ce_clienthello_t h;
    cr_expect_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_OK, "%04x", versions[i]);
    cr_expect_eq(h.legacy_version, versions[i]);
    b_free(b);
  }
}

Test(clienthello, record_versions) {
  /* RFC 8446 §5.1 lets the initial hello use {03,01}; RFC 5246 Appendix
   * E.1 lets an old-server-friendly client use {03,00}. Nothing newer than
   * {03,03} is ever written on the record layer. */
  builder_t *b = b_new();
  std_hello(b, "v.example", NULL);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t k = 50;
  for (unsigned v = 0x0300; v <= 0x0305; v++) {
    size_t rn = frame_sizes(b->b, b->n, &k, 1, (uint16_t)v, rec);
    ce_clienthello_t h;
    int want = v <= 0x0303 ? CE_OK : CE_EPARSE;
    cr_expect_eq(ce_clienthello_parse(rec, rn, &h), want, "record version %04x", v);
    /* The verdict is reached on the third byte. */
    cr_expect_eq(ce_clienthello_parse(rec, 3, &h), want == CE_OK ? CE_EAGAIN : want);
  }
  /* Any {03,00}..{03,03} on any record, even mixed. */
  size_t rn = frame(b->b, b->n, 50, rec);
  rec[55 + 1] = 3;
  rec[55 + 2] = 0;
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(rec, rn, &h), CE_OK);
  /* A later record with another major version is broken TLS, not "not
   * TLS". */
  rec[55 + 1] = 2;
  cr_expect_eq(ce_clienthello_parse(rec, rn, &h), CE_EPARSE);
  cr_expect_eq(ce_clienthello_parse(rec, 57, &h), CE_EPARSE);
  free(rec);
  b_free(b);
}

Test(clienthello, records_of_exactly_two_to_the_fourteen) {
  /* RFC 8446 §5.1: 2^14 is allowed, 2^14 + 1 is a record_overflow. */
  builder_t *b = b_new();
  hello_opts_t o = defaults();
  hello_begin(b, &o);
  ext_sni(b, "big.example");
  b_u16(b, 0xffce); /* an unknown (private use) extension type */
  b_open(b, 2);
  b_fill(b, 0x42, 20000);
  b_close(b);
  hello_end(b);
  ce_clienthello_t h;
  size_t rn;
  cr_expect_eq(parse_built(b, RECORD_MAX, &h, &rn), CE_OK);
  cr_expect_eq(rn, b->n + 10, "two records");
  cr_expect_str_eq(h.sni, "big.example");

  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t k = RECORD_MAX + 1;
  rn = frame_sizes(b->b, b->n, &k, 1, 0x0301, rec);
  cr_expect_eq(ce_clienthello_parse(rec, rn, &h), CE_EPARSE);
  cr_expect_eq(ce_clienthello_parse(rec, 5, &h), CE_EPARSE, "decided by the header");
  free(rec);
  b_free(b);
}

Test(clienthello, hybrid_post_quantum_key_share) {
  /* What a browser sends with X25519MLKEM768 (group 0x11ec, a 1216-byte
   * share) next to X25519: OpenSSL 3.0 here cannot produce one, so it is
   * assembled from draft-ietf-tls-ecdhe-mlkem's sizes. Parsed in one
   * record and in the 1024-byte records some stacks use. */
  builder_t *b = b_new();
  hello_opts_t o = defaults();
  o.cipher_bytes = 32;
  hello_begin(b, &o);
  ext_raw(b, 0x0a0a, "", 0); /* GREASE (RFC 8701) */
  ext_sni(b, "pq.example");
  ext_supported_versions(b);
  b_u16(b, 51); /* key_share (RFC 8446 §4.2.8) */
  b_open(b, 2);
  b_open(b, 2);
  b_u16(b, 0x11ec);
  b_open(b, 2);
  b_fill(b, 0x77, 1216);
  b_close(b);
  b_u16(b, 0x001d);
  b_open(b, 2);
  b_fill(b, 0x99, 32);
  b_close(b);
  b_close(b);
  b_close(b);
  ext_alpn(b, h2_http11);
  ext_raw(b, 0x1a1a, "\0", 1); /* a second GREASE value, another type */
  hello_end(b);
  cr_assert_gt(b->n, 1400);
  size_t sizes[] = {RECORD_MAX, 1024};
  for (size_t i = 0; i < 2; i++) {
    ce_clienthello_t h;
    size_t rn;
    cr_expect_eq(parse_built(b, sizes[i], &h, &rn), CE_OK);
    cr_expect_str_eq(h.sni, "pq.example");
    cr_expect(h.offers_h2);
    cr_expect_eq(h.record_bytes, rn);
  }
  b_free(b);
}

Test(clienthello, pre_shared_key_last_is_fine) {
  builder_t *b = b_new();
  hello_opts_t o = defaults();
  hello_begin(b, &o);
  ext_sni(b, "psk.example");
  ext_raw(b, 41, "\0\0", 2);
  hello_end(b);
  ce_clienthello_t h;
  cr_expect_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_OK);
  b_free(b);
}

/* ---------------------------------------------------------------------- */
/* What is refused, and with which code.                                   */

Test(clienthello, empty_input_asks_for_more) {
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(NULL, 0, &h), CE_EAGAIN);
  static const uint8_t one[] = {22};
  cr_expect_eq(ce_clienthello_parse(one, 1, &h), CE_EAGAIN);
}

Test(clienthello, not_tls_is_not_supported) {
  /* Cleartext protocols on port 443 are told apart on the first byte. */
  static const char *texts[] = {"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "G",
                                "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "SSH-2.0-OpenSSH_9.2\r\n"};
  for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
    ce_clienthello_t h;
    cr_expect_eq(ce_clienthello_parse((const uint8_t *)texts[i], strlen(texts[i]), &h),
                 CE_ENOTSUP, "%s", texts[i]);
  }
  /* 0x16 followed by something that is no SSL/TLS version. */
  static const uint8_t not_version[] = {22, 2, 0, 0, 5};
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(not_version, sizeof(not_version), &h), CE_ENOTSUP);
  cr_expect_eq(ce_clienthello_parse(not_version, 2, &h), CE_ENOTSUP);
  /* Other TLS record types cannot start a connection either. */
  static const uint8_t alert[] = {21, 3, 1, 0, 2, 2, 40};
  cr_expect_eq(ce_clienthello_parse(alert, sizeof(alert), &h), CE_ENOTSUP);
}

Test(clienthello, sslv2_compatible_hello_is_not_supported) {
  /* RFC 5246 Appendix E.2: a 2-byte header with the high bit set, then
   * msg_type 1, version {03,01}, cipher_spec_length 3, session id 0,
   * challenge 16. The high bit alone tells it from a TLS record. */
  static const uint8_t v2[] = {0x80, 0x1c, 0x01, 0x03, 0x01, 0x00, 0x03, 0x00, 0x00, 0x00,
                               0x10, 0x00, 0x00, 0x2f, 1,    2,    3,    4,    5,    6,
                               7,    8,    9,    10,   11,   12,   13,   14,   15,   16};
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(v2, sizeof(v2), &h), CE_ENOTSUP);
  cr_expect_eq(ce_clienthello_parse(v2, 1, &h), CE_ENOTSUP);
}

Test(clienthello, other_handshake_types_are_refused) {
  /* RFC 8446 §4: the client's first message is client_hello (1). */
  for (unsigned t = 0; t < 256; t++) {
    if (t == 1)
      continue;
    builder_t *b = b_new();
    hello_opts_t o = defaults();
    o.hs_type = (uint8_t)t;
    hello_begin(b, &o);
    hello_end(b);
    uint8_t *rec = xmalloc(FRAMED_CAP);
    size_t rn = frame(b->b, b->n, 1, rec);
    ce_clienthello_t h;
    cr_expect_eq(ce_clienthello_parse(rec, rn, &h), CE_EPARSE, "type %u", t);
    cr_expect_eq(ce_clienthello_parse(rec, 6, &h), CE_EPARSE, "type %u, first byte", t);
    free(rec);
    b_free(b);
  }
}

Test(clienthello, zero_length_record_is_refused) {
  /* RFC 8446 §5.1: no zero-length handshake fragments, first or later. */
  builder_t *b = b_new();
  std_hello(b, "z.example", NULL);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  ce_clienthello_t h;
  size_t n = put_record_header(rec, 22, 0x0301, 0);
  n += frame(b->b, b->n, RECORD_MAX, rec + n);
  cr_expect_eq(ce_clienthello_parse(rec, n, &h), CE_EPARSE);
  cr_expect_eq(ce_clienthello_parse(rec, 5, &h), CE_EPARSE);

  n = frame(b->b, 10, 10, rec);
  n += put_record_header(rec + n, 22, 0x0301, 0);
  n += frame(b->b + 10, b->n - 10, RECORD_MAX, rec + n);
  cr_expect_eq(ce_clienthello_parse(rec, n, &h), CE_EPARSE);
  free(rec);
  b_free(b);
}

Test(clienthello, other_records_between_fragments_are_refused) {
  /* RFC 8446 §5.1: "if a handshake message is split over two or more
   * records, there MUST NOT be any other records between them." */
  static const uint8_t between[][7] = {
      {21, 3, 3, 0, 2, 1, 0}, /* alert: warning close_notify */
      {20, 3, 3, 0, 1, 1, 0}, /* change_cipher_spec */
      {23, 3, 3, 0, 1, 0, 0}, /* application_data */
      {24, 3, 3, 0, 1, 1, 0}, /* heartbeat (RFC 6520) */
  };
  builder_t *b = b_new();
  std_hello(b, "i.example", h2_http11);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  for (size_t cut = 1; cut < b->n; cut += 37) {
    for (size_t i = 0; i < sizeof(between) / sizeof(between[0]); i++) {
      size_t n = frame(b->b, cut, RECORD_MAX, rec);
      size_t before = n;
      size_t len = 5 + between[i][4];
      memcpy(rec + n, between[i], len);
      n += len;
      n += frame(b->b + cut, b->n - cut, RECORD_MAX, rec + n);
      ce_clienthello_t h;
      cr_expect_eq(ce_clienthello_parse(rec, n, &h), CE_EPARSE, "type %u at %zu",
                   between[i][0], cut);
      cr_expect_eq(ce_clienthello_parse(rec, before + 1, &h), CE_EPARSE,
                   "decided by the type byte");
    }
  }
  free(rec);
  b_free(b);
}

Test(clienthello, bytes_after_the_hello_in_its_record_are_refused) {
  /* The hello ends its record (RFC 8446 §5.1, see clienthello.c): another
   * handshake message behind it in the same record is refused, both when
   * the record is whole and when only its header and the handshake
   * header have arrived. */
  builder_t *b = b_new();
  std_hello(b, "t.example", NULL);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t n = put_record_header(rec, 22, 0x0301, b->n + 4);
  memcpy(rec + n, b->b, b->n);
  n += b->n;
  memcpy(rec + n, "\x01\x00\x00\x00", 4);
  n += 4;
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(rec, n, &h), CE_EPARSE);
  cr_expect_eq(ce_clienthello_parse(rec, 9, &h), CE_EPARSE);
  free(rec);
  b_free(b);
}

Test(clienthello, every_length_field_off_by_one) {
  /* Each length prefix of the message, one above and one below the truth.
   * The handshake length is the only one the record walk reads: one more
   * means "wait for another record" (CE_EAGAIN), one less leaves bytes in
   * the record behind the hello (CE_EPARSE). A record length one more
   * than the hello also claims a byte behind it (CE_EPARSE), one less turns
   * the last hello byte into the start of a record that is not a handshake
   * one (CE_EPARSE). Every inner length must
   * fail the exact-length checks (RFC 8446 §3.4). */
  builder_t *b = b_new();
  hello_opts_t o = defaults();
  hello_begin(b, &o);
  ext_sni(b, "len.example");
  ext_supported_versions(b);
  ext_alpn(b, h2_http11);
  ext_raw(b, 0xffce, "zz", 2);
  hello_end(b);
  cr_assert_eq(b->n, ((size_t)b->b[1] << 16 | (size_t)b->b[2] << 8 | b->b[3]) + 4,
               "the builder must patch the handshake length");
  cr_assert_geq(b->nfields, 14);

  uint8_t *msg = xmalloc(b->n);
  size_t bad = 0;
  for (size_t f = 0; f < b->nfields; f++) {
    for (int delta = -1; delta <= 1; delta += 2) {
      memcpy(msg, b->b, b->n);
      size_t at = b->field_at[f], w = b->field_width[f], v = 0;
      for (size_t i = 0; i < w; i++)
        v = v << 8 | msg[at + i];
      v += (size_t)(ptrdiff_t)delta;
      for (size_t i = 0; i < w; i++)
        msg[at + i] = (uint8_t)(v >> (8 * (w - 1 - i)));
      ce_clienthello_t h;
      int rc = parse_msg(msg, b->n, &h);
      int want = f == 0 && delta > 0 ? CE_EAGAIN : CE_EPARSE;
      if (rc != want) {
        bad++;
        cr_log_error("length field %zu (offset %zu, %zu bytes) %+d: %s", f, at, w, delta,
                     ce_err_name(rc));
      }
    }
  }
  cr_expect_eq(bad, 0, "%zu corrupted lengths were not refused (log above)", bad);

  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t rn = frame(b->b, b->n, RECORD_MAX, rec);
  rec[4]++;
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(rec, rn, &h), CE_EPARSE, "record length + 1");
  rec[4] = (uint8_t)(rec[4] - 2);
  cr_expect_eq(ce_clienthello_parse(rec, rn, &h), CE_EPARSE, "record length - 1");
  free(rec);
  free(msg);
  b_free(b);
}

Test(clienthello, truncated_messages_are_refused) {
  /* A handshake length that ends the message early, at every byte. The one
   * cut that is valid ends right after compression_methods: a TLS 1.2
   * hello without extensions (RFC 5246 §7.4.1.2). */
  builder_t *b = b_new();
  std_hello(b, "cut.example", h2_http11);
  size_t no_ext_len = 4 + 2 + 32 + 1 + 32 + 2 + 6 + 1 + 1;
  uint8_t *msg = xmalloc(b->n);
  size_t bad = 0;
  for (size_t m = 4; m < b->n; m++) {
    memcpy(msg, b->b, m);
    msg[1] = (uint8_t)((m - 4) >> 16);
    msg[2] = (uint8_t)((m - 4) >> 8);
    msg[3] = (uint8_t)(m - 4);
    ce_clienthello_t h;
    int rc = parse_msg(msg, m, &h);
    if (rc != (m == no_ext_len ? CE_OK : CE_EPARSE) && bad++ == 0)
      cr_log_error("cut at %zu: %s", m, ce_err_name(rc));
  }
  cr_expect_eq(bad, 0, "%zu cuts misjudged", bad);
  free(msg);
  b_free(b);
}

Test(clienthello, fixed_field_violations) {
  static const uint8_t no_null[] = {1};
  struct {
    const char *what;
    hello_opts_t o;
  } cases[] = {
      {"session id of 33 bytes (RFC 8446 §4.1.2 <0..32>)", defaults()},
      {"no cipher suite (<2..2^16-2>)", defaults()},
      {"odd cipher suite bytes", defaults()},
      {"no compression method (<1..2^8-1>)", defaults()},
      {"compression without null (RFC 5246 §7.4.1.2)", defaults()},
      {"legacy_version outside {03,XX}", defaults()},
      {"legacy_version {02,00}", defaults()},
  };
  cases[0].o.session_id_len = 33;
  cases[1].o.cipher_bytes = 0;
  cases[2].o.cipher_bytes = 5;
  cases[3].o.compression_len = 0;
  cases[4].o.compression = no_null;
  cases[5].o.version = 0x0403;
  cases[6].o.version = 0x0200;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    builder_t *b = b_new();
    hello_begin(b, &cases[i].o);
    ext_sni(b, "f.example");
    hello_end(b);
    ce_clienthello_t h;
    cr_expect_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_EPARSE, "%s", cases[i].what);
    b_free(b);
  }
}

Test(clienthello, duplicate_extensions_are_refused) {
  /* RFC 8446 §4.2: at most one extension of each type; two server_names
   * would let two parsers disagree on the host. */
  static const unsigned types[] = {0, 16, 43, 0xffce, 0xffff, 0x0a0a};
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
    builder_t *b = b_new();
    hello_opts_t o = defaults();
    hello_begin(b, &o);
    if (types[i] == 0) {
      ext_sni(b, "one.example");
      ext_supported_versions(b);
      ext_sni(b, "two.example");
    } else if (types[i] == 16) {
      ext_alpn(b, h2_http11);
      ext_alpn(b, h2_http11);
    } else {
      ext_raw(b, types[i], "a", 1);
      ext_sni(b, "d.example");
      ext_raw(b, types[i], "b", 1);
    }
    hello_end(b);
    ce_clienthello_t h;
    cr_expect_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_EPARSE, "type %u", types[i]);
    b_free(b);
  }
}

Test(clienthello, pre_shared_key_not_last_is_refused) {
  /* RFC 8446 §4.2.11: pre_shared_key "MUST be the last extension". */
  builder_t *b = b_new();
  hello_opts_t o = defaults();
  hello_begin(b, &o);
  ext_raw(b, 41, "\0\0", 2);
  ext_sni(b, "psk.example");
  hello_end(b);
  ce_clienthello_t h;
  cr_expect_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_EPARSE);
  b_free(b);
}

Test(clienthello, bad_server_name_lists) {
  static const struct {
    const char *what;
    uint8_t list[24];
    size_t n;
  } cases[] = {
      {"two host_names (RFC 6066 §3)", {0, 0, 1, 'a', 0, 0, 1, 'b'}, 8},
      {"the same host_name twice", {0, 0, 1, 'a', 0, 0, 1, 'a'}, 8},
      {"empty host_name (HostName<1..2^16-1>)", {0, 0, 0}, 3},
      {"NUL inside", {0, 0, 5, 'a', 0, 'b', '.', 'c'}, 8},
      {"NUL at the end", {0, 0, 2, 'a', 0}, 5},
      {"NUL alone", {0, 0, 1, 0}, 4},
      {"entry cut after its type", {0}, 1},
      {"entry cut inside its length", {0, 0}, 2},
      {"name longer than the list", {0, 0, 4, 'a', 'b'}, 5},
      {"unknown type longer than the list", {9, 0, 4, 'a'}, 4},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ce_clienthello_t h;
    cr_expect_eq(parse_with_sni_list(cases[i].list, cases[i].n, &h), CE_EPARSE, "%s",
                 cases[i].what);
  }
}

Test(clienthello, bad_server_name_extensions) {
  static const struct {
    const char *what;
    uint8_t data[16];
    size_t n;
  } cases[] = {
      {"empty extension_data (only a server sends that)", {0}, 0},
      {"one byte", {0}, 1},
      {"empty server_name_list (<1..2^16-1>)", {0, 0}, 2},
      {"list length past the extension", {0, 5, 0, 0, 1, 'a'}, 6},
      {"bytes after the list", {0, 4, 0, 0, 1, 'a', 0}, 7},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    builder_t *b = b_new();
    hello_opts_t o = defaults();
    hello_begin(b, &o);
    ext_raw(b, 0, cases[i].data, cases[i].n);
    hello_end(b);
    ce_clienthello_t h;
    cr_expect_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_EPARSE, "%s", cases[i].what);
    b_free(b);
  }
}

Test(clienthello, bad_alpn_extensions) {
  /* RFC 7301 §3.1: protocol_name_list<2..2^16-1> of ProtocolName<1..2^8-1>,
   * "Empty strings MUST NOT be included". */
  static const struct {
    const char *what;
    uint8_t data[16];
    size_t n;
  } cases[] = {
      {"empty extension_data", {0}, 0},
      {"empty list", {0, 0}, 2},
      {"one-byte list", {0, 1, 0}, 3},
      {"an empty name alone", {0, 2, 0, 0}, 4},
      {"an empty name after a good one", {0, 4, 2, 'h', '2', 0}, 6},
      {"an empty name before a good one", {0, 4, 0, 2, 'h', '2'}, 6},
      {"a name longer than the list", {0, 3, 3, 'h', '2'}, 5},
      {"list length past the extension", {0, 9, 2, 'h', '2'}, 5},
      {"bytes after the list", {0, 3, 2, 'h', '2', 0}, 6},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    builder_t *b = b_new();
    hello_opts_t o = defaults();
    hello_begin(b, &o);
    ext_sni(b, "alpn.example");
    ext_raw(b, 16, cases[i].data, cases[i].n);
    hello_end(b);
    ce_clienthello_t h;
    cr_expect_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_EPARSE, "%s", cases[i].what);
    b_free(b);
  }
}

Test(clienthello, bad_extension_framing) {
  /* The extensions block must hold whole extensions and end with the
   * message; anything else is refused. */
  static const struct {
    const char *what;
    uint8_t tail[12];
    size_t n;
  } cases[] = {
      {"one byte where the block length goes", {0}, 1},
      {"block length one short", {0, 4, 0xff, 0xce, 0, 1, 'x'}, 7},
      {"block length one long", {0, 6, 0xff, 0xce, 0, 1, 'x'}, 7},
      {"extension cut inside its type", {0, 1, 0xff}, 3},
      {"extension cut inside its length", {0, 3, 0xff, 0xce, 0}, 5},
      {"extension data past the block", {0, 5, 0xff, 0xce, 0, 2, 'x'}, 7},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    builder_t *b = b_new();
    hello_opts_t o = defaults();
    o.no_extensions = true;
    hello_begin(b, &o);
    b_bytes(b, cases[i].tail, cases[i].n);
    hello_end(b);
    ce_clienthello_t h;
    cr_expect_eq(parse_built(b, RECORD_MAX, &h, NULL), CE_EPARSE, "%s", cases[i].what);
    b_free(b);
  }
}

/* ---------------------------------------------------------------------- */
/* The size limit.                                                         */

/* A hello whose message is exactly m bytes, padded by an unknown
 * extension. */
static void hello_of_size(builder_t *b, size_t m) {
  hello_opts_t o = defaults();
  hello_begin(b, &o);
  ext_sni(b, "size.example");
  b_u16(b, 0xffce);
  b_open(b, 2);
  size_t pad = m - b->n;
  cr_assert_leq(pad, 0xffffu);
  b_fill(b, 0x33, pad);
  hello_end(b);
  cr_assert_eq(b->n, m);
}

Test(clienthello, limit_is_exact) {
  /* 65516 message bytes in four full records take exactly
   * CE_CLIENTHELLO_MAX_BYTES; one more byte does not fit in any framing. */
  size_t fits = CE_CLIENTHELLO_MAX_BYTES - 4 * 5;
  for (size_t m = fits - 1; m <= fits + 1; m++) {
    builder_t *b = b_new();
    hello_of_size(b, m);
    ce_clienthello_t h;
    size_t rn;
    int want = m <= fits ? CE_OK : CE_ETOOBIG;
    cr_expect_eq(parse_built(b, RECORD_MAX, &h, &rn), want, "message of %zu bytes", m);
    if (m == fits)
      cr_expect_eq(h.record_bytes, CE_CLIENTHELLO_MAX_BYTES);
    if (want == CE_OK)
      cr_expect_str_eq(h.sni, "size.example");
    b_free(b);
  }
}

Test(clienthello, too_big_is_known_from_the_headers) {
  /* The verdict needs only the first record header and the handshake
   * header: the proxy does not buffer 64 KiB to learn it. */
  builder_t *b = b_new();
  hello_of_size(b, CE_CLIENTHELLO_MAX_BYTES);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t rn = frame(b->b, b->n, RECORD_MAX, rec);
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(rec, rn, &h), CE_ETOOBIG);
  cr_expect_eq(ce_clienthello_parse(rec, 8, &h), CE_EAGAIN, "length not known yet");
  cr_expect_eq(ce_clienthello_parse(rec, 9, &h), CE_ETOOBIG);
  /* Split 1+3, the handshake length arrives in the second record. */
  size_t sizes[] = {1, RECORD_MAX};
  rn = frame_sizes(b->b, b->n, sizes, 2, 0x0301, rec);
  cr_expect_eq(ce_clienthello_parse(rec, 13, &h), CE_EAGAIN);
  cr_expect_eq(ce_clienthello_parse(rec, 14, &h), CE_ETOOBIG);
  /* A declared length of 2^24 - 1. */
  memcpy(rec, "\x16\x03\x01\x00\x04\x01\xff\xff\xff", 9);
  cr_expect_eq(ce_clienthello_parse(rec, 9, &h), CE_ETOOBIG);
  free(rec);
  b_free(b);
}

Test(clienthello, small_records_can_make_a_hello_too_big) {
  /* A 12 KiB hello in 1-byte records needs 72 KiB of buffer. The verdict
   * comes with the first record header after which the bytes still due
   * cannot fit even in full records, long before the limit is buffered. */
  const size_t m = 12 * 1024;
  builder_t *b = b_new();
  hello_of_size(b, m);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t rn = frame(b->b, b->n, 1, rec);
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(rec, rn, &h), CE_ETOOBIG);
  /* Record c (counting from 1) ends at 6c and leaves m - c bytes due. */
  size_t c = 1;
  while (6 * c + (m - c) + 5 * ((m - c + RECORD_MAX - 1) / RECORD_MAX) <= CE_CLIENTHELLO_MAX_BYTES)
    c++;
  size_t header_end = 6 * (c - 1) + 5;
  cr_expect_eq(ce_clienthello_parse(rec, header_end - 1, &h), CE_EAGAIN);
  cr_expect_eq(ce_clienthello_parse(rec, header_end, &h), CE_ETOOBIG);
  free(rec);
  b_free(b);
}

Test(clienthello, a_buffer_past_the_limit_with_a_small_hello_is_fine) {
  /* The limit is on the hello, not on what the caller happened to read. */
  builder_t *b = b_new();
  std_hello(b, "small.example", NULL);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  memset(rec, 0xee, 2 * CE_CLIENTHELLO_MAX_BYTES);
  size_t rn = frame(b->b, b->n, RECORD_MAX, rec);
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(rec, 2 * CE_CLIENTHELLO_MAX_BYTES, &h), CE_OK);
  cr_expect_eq(h.record_bytes, rn);
  free(rec);
  b_free(b);
}

/* ---------------------------------------------------------------------- */
/* Cost of repeated calls.                                                 */

Test(clienthello, byte_by_byte_up_to_the_limit, .timeout = 60) {
  /* The proxy calls again after every read. Fed one byte at a time, a hello
   * of the maximum size costs one record walk per call (four records)
   * and one full parse: this finishes in milliseconds, where re-copying
   * the buffered bytes on each call would take seconds. */
  builder_t *b = b_new();
  hello_of_size(b, CE_CLIENTHELLO_MAX_BYTES - 4 * 5);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t rn = frame(b->b, b->n, RECORD_MAX, rec);
  cr_assert_eq(rn, CE_CLIENTHELLO_MAX_BYTES);
  cr_expect_eq(first_non_eagain_prefix(rec, rn), rn);
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(rec, rn, &h), CE_OK);
  free(rec);
  b_free(b);
}

Test(clienthello, byte_by_byte_in_one_byte_records, .timeout = 60) {
  /* The worst case for the record walk: every call steps over every
   * record so far. A 2 KiB hello (the size of a post-quantum one) in
   * 1-byte records is 12 KiB of input and 12 Ki calls. */
  builder_t *b = b_new();
  hello_of_size(b, 2048);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t rn = frame(b->b, b->n, 1, rec);
  cr_expect_eq(first_non_eagain_prefix(rec, rn), rn);
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_parse(rec, rn, &h), CE_OK);
  cr_expect_str_eq(h.sni, "size.example");
  free(rec);
  b_free(b);
}

/* ---------------------------------------------------------------------- */
/* The resumable walk (ce_clienthello_resume).                              */

/* Fields that do not depend on the framing, as the fuzz target compares. */
static bool same_fields(const ce_clienthello_t *a, const ce_clienthello_t *b) {
  ce_clienthello_t x = *a, y = *b;
  x.record_bytes = y.record_bytes = 0;
  return memcmp(&x, &y, sizeof(x)) == 0;
}

/* Feeds rec[0..n) growing by `step` bytes per call; every call before the
 * last must ask for more. Returns the last result. */
static int resume_in_steps(const uint8_t *rec, size_t n, size_t step, ce_clienthello_t *h) {
  ce_clienthello_state_t st;
  ce_clienthello_init(&st);
  int rc = CE_EAGAIN;
  for (size_t len = 0; len <= n && rc == CE_EAGAIN; len = len == n ? n + 1 : (len + step < n ? len + step : n))
    rc = ce_clienthello_resume(&st, rec, len, h);
  return rc;
}

Test(clienthello, resume_max_size_in_one_byte_records_one_byte_per_call) {
  /* The worst case the state exists for: the largest hello that 1-byte
   * records can carry (6 bytes of buffer per message byte) arriving one
   * byte per read. Without the state every call re-walked every record
   * so far: about 64 Ki calls times 10 Ki records. */
  const size_t m = CE_CLIENTHELLO_MAX_BYTES / 6;
  builder_t *b = b_new();
  hello_of_size(b, m);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t rn = frame(b->b, b->n, 1, rec);
  cr_assert_leq(rn, CE_CLIENTHELLO_MAX_BYTES);
  ce_clienthello_state_t st;
  ce_clienthello_init(&st);
  ce_clienthello_t h, whole;
  size_t first_ok = 0;
  for (size_t len = 0; len <= rn; len++) {
    int rc = ce_clienthello_resume(&st, rec, len, &h);
    if (rc != CE_EAGAIN) {
      cr_assert_eq(rc, CE_OK, "at %zu bytes: %s", len, ce_err_name(rc));
      first_ok = len;
      break;
    }
  }
  cr_expect_eq(first_ok, rn);
  cr_assert_eq(ce_clienthello_parse(rec, rn, &whole), CE_OK);
  cr_expect_eq(h.record_bytes, rn);
  cr_expect(same_fields(&h, &whole));
  cr_expect_str_eq(h.sni, "size.example");
  /* A final answer is given again. */
  cr_expect_eq(ce_clienthello_resume(&st, rec, rn, &h), CE_OK);
  cr_expect_eq(h.record_bytes, rn);

  /* One message byte more does not fit in 1-byte records. */
  builder_t *big = b_new();
  hello_of_size(big, m + 1);
  rn = frame(big->b, big->n, 1, rec);
  cr_expect_eq(resume_in_steps(rec, rn, 1, &h), CE_ETOOBIG);
  free(rec);
  b_free(big);
  b_free(b);
}

Test(clienthello, resume_agrees_with_parse_on_real_hellos) {
  uint8_t *raw = xmalloc(FIXTURE_CAP);
  uint8_t *msg = xmalloc(FIXTURE_CAP);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  static const size_t records[] = {1, 2, 5, 100, RECORD_MAX};
  static const size_t steps[] = {1, 3, 7, 64, 4096};
  for (size_t f = 0; f < sizeof(fixtures) / sizeof(fixtures[0]); f++) {
    size_t n = load_fixture(fixtures[f].file, raw, FIXTURE_CAP);
    size_t m = unframe(raw, n, msg);
    for (size_t r = 0; r < sizeof(records) / sizeof(records[0]); r++) {
      size_t rn = frame(msg, m, records[r], rec);
      ce_clienthello_t want, got;
      cr_assert_eq(ce_clienthello_parse(rec, rn, &want), CE_OK);
      for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++) {
        int rc = resume_in_steps(rec, rn, steps[s], &got);
        cr_assert_eq(rc, CE_OK, "%s, records of %zu, steps of %zu: %s", fixtures[f].file,
                     records[r], steps[s], ce_err_name(rc));
        cr_assert(same_fields(&want, &got) && got.record_bytes == rn);
      }
    }
  }
  free(raw);
  free(msg);
  free(rec);
}

Test(clienthello, resume_reports_errors_where_parse_does) {
  /* Corrupt a byte of a record header, then of the handshake header, at
   * several places: the resumed walk must fail at the same prefix and with
   * the same code as a fresh parse of that prefix. */
  builder_t *b = b_new();
  std_hello(b, "err.example", h2_http11);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t rn = frame(b->b, b->n, 3, rec);
  static const size_t at[] = {0, 1, 2, 3, 5, 8, 13, 16, 40, 80};
  static const uint8_t with[] = {0x17, 0x04, 0x09, 0x40, 0x02, 0x00};
  for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
    for (size_t w = 0; w < sizeof(with) / sizeof(with[0]); w++) {
      uint8_t saved = rec[at[i]];
      rec[at[i]] = with[w];
      size_t fresh_at = first_non_eagain_prefix(rec, rn);
      ce_clienthello_t h;
      int fresh = fresh_at <= rn ? ce_clienthello_parse(rec, fresh_at, &h) : CE_EAGAIN;
      ce_clienthello_state_t st;
      ce_clienthello_init(&st);
      int rc = CE_EAGAIN;
      size_t len = 0;
      while (len <= rn && (rc = ce_clienthello_resume(&st, rec, len, &h)) == CE_EAGAIN)
        len++;
      cr_expect_eq(rc, fresh, "byte %zu = %#x: %s vs %s", at[i], with[w], ce_err_name(rc),
                   ce_err_name(fresh));
      if (rc != CE_EAGAIN) {
        cr_expect_eq(len, fresh_at, "byte %zu = %#x", at[i], with[w]);
        /* The verdict stays. */
        cr_expect_eq(ce_clienthello_resume(&st, rec, rn, &h), rc);
      }
      rec[at[i]] = saved;
    }
  }
  free(rec);
  b_free(b);
}

Test(clienthello, resume_refuses_a_shorter_buffer) {
  builder_t *b = b_new();
  std_hello(b, "short.example", NULL);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t rn = frame(b->b, b->n, 10, rec);
  ce_clienthello_state_t st;
  ce_clienthello_init(&st);
  ce_clienthello_t h;
  cr_expect_eq(ce_clienthello_resume(&st, rec, 40, &h), CE_EAGAIN);
  cr_expect_eq(ce_clienthello_resume(&st, rec, 10, &h), CE_EINVAL);
  cr_expect_eq(ce_clienthello_resume(&st, rec, rn, &h), CE_OK);
  free(rec);
  b_free(b);
}

Test(clienthello, parsing_allocates_nothing) {
  /* clienthello.h: "it never allocates". */
  builder_t *b = b_new();
  std_hello(b, "alloc.example", h2_http11);
  uint8_t *rec = xmalloc(FRAMED_CAP);
  size_t rn = frame(b->b, b->n, 2, rec);
  ce_clienthello_t h;
  ce_clienthello_state_t st;
  ce_clienthello_init(&st);
  ce_failalloc_arm_from(0);
  int rc1 = ce_clienthello_parse(rec, rn, &h);
  int rc2 = resume_in_steps(rec, rn, 1, &h);
  ce_failalloc_disarm();
  cr_expect_eq(rc1, CE_OK);
  cr_expect_eq(rc2, CE_OK);
  cr_expect_eq(ce_failalloc_count(), 0);
  free(rec);
  b_free(b);
}
