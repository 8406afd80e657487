/* Tests for c_src/tls/tlsconn.c: a client and a server tlsconn talking
 * entirely in memory (take_out -> feed), with the session CA, a leaf from
 * the cache, and the two contexts of context.c. */
#include <criterion/criterion.h>
#include <openssl/buffer.h>
#include <openssl/err.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tls/ca.h"
#include "tls/context.h"
#include "tls/fixtures.h"
#include "tls/tlsconn.h"
#include "support/failalloc.h"

#define MOZILLA_PEM CE_SOURCE_ROOT "/priv/ca-certificates/mozilla.pem"

static const unsigned char H11[] = "\x08http/1.1";
static const unsigned char H2[] = "\x02h2";
static const unsigned char H2_H11[] = "\x02h2\x08http/1.1";
static const unsigned char H11_H2[] = "\x08http/1.1\x02h2";
#define WIRE(x) x, sizeof(x) - 1

static struct {
  ce_ca_t *ca;
  ce_leaf_cache_t *cache;
  SSL_CTX *server_ctx;
  SSL_CTX *trusting;   /* Mozilla roots + the session CA */
  SSL_CTX *mozilla;    /* Mozilla roots only: does not trust the session CA */
} env;

static void setup(void) {
  fx_setup();
  fx_generate_ca(7);
  char cert[FX_PATH_MAX], key[FX_PATH_MAX], err[512];
  cr_assert_eq(ce_ca_load(fx_path(cert, "ca.pem"), fx_path(key, "ca.key"), &env.ca,
                          err, sizeof(err)),
               CE_OK, "%s", err);
  cr_assert_eq(ce_leaf_cache_new(env.ca, 0, &env.cache), CE_OK);
  cr_assert_eq(ce_tls_server_ctx_new(&env.server_ctx, err, sizeof(err)), CE_OK);
  cr_assert_eq(ce_tls_client_ctx_new(MOZILLA_PEM, cert, &env.trusting, err,
                                     sizeof(err)),
               CE_OK, "%s", err);
  cr_assert_eq(ce_tls_client_ctx_new(MOZILLA_PEM, NULL, &env.mozilla, err,
                                     sizeof(err)),
               CE_OK, "%s", err);
}

static void teardown(void) {
  SSL_CTX_free(env.mozilla);
  SSL_CTX_free(env.trusting);
  SSL_CTX_free(env.server_ctx);
  ce_leaf_cache_free(env.cache);
  ce_ca_free(env.ca);
  fx_teardown();
}

TestSuite(tlsconn, .init = setup, .fini = teardown);

static ce_tlsconn_t *server_for(const char *leaf_host, const unsigned char *alpn,
                                size_t alpn_len) {
  X509 *cert = NULL;
  EVP_PKEY *key = NULL;
  cr_assert_eq(ce_leaf_get(env.cache, leaf_host, &cert, &key), CE_OK);
  SSL *ssl = NULL;
  cr_assert_eq(ce_tls_server_ssl_new(env.server_ctx, cert, key, alpn, alpn_len, &ssl),
               CE_OK);
  X509_free(cert);
  EVP_PKEY_free(key);
  ce_tlsconn_t *t = NULL;
  cr_assert_eq(ce_tlsconn_new(ssl, true, &t), CE_OK);
  return t;
}

static ce_tlsconn_t *client_for(SSL_CTX *ctx, const char *host,
                                const unsigned char *alpn, size_t alpn_len) {
  SSL *ssl = NULL;
  cr_assert_eq(ce_tls_client_ssl_new(ctx, host, alpn, alpn_len, &ssl), CE_OK);
  ce_tlsconn_t *t = NULL;
  cr_assert_eq(ce_tlsconn_new(ssl, false, &t), CE_OK);
  return t;
}

static void limit_to_tls12(ce_tlsconn_t *t) {
  cr_assert_eq(SSL_set_max_proto_version(ce_tlsconn_ssl(t), TLS1_2_VERSION), 1);
}

typedef struct {
  int client, server;
} hs_t;

