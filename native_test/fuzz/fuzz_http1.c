/*
 * libFuzzer target for c_src/http1: heads in both directions, bodies, and
 * the writer's round trip.
 *
 * The first input byte picks what the rest is fed to:
 *   0  a request head, then its body;
 *   1  a response head to GET, then its body;
 *   2  a response head to HEAD;
 *   3  a chunked body alone.
 * Invariants checked (any failure aborts, which libFuzzer reports):
 *   - head_len <= len, and every slice of a parsed head lies in the head;
 *   - every prefix shorter than head_len is CE_EAGAIN, and the head alone
 *     parses to the same result;
 *   - a body fed in one piece, one byte at a time, and in pieces of a
 *     fuzzed size gives the same payload, the same verdict and the same
 *     number of bytes used;
 *   - what the writer makes of a parsed head parses again, with the same
 *     method, target path, status and framing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "h2/headers.h"
#include "http1/parser.h"
#include "http1/writer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "fuzz_http1: %s:%d: %s\n", __FILE__, __LINE__, #cond);     \
      abort();                                                                   \
    }                                                                            \
  } while (0)

/* Prefixes checked exhaustively up to this head size, sampled beyond. */
#define EXHAUSTIVE_PREFIXES 512u

static void check_span(const char *p, size_t n, const char *buf, size_t head_len) {
  if (p == NULL) {
    CHECK(n == 0);
    return;
  }
  CHECK(p >= buf && p <= buf + head_len && n <= (size_t)(buf + head_len - p));
}

static void check_head(const ce_h1_head_t *h, const char *buf, size_t len) {
  CHECK(h->head_len > 0 && h->head_len <= len && h->head_len <= CE_H1_MAX_HEAD_BYTES);
  CHECK(h->field_count <= CE_H1_MAX_FIELDS);
  CHECK(h->version_minor == 0 || h->version_minor == 1);
  CHECK(h->framing >= CE_H1_BODY_NONE && h->framing <= CE_H1_BODY_CLOSE);
  if (h->framing == CE_H1_BODY_LENGTH)
    CHECK(h->content_length <= UINT64_C(0x7fffffffffffffff));
  check_span(h->method, h->method_len, buf, h->head_len);
  check_span(h->target, h->target_len, buf, h->head_len);
  check_span(h->host, h->host_len, buf, h->head_len);
  check_span(h->authority, h->authority_len, buf, h->head_len);
  check_span(h->path, h->path_len, buf, h->head_len);
  check_span(h->reason, h->reason_len, buf, h->head_len);
  for (size_t i = 0; i < h->field_count; i++) {
    check_span(h->fields[i].name, h->fields[i].name_len, buf, h->head_len);
    check_span(h->fields[i].value, h->fields[i].value_len, buf, h->head_len);
    CHECK(h->fields[i].name_len > 0);
  }
  if (h->is_response) {
    CHECK(h->status >= 100 && h->status <= 999);
  } else {
    CHECK(h->method_len > 0 && h->target_len > 0);
    CHECK(h->framing != CE_H1_BODY_CLOSE);
    if (h->version_minor == 1)
      CHECK(h->host != NULL);
  }
  if (h->upgrade_websocket)
    CHECK(h->upgrade);
}

static bool same_head(const ce_h1_head_t *a, const ce_h1_head_t *b) {
  if (a->field_count != b->field_count)
    return false;
  for (size_t i = 0; i < a->field_count; i++) {
    if (a->fields[i].name != b->fields[i].name || a->fields[i].value != b->fields[i].value ||
        a->fields[i].name_len != b->fields[i].name_len ||
        a->fields[i].value_len != b->fields[i].value_len)
      return false;
  }
  return a->head_len == b->head_len && a->framing == b->framing &&
         a->content_length == b->content_length && a->keep_alive == b->keep_alive &&
         a->upgrade == b->upgrade && a->upgrade_websocket == b->upgrade_websocket &&
         a->expect_continue == b->expect_continue && a->status == b->status &&
         a->method == b->method && a->target == b->target && a->host == b->host &&
         a->path == b->path && a->authority == b->authority && a->reason == b->reason &&
         a->target_form == b->target_form && a->version_minor == b->version_minor;
}

static int parse(int mode, const char *buf, size_t len, ce_h1_head_t *h) {
  const char *why = NULL;
  int rc;
  if (mode == 0)
    rc = ce_h1_parse_request(buf, len, h, &why);
  else
    rc = ce_h1_parse_response(buf, len, mode == 1 ? "GET" : "HEAD", mode == 1 ? 3 : 4, h,
                              &why);
  CHECK(rc == CE_OK || rc == CE_EAGAIN || rc == CE_EPARSE || rc == CE_ETOOBIG);
  if (rc == CE_EPARSE || rc == CE_ETOOBIG)
    CHECK(why != NULL && why[0] != '\0');
  return rc;
}

