/*
 * libFuzzer target for c_src/proxy/clienthello.c (docs/clienthello.md).
 *
 * The input is what a client might send first on port 443. Beyond "no
 * crash, no sanitizer report", the target checks the properties the proxy
 * relies on when it calls the parser again after every read:
 *
 * - the result is one of the codes the header lists;
 * - on CE_OK the output is well-formed (NUL-terminated, lengths within
 *   their arrays), record_bytes <= len, and parsing just the first
 *   record_bytes gives the same answer (bytes after the hello are not
 *   looked at);
 * - on CE_OK every shorter prefix is CE_EAGAIN: the proxy never acts on
 *   half a hello;
 * - on any other code, prefixes are CE_EAGAIN or that same code: an
 *   early verdict never contradicts the final one;
 * - on CE_OK, the same handshake message framed in other record sizes
 *   parses to the same fields (RFC 8446 §5.1 lets a client fragment it
 *   any way), or is CE_ETOOBIG when the framing itself exceeds the limit;
 * - ce_clienthello_resume() fed the input in growing steps (sizes taken
 *   from the input) asks for more until its last call, which gives what a
 *   fresh parse of the whole input gives, at the same length.
 *
 * Any violation aborts, which libFuzzer reports as a crash with the input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "proxy/clienthello.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* How many prefixes of a failing input are sampled: checking them all
 * would be quadratic in the input for every input, slowing the search. */
#define ERROR_PREFIX_SAMPLES 64u
/* The record sizes a successful input is re-framed in. */
static const size_t reframe_sizes[] = {1, 2, 3, 5, 64, 16384};

#define CHECK(cond)                                                           \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "fuzz_clienthello: %s:%d: %s\n", __FILE__, __LINE__,  \
              #cond);                                                         \
      abort();                                                                \
    }                                                                         \
  } while (0)

static int known_code(int rc) {
  return rc == CE_OK || rc == CE_EAGAIN || rc == CE_ENOTSUP || rc == CE_EPARSE ||
         rc == CE_ETOOBIG;
}

static void check_output(const ce_clienthello_t *h, size_t size) {
  CHECK(h->record_bytes > 0 && h->record_bytes <= size);
  CHECK(h->record_bytes <= CE_CLIENTHELLO_MAX_BYTES);
  CHECK(h->sni_len <= CE_CLIENTHELLO_MAX_SNI);
  CHECK(h->sni[h->sni_len] == '\0' && strlen(h->sni) == h->sni_len);
  CHECK(h->has_sni == (h->sni_len > 0));
  CHECK(h->alpn_count <= CE_CLIENTHELLO_MAX_ALPN);
  CHECK(h->has_alpn || (h->alpn_count == 0 && !h->offers_h2 && !h->offers_http11));
  CHECK(!h->has_alpn || h->alpn_count > 0);
  for (size_t i = 0; i < h->alpn_count; i++)
    CHECK(h->alpn[i].len > 0 && h->alpn[i].name[h->alpn[i].len] == '\0');
}

/* The fields that do not depend on how the message was framed. */
static int same_hello(const ce_clienthello_t *a, const ce_clienthello_t *b) {
  ce_clienthello_t x = *a, y = *b;
  x.record_bytes = 0;
  y.record_bytes = 0;
  /* Both were zeroed before being filled, so padding and unused entries
   * compare equal too. */
  return memcmp(&x, &y, sizeof(x)) == 0;
}

/* Re-frames the handshake message carried by data[0..record_bytes) in
 * records of k bytes and checks the parser agrees with itself. */
static void check_reframed(const uint8_t *data, const ce_clienthello_t *h, size_t k,
                           uint8_t *msg, uint8_t *framed) {
  size_t m = 0;
  for (size_t pos = 0; pos < h->record_bytes;) {
    size_t len = (size_t)data[pos + 3] << 8 | data[pos + 4];
    memcpy(msg + m, data + pos + 5, len);
    m += len;
    pos += 5 + len;
  }
  size_t n = 0;
  for (size_t done = 0; done < m;) {
    size_t chunk = m - done < k ? m - done : k;
    framed[n++] = 22;
    framed[n++] = 3;
    framed[n++] = 3;
    framed[n++] = (uint8_t)(chunk >> 8);
    framed[n++] = (uint8_t)chunk;
    memcpy(framed + n, msg + done, chunk);
    n += chunk;
    done += chunk;
  }
  ce_clienthello_t again;
  int rc = ce_clienthello_parse(framed, n, &again);
  if (n > CE_CLIENTHELLO_MAX_BYTES) {
    CHECK(rc == CE_ETOOBIG);
    return;
  }
  CHECK(rc == CE_OK);
  CHECK(again.record_bytes == n);
  CHECK(same_hello(h, &again));
}

/* Feeds data[0..size) to ce_clienthello_resume() in steps of 1 to 8
 * bytes (chosen by the data itself, so the fuzzer explores splits) and
 * checks the resumed walk agrees with the fresh parse's answer rc. */
static void check_resumed(const uint8_t *data, size_t size, int rc, const ce_clienthello_t *h) {
  ce_clienthello_state_t st;
  ce_clienthello_init(&st);
  ce_clienthello_t r;
  int rrc = CE_EAGAIN;
  size_t len = 0;
  for (;;) {
    rrc = ce_clienthello_resume(&st, data, len, &r);
    if (rrc != CE_EAGAIN || len == size)
      break;
    size_t step = 1 + (len < size ? data[len] % 8 : 0);
    len = size - len < step ? size : len + step;
  }
  if (rrc != CE_EAGAIN) {
    /* An answer before the end is the answer for the whole input: a fresh
     * parse of this prefix must say the same. */
    ce_clienthello_t p;
    CHECK(ce_clienthello_parse(data, len, &p) == rrc);
  }
  CHECK(rrc == rc);
  if (rc == CE_OK)
    CHECK(r.record_bytes == h->record_bytes && same_hello(h, &r));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ce_clienthello_t h;
  int rc = ce_clienthello_parse(data, size, &h);
  CHECK(known_code(rc));
  check_resumed(data, size, rc, &h);

  if (rc == CE_OK) {
    check_output(&h, size);
    ce_clienthello_t exact;
    CHECK(ce_clienthello_parse(data, h.record_bytes, &exact) == CE_OK);
    CHECK(exact.record_bytes == h.record_bytes && same_hello(&h, &exact));
    for (size_t p = 0; p < h.record_bytes; p++)
      CHECK(ce_clienthello_parse(data, p, &exact) == CE_EAGAIN);

    /* A message of m bytes framed in 1-byte records takes 6m bytes. */
    uint8_t *msg = malloc(h.record_bytes);
    uint8_t *framed = malloc(6 * h.record_bytes);
    CHECK(msg != NULL && framed != NULL);
    for (size_t i = 0; i < sizeof(reframe_sizes) / sizeof(reframe_sizes[0]); i++)
      check_reframed(data, &h, reframe_sizes[i], msg, framed);
    free(msg);
    free(framed);
    return 0;
  }

  /* Sampled prefixes, always including the longest one. */
  size_t step = size / ERROR_PREFIX_SAMPLES + 1;
  for (size_t p = size; p-- > 0;) {
    if (p != size - 1 && p % step != 0)
      continue;
    ce_clienthello_t part;
    int prc = ce_clienthello_parse(data, p, &part);
    CHECK(prc == CE_EAGAIN || (rc != CE_EAGAIN && prc == rc));
  }
  return 0;
}