/* Drives both handshakes until neither can progress. */
static hs_t handshake(ce_tlsconn_t *c, ce_tlsconn_t *s) {
  hs_t r = {CE_EAGAIN, CE_EAGAIN};
  for (int round = 0; round < 20; round++) {
    if (r.client == CE_EAGAIN)
      r.client = ce_tlsconn_handshake(c);
    size_t moved = fx_shuttle(c, s);
    if (r.server == CE_EAGAIN)
      r.server = ce_tlsconn_handshake(s);
    moved += fx_shuttle(s, c);
    if ((r.client != CE_EAGAIN && r.server != CE_EAGAIN) || moved == 0)
      break;
  }
  cr_assert_eq(ERR_peek_error(), 0ul, "the error queue is not empty");
  return r;
}

static void connected(ce_tlsconn_t *c, ce_tlsconn_t *s) {
  hs_t r = handshake(c, s);
  cr_assert_eq(r.client, CE_OK, "client: %s (%s)", ce_err_name(r.client),
               ce_tlsconn_error(c));
  cr_assert_eq(r.server, CE_OK, "server: %s (%s)", ce_err_name(r.server),
               ce_tlsconn_error(s));
}

/* Sends len bytes from one side and reads them all on the other. */
static void transfer(ce_tlsconn_t *from, ce_tlsconn_t *to, size_t len) {
  uint8_t *data = malloc(len), *got = malloc(len);
  cr_assert(data != NULL && got != NULL);
  for (size_t i = 0; i < len; i++)
    data[i] = (uint8_t)(i * 31 + 7);
  cr_assert_eq(ce_tlsconn_write(from, data, len), CE_OK);
  fx_shuttle(from, to);
  size_t have = 0;
  while (have < len) {
    size_t n = 0;
    size_t cap = len - have < 5000 ? len - have : 5000;
    int rc = ce_tlsconn_read(to, got + have, cap, &n);
    cr_assert_eq(rc, CE_OK, "read after %zu of %zu: %s", have, len, ce_err_name(rc));
    have += n;
  }
  cr_assert_eq(memcmp(data, got, len), 0);
  size_t n = 0;
  uint8_t one;
  cr_assert_eq(ce_tlsconn_read(to, &one, 1, &n), CE_EAGAIN);
  /* A read can produce output (TLS 1.3 tickets are off, but a KeyUpdate
   * would); the peer gets it. */
  fx_shuttle(to, from);
  free(data);
  free(got);
}

static void expect_alpn(ce_tlsconn_t *t, const char *want) {
  size_t len = 99;
  const char *p = ce_tlsconn_alpn(t, &len);
  if (want == NULL) {
    cr_assert_null(p);
    cr_assert_eq(len, 0u);
  } else {
    cr_assert_not_null(p, "no ALPN, wanted %s", want);
    cr_assert_eq(len, strlen(want));
    cr_assert_eq(memcmp(p, want, len), 0, "got %.*s", (int)len, p);
  }
}

/* ---- success ---------------------------------------------------------------- */