typedef struct {
  int rc;
  size_t used;
  char *payload;
  size_t payload_len;
  char *keep;              /* the kept trailers (CE_H1_MAX_TRAILER_BYTES) */
  size_t kept;
} body_result_t;

/* Decodes in[0..len) in pieces of step bytes; payload must hold len bytes. */
static void decode(body_result_t *r, ce_h1_framing_t framing, uint64_t cl, const char *in,
                   size_t len, size_t step) {
  ce_h1_body_t b;
  ce_h1_body_init(&b, framing, cl);
  ce_h1_body_keep_trailers(&b, r->keep);
  r->rc = 0;
  r->used = 0;
  r->payload_len = 0;
  size_t off = 0;
  do {
    size_t k = len - off < step ? len - off : step;
    size_t pos = 0;
    int rc;
    do {
      size_t consumed;
      const char *data;
      size_t dlen;
      const char *why = NULL;
      rc = ce_h1_body_next(&b, in + off + pos, k - pos, &consumed, &data, &dlen, &why);
      CHECK(consumed <= k - pos);
      if (rc < 0) {
        CHECK(rc == CE_EPARSE || rc == CE_ETOOBIG);
        CHECK(why != NULL && dlen == 0);
      } else {
        CHECK(rc == 0 || rc == 1);
        CHECK(dlen <= consumed);
        if (dlen > 0) {
          CHECK(data >= in + off + pos && data + dlen <= in + off + pos + consumed);
          CHECK(r->payload_len + dlen <= len);
          memcpy(r->payload + r->payload_len, data, dlen);
          r->payload_len += dlen;
        }
        if (rc == 0 && pos < k)
          CHECK(consumed > 0);
      }
      pos += consumed;
    } while (rc == 0 && pos < k);
    off += pos;
    if (rc != 0) {
      r->rc = rc;
      break;
    }
  } while (off < len);
  r->used = off;
  r->kept = b.kept;
  CHECK(r->kept <= CE_H1_MAX_TRAILER_BYTES);
}

static void check_body(ce_h1_framing_t framing, uint64_t cl, const char *in, size_t len,
                       size_t step) {
  body_result_t whole, bytes, pieces;
  char *bufs = malloc(3 * (len + 1));
  CHECK(bufs != NULL);
  whole.payload = bufs;
  bytes.payload = bufs + len + 1;
  pieces.payload = bufs + 2 * (len + 1);
  char *keeps = malloc(3 * CE_H1_MAX_TRAILER_BYTES);
  CHECK(keeps != NULL);
  whole.keep = keeps;
  bytes.keep = keeps + CE_H1_MAX_TRAILER_BYTES;
  pieces.keep = keeps + 2 * CE_H1_MAX_TRAILER_BYTES;
  decode(&whole, framing, cl, in, len, len > 0 ? len : 1);
  decode(&bytes, framing, cl, in, len, 1);
  decode(&pieces, framing, cl, in, len, step);
  const body_result_t *others[] = {&bytes, &pieces};
  for (size_t i = 0; i < 2; i++) {
    const body_result_t *o = others[i];
    CHECK(o->rc == whole.rc);
    CHECK(o->used == whole.used);
    CHECK(o->payload_len == whole.payload_len);
    CHECK(memcmp(o->payload, whole.payload, whole.payload_len) == 0);
    CHECK(o->kept == whole.kept && memcmp(o->keep, whole.keep, whole.kept) == 0);
  }
  if (whole.rc == 1 && whole.kept > 0) {
    /* Kept trailers become h2 fields within their bytes (h2/headers.h). */
    static ce_h2h_field_t f[CE_H1_MAX_FIELDS];
    static char names[CE_H1_MAX_TRAILER_BYTES];
    long n = ce_h2h_trailer_fields(whole.keep, whole.kept, f, CE_H1_MAX_FIELDS, names, sizeof(names));
    CHECK(n >= -1);
    for (long i = 0; i < n; i++) {
      CHECK(f[i].name_len > 0 && f[i].name >= names && f[i].name + f[i].name_len <= names + sizeof(names));
      CHECK(f[i].value >= whole.keep && f[i].value + f[i].value_len <= whole.keep + whole.kept);
    }
    /* ... and the end of a chunked body for the next hop: within
     * CE_H1_TRAILER_OUT_MAX, decoding again to a last chunk whose kept
     * trailers are all allowed (checked as far as they were kept). */
    static char out[CE_H1_TRAILER_OUT_MAX];
    static char again[CE_H1_MAX_TRAILER_BYTES];
    ce_h1_writer_t w;
    ce_h1_writer_init(&w, out, sizeof(out));
    CHECK(ce_h1_write_last_chunk_trailers(&w, whole.keep, whole.kept) == CE_OK);
    ce_h1_body_t b;
    ce_h1_body_init(&b, CE_H1_BODY_CHUNKED, 0);
    ce_h1_body_keep_trailers(&b, again);
    size_t used = 0, dl = 0;
    const char *data = NULL, *why = NULL;
    int rc = ce_h1_body_next(&b, out, w.len, &used, &data, &dl, &why);
    /* Like a head, the written section may outgrow the limit (": " for
     * ":" on every line). */
    CHECK((rc == 1 && used == w.len) || (rc == CE_ETOOBIG && w.len - 3 > CE_H1_MAX_TRAILER_BYTES));
    size_t pos = 0;
    ce_h1_field_t x;
    while (ce_h1_trailer_next(again, b.kept, &pos, &x))
      CHECK(ce_h1_trailer_allowed(x.name, x.name_len));
  }
  free(keeps);
  if (whole.rc == 1 && framing == CE_H1_BODY_LENGTH)
    CHECK(whole.payload_len == cl && whole.used == cl);
  if (framing == CE_H1_BODY_CLOSE)
    CHECK(whole.rc == 0 && whole.payload_len == len);
  free(bufs);
}