Test(tlsconn, handshake_and_data_both_ways) {
  ce_tlsconn_t *s = server_for("example.com", WIRE(H11));
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", WIRE(H2_H11));
  connected(c, s);
  cr_assert_eq(SSL_version(ce_tlsconn_ssl(c)), TLS1_3_VERSION);
  cr_assert_eq(ce_tlsconn_handshake(c), CE_OK, "done stays done");
  cr_assert_str_empty(ce_tlsconn_error(c));
  cr_assert_not(ce_tlsconn_peer_rejected_cert(s));
  transfer(c, s, 5);
  transfer(s, c, 100 * 1024);
  transfer(c, s, 256 * 1024 + 3);
  /* No session tickets from the server. */
  cr_assert_eq(ce_tlsconn_pending_out(s), 0u);
  cr_assert_eq(ERR_peek_error(), 0ul);
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

static size_t bio_room(BIO *b) {
  BUF_MEM *bm = NULL;
  BIO_get_mem_ptr(b, &bm);
  return bm != NULL ? bm->max : 0;
}

/* ce_tlsconn_trim: the room of a large transfer is given back, bytes still
 * queued stay, and the connection goes on both ways. */
Test(tlsconn, trim_gives_back_bio_room_and_keeps_queued_bytes) {
  ce_tlsconn_t *s = server_for("example.com", WIRE(H11));
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", WIRE(H11));
  connected(c, s);
  transfer(s, c, 200 * 1024);
  cr_assert_gt(bio_room(SSL_get_wbio(ce_tlsconn_ssl(s))), CE_TLSCONN_BIO_KEEP);
  cr_assert_gt(bio_room(SSL_get_rbio(ce_tlsconn_ssl(c))), CE_TLSCONN_BIO_KEEP);
  ce_tlsconn_trim(s);
  ce_tlsconn_trim(c);
  ce_tlsconn_trim(NULL);
  cr_expect_leq(bio_room(SSL_get_wbio(ce_tlsconn_ssl(s))), CE_TLSCONN_BIO_KEEP);
  cr_expect_leq(bio_room(SSL_get_rbio(ce_tlsconn_ssl(c))), CE_TLSCONN_BIO_KEEP);
  transfer(c, s, 5);
  transfer(s, c, 70 * 1024);

  /* Queued ciphertext (a write not yet taken) is not dropped by a trim. */
  static const uint8_t msg[] = "still here";
  cr_assert_eq(ce_tlsconn_write(s, msg, sizeof(msg)), CE_OK);
  size_t queued = ce_tlsconn_pending_out(s);
  cr_assert_gt(queued, 0u);
  ce_tlsconn_trim(s);
  cr_expect_eq(ce_tlsconn_pending_out(s), queued);
  fx_shuttle(s, c);
  /* ... nor fed ciphertext the client has not read yet. */
  ce_tlsconn_trim(c);
  uint8_t got[sizeof(msg)];
  size_t n = 0;
  cr_assert_eq(ce_tlsconn_read(c, got, sizeof(got), &n), CE_OK);
  cr_expect_eq(n, sizeof(msg));
  cr_expect_eq(memcmp(got, msg, sizeof(msg)), 0);
  cr_assert_eq(ERR_peek_error(), 0ul);
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

/* ce_tlsconn_held: the room of both BIOs, filled or not; what a trim gives
 * back shows in it. */
Test(tlsconn, held_counts_the_room_of_both_bios) {
  cr_expect_eq(ce_tlsconn_held(NULL), 0u);
  ce_tlsconn_t *s = server_for("example.com", WIRE(H11));
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", WIRE(H11));
  connected(c, s);
  transfer(s, c, 200 * 1024);
  SSL *ss = ce_tlsconn_ssl(s);
  size_t room = bio_room(SSL_get_rbio(ss)) + bio_room(SSL_get_wbio(ss));
  cr_expect_eq(ce_tlsconn_held(s), room);
  cr_expect_gt(ce_tlsconn_held(s), CE_TLSCONN_BIO_KEEP);
  cr_expect_gt(ce_tlsconn_held(c), CE_TLSCONN_BIO_KEEP);
  ce_tlsconn_trim(s);
  ce_tlsconn_trim(c);
  cr_expect_leq(ce_tlsconn_held(s), 2 * CE_TLSCONN_BIO_KEEP);
  cr_expect_leq(ce_tlsconn_held(c), 2 * CE_TLSCONN_BIO_KEEP);
  /* Queued bytes are counted too: the room holds them. */
  static const uint8_t msg[] = "queued";
  cr_assert_eq(ce_tlsconn_write(s, msg, sizeof(msg)), CE_OK);
  cr_expect_geq(ce_tlsconn_held(s), ce_tlsconn_pending_out(s));
  cr_assert_eq(ERR_peek_error(), 0ul);
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

/* ce_tlsconn_release: an idle connection keeps no BIO room at all after a
 * small exchange (a trim keeps what is under the bound), queued bytes stay,
 * and the connection goes on. */
Test(tlsconn, release_gives_back_all_room_of_empty_bios) {
  ce_tlsconn_release(NULL);
  ce_tlsconn_t *s = server_for("example.com", WIRE(H11));
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", WIRE(H11));
  connected(c, s);
  transfer(c, s, 300);
  transfer(s, c, 1100);
  size_t before = ce_tlsconn_held(s);
  cr_assert_gt(before, 0u);
  ce_tlsconn_trim(s);
  cr_expect_eq(ce_tlsconn_held(s), before, "a trim keeps room under the bound");
  cr_expect_eq(ce_tlsconn_releasable(s), before, "both BIOs are empty: all of their room can go");
  cr_expect_eq(ce_tlsconn_releasable(NULL), 0u);
  ce_tlsconn_release(s);
  ce_tlsconn_release(c);
  cr_expect_eq(ce_tlsconn_held(s), 0u);
  cr_expect_eq(ce_tlsconn_held(c), 0u);
  transfer(c, s, 300);
  transfer(s, c, 1100);

  static const uint8_t msg[] = "queued";
  cr_assert_eq(ce_tlsconn_write(s, msg, sizeof(msg)), CE_OK);
  size_t queued = ce_tlsconn_pending_out(s);
  cr_expect_lt(ce_tlsconn_releasable(s), ce_tlsconn_held(s), "the BIO holding bytes keeps its room");
  ce_tlsconn_release(s);
  cr_expect_eq(ce_tlsconn_pending_out(s), queued);
  cr_expect_gt(ce_tlsconn_held(s), 0u);
  cr_expect_eq(ce_tlsconn_releasable(s), 0u, "nothing more to give back while the bytes wait");
  fx_shuttle(s, c);
  uint8_t got[sizeof(msg)];
  size_t n = 0;
  cr_assert_eq(ce_tlsconn_read(c, got, sizeof(got), &n), CE_OK);
  cr_expect_eq(n, sizeof(msg));
  cr_assert_eq(ERR_peek_error(), 0ul);
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

/* A trim whose fresh BIO cannot be allocated keeps the old one. */
Test(tlsconn, trim_without_memory_keeps_the_old_bio) {
  cr_assert(ce_failalloc_openssl_hooked(), "OpenSSL's allocator is not routed through the counter");
  ce_tlsconn_t *s = server_for("example.com", WIRE(H11));
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", WIRE(H11));
  connected(c, s);
  transfer(s, c, 100 * 1024);
  size_t before = bio_room(SSL_get_wbio(ce_tlsconn_ssl(s)));
  cr_assert_gt(before, CE_TLSCONN_BIO_KEEP);
  ce_failalloc_arm_from(0);
  ce_tlsconn_trim(s);
  ce_failalloc_disarm();
  cr_expect_gt(ce_failalloc_failures(), 0u);
  cr_expect_eq(bio_room(SSL_get_wbio(ce_tlsconn_ssl(s))), before);
  cr_expect_eq(ERR_peek_error(), 0ul);
  transfer(s, c, 1000);
  transfer(c, s, 1000);
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

Test(tlsconn, tls12_handshake) {
  ce_tlsconn_t *s = server_for("example.com", WIRE(H11));
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", WIRE(H11));
  limit_to_tls12(c);
  connected(c, s);
  cr_assert_eq(SSL_version(ce_tlsconn_ssl(s)), TLS1_2_VERSION);
  expect_alpn(s, "http/1.1");
  transfer(c, s, 1000);
  transfer(s, c, 1000);
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

Test(tlsconn, ip_literals) {
  static const char *ips[] = {"10.0.0.1", "2001:db8::1"};
  for (size_t i = 0; i < 2; i++) {
    ce_tlsconn_t *s = server_for(ips[i], NULL, 0);
    ce_tlsconn_t *c = client_for(env.trusting, ips[i], NULL, 0);
    connected(c, s);
    /* No SNI reached the server. */
    cr_assert_null(SSL_get_servername(ce_tlsconn_ssl(s), TLSEXT_NAMETYPE_host_name));
    transfer(c, s, 10);
    ce_tlsconn_free(c);
    ce_tlsconn_free(s);
  }
}

Test(tlsconn, sni_reaches_the_server) {
  ce_tlsconn_t *s = server_for("api.example.com", NULL, 0);
  ce_tlsconn_t *c = client_for(env.trusting, "api.example.com", NULL, 0);
  connected(c, s);
  cr_assert_str_eq(SSL_get_servername(ce_tlsconn_ssl(s), TLSEXT_NAMETYPE_host_name),
                   "api.example.com");
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

/* ---- ALPN ----------------------------------------------------------------------- */

static void alpn_case(const unsigned char *server, size_t server_len,
                      const unsigned char *client, size_t client_len,
                      const char *want) {
  ce_tlsconn_t *s = server_for("example.com", server, server_len);
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", client, client_len);
  connected(c, s);
  expect_alpn(s, want);
  expect_alpn(c, want);
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

Test(tlsconn, alpn_server_list_decides) {
  alpn_case(WIRE(H11), WIRE(H2_H11), "http/1.1");
  /* The server's order wins over the client's. */
  alpn_case(WIRE(H2_H11), WIRE(H11_H2), "h2");
  alpn_case(WIRE(H11_H2), WIRE(H2_H11), "http/1.1");
  alpn_case(WIRE(H2), WIRE(H2_H11), "h2");
}

Test(tlsconn, alpn_without_overlap_is_no_alpn) {
  alpn_case(WIRE(H11), WIRE(H2), NULL);
  alpn_case(NULL, 0, WIRE(H2_H11), NULL);
  alpn_case(WIRE(H2_H11), NULL, 0, NULL);
}

Test(tlsconn, alpn_survives_ssl_dup) {
  X509 *cert = NULL;
  EVP_PKEY *key = NULL;
  cr_assert_eq(ce_leaf_get(env.cache, "example.com", &cert, &key), CE_OK);
  SSL *ssl = NULL;
  cr_assert_eq(ce_tls_server_ssl_new(env.server_ctx, cert, key, WIRE(H11), &ssl), CE_OK);
  SSL *copy = SSL_dup(ssl);
  cr_assert_not_null(copy);
  SSL_free(ssl);
  X509_free(cert);
  EVP_PKEY_free(key);
  ce_tlsconn_t *s = NULL;
  cr_assert_eq(ce_tlsconn_new(copy, true, &s), CE_OK);
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", WIRE(H2_H11));
  connected(c, s);
  expect_alpn(s, "http/1.1");
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

/* ---- verification failures ------------------------------------------------------------ */

static void expect_error(ce_tlsconn_t *t, const char *part) {
  cr_assert_not_null(strstr(ce_tlsconn_error(t), part), "expected \"%s\" in \"%s\"",
                     part, ce_tlsconn_error(t));
}

Test(tlsconn, hostname_mismatch) {
  ce_tlsconn_t *s = server_for("example.com", NULL, 0);
  ce_tlsconn_t *c = client_for(env.trusting, "other.example", NULL, 0);
  hs_t r = handshake(c, s);
  cr_assert_eq(r.client, CE_ETLS);
  expect_error(c, "certificate verify failed: hostname mismatch");
  cr_assert_not(ce_tlsconn_peer_rejected_cert(c));
  /* The client told the server why: the server sees a rejection. */
  cr_assert_eq(r.server, CE_ETLS);
  cr_assert(ce_tlsconn_peer_rejected_cert(s), "server: %s", ce_tlsconn_error(s));
  expect_error(s, "the peer sent fatal alert bad_certificate (42)");
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

Test(tlsconn, ip_mismatch) {
  ce_tlsconn_t *s = server_for("10.0.0.1", NULL, 0);
  ce_tlsconn_t *c = client_for(env.trusting, "10.0.0.2", NULL, 0);
  hs_t r = handshake(c, s);
  cr_assert_eq(r.client, CE_ETLS);
  expect_error(c, "certificate verify failed: IP address mismatch");
  cr_assert_eq(r.server, CE_ETLS);
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

static void untrusted_case(bool tls12, bool keep_info_callback) {
  ce_tlsconn_t *s = server_for("example.com", NULL, 0);
  ce_tlsconn_t *c = client_for(env.mozilla, "example.com", NULL, 0);
  if (tls12)
    limit_to_tls12(c);
  if (!keep_info_callback)
    SSL_set_info_callback(ce_tlsconn_ssl(s), NULL);
  hs_t r = handshake(c, s);
  cr_assert_eq(r.client, CE_ETLS);
  expect_error(c, "certificate verify failed: unable to get local issuer certificate");
  cr_assert_not(ce_tlsconn_peer_rejected_cert(c));
  cr_assert_eq(r.server, CE_ETLS);
  cr_assert(ce_tlsconn_peer_rejected_cert(s), "server: %s", ce_tlsconn_error(s));
  cr_assert_str_eq(ce_tlsconn_error(s), "the peer sent fatal alert unknown_ca (48)");
  /* Failures are final, and keep their first reason. */
  cr_assert_eq(ce_tlsconn_handshake(s), CE_ETLS);
  uint8_t buf[16];
  size_t n = 0;
  cr_assert_eq(ce_tlsconn_read(s, buf, sizeof(buf), &n), CE_ETLS);
  cr_assert_eq(ce_tlsconn_write(s, buf, sizeof(buf)), CE_ETLS);
  cr_assert_str_eq(ce_tlsconn_error(s), "the peer sent fatal alert unknown_ca (48)");
  ce_tlsconn_shutdown(s);
  cr_assert_eq(ce_tlsconn_pending_out(s), 0u);
  cr_assert_eq(ERR_peek_error(), 0ul);
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

Test(tlsconn, untrusted_ca_is_seen_by_the_server) { untrusted_case(false, true); }

Test(tlsconn, untrusted_ca_is_seen_by_the_server_tls12) { untrusted_case(true, true); }

/* Without the info callback the error queue's SSL_R_TLSV1_ALERT_UNKNOWN_CA
 * still says it. */
Test(tlsconn, untrusted_ca_without_the_info_callback) { untrusted_case(false, false); }

Test(tlsconn, errors_do_not_leak_into_the_next_connection) {
  untrusted_case(false, true);
  ce_tlsconn_t *s = server_for("example.com", NULL, 0);
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", NULL, 0);
  connected(c, s);
  cr_assert_str_empty(ce_tlsconn_error(s));
  cr_assert_not(ce_tlsconn_peer_rejected_cert(s));
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

Test(tlsconn, upstream_wanting_a_client_certificate) {
  ce_tlsconn_t *s = server_for("example.com", NULL, 0);
  SSL_set_verify(ce_tlsconn_ssl(s), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                 NULL);
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", NULL, 0);
  hs_t r = handshake(c, s);
  /* TLS 1.3: the client finished before the server judged its (missing)
   * certificate; the alert arrives on the client's first read. */
  cr_assert_eq(r.client, CE_OK);
  cr_assert_eq(r.server, CE_ETLS);
  cr_assert_not(ce_tlsconn_peer_rejected_cert(s));
  uint8_t buf[16];
  size_t n = 0;
  cr_assert_eq(ce_tlsconn_read(c, buf, sizeof(buf), &n), CE_ETLS);
  cr_assert(ce_tlsconn_peer_rejected_cert(c), "client: %s", ce_tlsconn_error(c));
  expect_error(c, "the peer sent fatal alert certificate_required (116)");
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

Test(tlsconn, not_tls_at_all) {
  ce_tlsconn_t *s = server_for("example.com", NULL, 0);
  static const char req[] = "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n";
  cr_assert_eq(ce_tlsconn_feed(s, (const uint8_t *)req, sizeof(req) - 1), CE_OK);
  cr_assert_eq(ce_tlsconn_handshake(s), CE_ETLS);
  cr_assert_str_eq(ce_tlsconn_error(s), "TLS failure: http request");
  cr_assert_not(ce_tlsconn_peer_rejected_cert(s));
  cr_assert_eq(ERR_peek_error(), 0ul);
  ce_tlsconn_free(s);
}

Test(tlsconn, peer_closes_during_the_handshake) {
  /* A server that gets a close_notify where a ClientHello should be. */
  ce_tlsconn_t *s = server_for("example.com", NULL, 0);
  static const uint8_t close_notify[] = {21, 3, 3, 0, 2, 1, 0};
  cr_assert_eq(ce_tlsconn_feed(s, close_notify, sizeof(close_notify)), CE_OK);
  cr_assert_eq(ce_tlsconn_handshake(s), CE_ETLS);
  cr_assert_str_eq(ce_tlsconn_error(s), "TLS failure: unexpected message");
  cr_assert_not(ce_tlsconn_peer_rejected_cert(s));
  ce_tlsconn_free(s);
}

/* ---- closing and argument checks --------------------------------------------------------- */

Test(tlsconn, close_notify_is_closed) {
  ce_tlsconn_t *s = server_for("example.com", NULL, 0);
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", NULL, 0);
  connected(c, s);
  transfer(c, s, 10);
  ce_tlsconn_shutdown(c);
  size_t queued = ce_tlsconn_pending_out(c);
  cr_assert_gt(queued, 0u);
  ce_tlsconn_shutdown(c); /* once only */
  cr_assert_eq(ce_tlsconn_pending_out(c), queued);
  cr_assert_eq(ce_tlsconn_write(c, (const uint8_t *)"x", 1), CE_ECLOSED);
  fx_shuttle(c, s);
  uint8_t buf[16];
  size_t n = 0;
  cr_assert_eq(ce_tlsconn_read(s, buf, sizeof(buf), &n), CE_ECLOSED);
  cr_assert_eq(ce_tlsconn_read(s, buf, sizeof(buf), &n), CE_ECLOSED);
  cr_assert_str_empty(ce_tlsconn_error(s));
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

Test(tlsconn, calls_before_the_handshake) {
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", NULL, 0);
  cr_assert_eq(ce_tlsconn_write(c, (const uint8_t *)"x", 1), CE_EINVAL);
  cr_assert_eq(ce_tlsconn_write(c, NULL, 0), CE_OK);
  ce_tlsconn_shutdown(c);
  cr_assert_eq(ce_tlsconn_pending_out(c), 0u);
  uint8_t buf[16];
  size_t n = 0;
  /* A read drives the handshake: the ClientHello is queued. */
  cr_assert_eq(ce_tlsconn_read(c, buf, sizeof(buf), &n), CE_EAGAIN);
  cr_assert_gt(ce_tlsconn_pending_out(c), 0u);
  cr_assert_eq(ce_tlsconn_read(c, NULL, 1, &n), CE_EINVAL);
  cr_assert_eq(ce_tlsconn_read(c, buf, 0, &n), CE_EINVAL);
  cr_assert_eq(ce_tlsconn_read(c, buf, 1, NULL), CE_EINVAL);
  cr_assert_eq(ce_tlsconn_feed(c, NULL, 3), CE_EINVAL);
  cr_assert_eq(ce_tlsconn_feed(c, NULL, 0), CE_OK);
  cr_assert_eq(ce_tlsconn_take_out(c, NULL, 10), 0u);
  cr_assert_eq(ce_tlsconn_take_out(c, buf, 0), 0u);
  cr_assert_null(ce_tlsconn_alpn(c, NULL));
  ce_tlsconn_free(c);
  ce_tlsconn_free(NULL);
}

Test(tlsconn, new_refusals_free_the_ssl) {
  ce_tlsconn_t *sentinel = (ce_tlsconn_t *)&env;
  ce_tlsconn_t *t = sentinel;
  cr_assert_eq(ce_tlsconn_new(NULL, true, &t), CE_EINVAL);
  SSL *ssl = NULL;
  cr_assert_eq(ce_tls_client_ssl_new(env.trusting, "example.com", NULL, 0, &ssl), CE_OK);
  /* LeakSanitizer would report the SSL if it were not freed. */
  cr_assert_eq(ce_tlsconn_new(ssl, false, NULL), CE_EINVAL);
  cr_assert_eq(t, sentinel);
}

Test(tlsconn, corrupted_record_after_the_handshake) {
  ce_tlsconn_t *s = server_for("example.com", NULL, 0);
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", NULL, 0);
  connected(c, s);
  cr_assert_eq(ce_tlsconn_write(c, (const uint8_t *)"hello", 5), CE_OK);
  uint8_t rec[256];
  size_t n = ce_tlsconn_take_out(c, rec, sizeof(rec));
  cr_assert_gt(n, 10u);
  rec[n - 1] ^= 0x55; /* breaks the AEAD tag */
  cr_assert_eq(ce_tlsconn_feed(s, rec, n), CE_OK);
  uint8_t buf[16];
  size_t got = 0;
  cr_assert_eq(ce_tlsconn_read(s, buf, sizeof(buf), &got), CE_ETLS);
  expect_error(s, "TLS failure: ");
  cr_assert_not(ce_tlsconn_peer_rejected_cert(s));
  /* The server's alert reaches the client, which is no rejection of its
   * certificate either. */
  fx_shuttle(s, c);
  cr_assert_eq(ce_tlsconn_read(c, buf, sizeof(buf), &got), CE_ETLS);
  cr_assert_str_eq(ce_tlsconn_error(c), "the peer sent fatal alert bad_record_mac (20)");
  cr_assert_not(ce_tlsconn_peer_rejected_cert(c));
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
}

Test(tlsconn, close_notify_instead_of_a_server_hello) {
  ce_tlsconn_t *c = client_for(env.trusting, "example.com", NULL, 0);
  cr_assert_eq(ce_tlsconn_handshake(c), CE_EAGAIN);
  uint8_t hello[4096];
  cr_assert_gt(ce_tlsconn_take_out(c, hello, sizeof(hello)), 0u);
  static const uint8_t close_notify[] = {21, 3, 3, 0, 2, 1, 0};
  cr_assert_eq(ce_tlsconn_feed(c, close_notify, sizeof(close_notify)), CE_OK);
  cr_assert_eq(ce_tlsconn_handshake(c), CE_ETLS);
  cr_assert_str_eq(ce_tlsconn_error(c),
                   "the peer closed the connection during the handshake");
  cr_assert_not(ce_tlsconn_peer_rejected_cert(c));
  ce_tlsconn_free(c);
}