/* The writer's output for a parsed head must parse again to the same
 * message (its own version, hop-by-hop fields gone). */
static void check_writer(int mode, const ce_h1_head_t *h) {
  if (!h->is_response && h->target_form == CE_H1_TARGET_AUTHORITY)
    return;
  size_t cap = CE_H1_MAX_HEAD_BYTES + 1024;
  char *out = malloc(cap);
  CHECK(out != NULL);
  unsigned flags = 0;
  if (h->framing == CE_H1_BODY_CHUNKED)
    flags |= CE_H1_W_CHUNKED;
  if (h->upgrade)
    flags |= CE_H1_W_UPGRADE;
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, out, cap);
  int rc = h->is_response ? ce_h1_write_response_head(&w, h, flags)
                          : ce_h1_write_request_head(&w, h, NULL, 0, flags);
  if (!h->is_response && h->host == NULL && h->authority == NULL) {
    CHECK(rc == CE_EINVAL); /* HTTP/1.0, origin-form, no Host */
    free(out);
    return;
  }
  CHECK(rc == 0);
  ce_h1_head_t again;
  rc = parse(mode, out, w.len, &again);
  /* The written head may outgrow the limits: "Name:value" becomes
   * "Name: value", a Host line may be added, and so may the proxy's own
   * Transfer-Encoding and Connection. */
  if (rc == CE_ETOOBIG) {
    CHECK(w.len > CE_H1_MAX_HEAD_BYTES || h->field_count + 3 > CE_H1_MAX_FIELDS);
    free(out);
    return;
  }
  CHECK(rc == CE_OK);
  CHECK(again.head_len == w.len);
  CHECK(again.framing == h->framing);
  CHECK(again.content_length == h->content_length);
  CHECK(again.upgrade == h->upgrade);
  if (h->is_response) {
    CHECK(again.status == h->status);
  } else {
    CHECK(again.method_len == h->method_len &&
          memcmp(again.method, h->method, h->method_len) == 0);
    CHECK(again.target_form == (h->target_form == CE_H1_TARGET_ASTERISK
                                    ? CE_H1_TARGET_ASTERISK
                                    : CE_H1_TARGET_ORIGIN));
    if (h->path_len > 0 && h->path[0] == '/')
      CHECK(again.path_len == h->path_len && memcmp(again.path, h->path, h->path_len) == 0);
  }
  free(out);
}

static void fuzz_head(int mode, const char *buf, size_t len, size_t step) {
  ce_h1_head_t h;
  int rc = parse(mode, buf, len, &h);
  if (rc != CE_OK)
    return;
  check_head(&h, buf, len);

  /* The head alone gives the same result, and every shorter prefix asks
   * for more. */
  ce_h1_head_t alone;
  CHECK(parse(mode, buf, h.head_len, &alone) == CE_OK);
  CHECK(same_head(&h, &alone));
  size_t stride = h.head_len <= EXHAUSTIVE_PREFIXES ? 1 : h.head_len / 64;
  for (size_t k = 0; k < h.head_len; k += stride) {
    ce_h1_head_t part;
    CHECK(parse(mode, buf, k, &part) == CE_EAGAIN);
  }
  ce_h1_head_t part;
  CHECK(parse(mode, buf, h.head_len - 1, &part) == CE_EAGAIN);

  check_body(h.framing, h.content_length, buf + h.head_len, len - h.head_len, step);
  check_writer(mode, &h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  int mode = data[0] & 3;
  size_t step = (size_t)(data[1] % 16) + 1;
  size_t len = size - 2;
  /* An exact-size copy, so ASan sees any read past the end. */
  char *buf = malloc(len > 0 ? len : 1);
  if (buf == NULL)
    return 0;
  memcpy(buf, data + 2, len);
  if (mode == 3)
    check_body(CE_H1_BODY_CHUNKED, 0, buf, len, step);
  else
    fuzz_head(mode, buf, len, step);
  free(buf);
  return 0;
}
