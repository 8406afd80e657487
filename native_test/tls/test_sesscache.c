/* Tests for c_src/tls/sesscache.c: upstream TLS 1.3 session resumption,
 * with an in-memory origin (the session CA's leaf on a server context that
 * issues tickets, as origins do) and the proxy's upstream context. */
#include <criterion/criterion.h>
#include <openssl/err.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "tls/ca.h"
#include "tls/context.h"
#include "tls/fixtures.h"
#include "tls/sesscache.h"
#include "tls/tlsconn.h"
#include "support/failalloc.h"

#define MOZILLA_PEM CE_SOURCE_ROOT "/priv/ca-certificates/mozilla.pem"

static const unsigned char H11[] = "\x08http/1.1";
static const unsigned char H2_H11[] = "\x02h2\x08http/1.1";
#define WIRE(x) x, sizeof(x) - 1

static struct {
  ce_ca_t *ca;
  ce_leaf_cache_t *leaves;
  SSL_CTX *origin;  /* issues TLS 1.3 tickets */
  SSL_CTX *client;  /* the proxy's upstream context, trusting the session CA */
} env;

static void setup(void) {
  fx_setup();
  fx_generate_ca(7);
  char cert[FX_PATH_MAX], key[FX_PATH_MAX], err[512];
  cr_assert_eq(ce_ca_load(fx_path(cert, "ca.pem"), fx_path(key, "ca.key"), &env.ca, err,
                          sizeof(err)),
               CE_OK, "%s", err);
  cr_assert_eq(ce_leaf_cache_new(env.ca, 0, &env.leaves), CE_OK);
  cr_assert_eq(ce_tls_server_ctx_new(&env.origin, err, sizeof(err)), CE_OK);
  SSL_CTX_clear_options(env.origin, SSL_OP_NO_TICKET);
  cr_assert_eq(SSL_CTX_set_num_tickets(env.origin, 2), 1);
  cr_assert_eq(ce_tls_client_ctx_new(MOZILLA_PEM, cert, &env.client, err, sizeof(err)), CE_OK,
               "%s", err);
}

static void teardown(void) {
  SSL_CTX_free(env.client);
  SSL_CTX_free(env.origin);
  ce_leaf_cache_free(env.leaves);
  ce_ca_free(env.ca);
  fx_teardown();
}

TestSuite(sesscache, .init = setup, .fini = teardown);

/* One connection to an origin presenting a leaf for leaf_host, the client
 * asking for host:port with the ALPN offer. Returns the client's handshake
 * result; *reused says whether it resumed. The client reads the origin's
 * first bytes (which brings the tickets in) and both are freed without a
 * close_notify, as the proxy drops an idle upstream. */
static int connect_once(const char *leaf_host, const char *host, uint16_t port,
                        const unsigned char *alpn, size_t alpn_len, bool *reused) {
  X509 *cert = NULL;
  EVP_PKEY *key = NULL;
  cr_assert_eq(ce_leaf_get(env.leaves, leaf_host, &cert, &key), CE_OK);
  SSL *sssl = NULL, *cssl = NULL;
  cr_assert_eq(ce_tls_server_ssl_new(env.origin, cert, key, WIRE(H2_H11), &sssl), CE_OK);
  X509_free(cert);
  EVP_PKEY_free(key);
  ce_tlsconn_t *s = NULL, *c = NULL;
  cr_assert_eq(ce_tlsconn_new(sssl, true, &s), CE_OK);
  cr_assert_eq(ce_tls_client_ssl_new_at(env.client, host, port, alpn, alpn_len, &cssl), CE_OK);
  cr_assert_eq(ce_tlsconn_new(cssl, false, &c), CE_OK);
  int rc = CE_EAGAIN, src = CE_EAGAIN;
  for (int round = 0; round < 20; round++) {
    if (rc == CE_EAGAIN)
      rc = ce_tlsconn_handshake(c);
    size_t moved = fx_shuttle(c, s);
    if (src == CE_EAGAIN)
      src = ce_tlsconn_handshake(s);
    moved += fx_shuttle(s, c);
    if ((rc != CE_EAGAIN && src != CE_EAGAIN) || moved == 0)
      break;
  }
  if (rc == CE_OK) {
    cr_assert_eq(src, CE_OK);
    cr_assert_eq(ce_tlsconn_write(s, (const uint8_t *)"hi", 2), CE_OK);
    fx_shuttle(s, c);
    uint8_t buf[16];
    size_t n = 0;
    cr_assert_eq(ce_tlsconn_read(c, buf, sizeof(buf), &n), CE_OK);
    cr_assert_eq(n, 2u);
  }
  *reused = SSL_session_reused(ce_tlsconn_ssl(c)) == 1;
  cr_assert_eq(ERR_peek_error(), 0ul, "the error queue is not empty");
  ce_tlsconn_free(c);
  ce_tlsconn_free(s);
  return rc;
}

static bool resumed(const char *host, uint16_t port, const unsigned char *alpn, size_t len) {
  bool r = false;
  cr_assert_eq(connect_once(host, host, port, alpn, len, &r), CE_OK);
  return r;
}

Test(sesscache, second_connection_to_the_same_origin_resumes) {
  cr_assert_not(resumed("api.example.com", 443, WIRE(H2_H11)));
  /* The origin (OpenSSL's defaults) sends two tickets: both are kept. */
  cr_assert_eq(ce_tls_sesscache_count(env.client), 2u);
  cr_assert(resumed("api.example.com", 443, WIRE(H2_H11)));
  /* A resumed connection's tickets are kept too: the next ones resume. */
  cr_assert(resumed("api.example.com", 443, WIRE(H2_H11)));
  cr_assert(resumed("api.example.com", 443, WIRE(H2_H11)));
  cr_assert_geq(ce_tls_sesscache_count(env.client), 1u);
}

/* Connections opened together (before any of them brings a ticket back)
 * each take a different ticket, and a ticket is never offered twice. */
Test(sesscache, a_ticket_is_offered_once) {
  cr_assert_not(resumed("api.example.com", 443, WIRE(H2_H11)));
  size_t held = ce_tls_sesscache_count(env.client);
  cr_assert_eq(held, 2u);
  SSL *ssl[3] = {NULL, NULL, NULL};
  for (size_t i = 0; i < 3; i++)
    cr_assert_eq(ce_tls_client_ssl_new_at(env.client, "api.example.com", 443, WIRE(H2_H11), &ssl[i]),
                 CE_OK);
  cr_assert_not_null(SSL_get0_session(ssl[0]));
  cr_assert_not_null(SSL_get0_session(ssl[1]));
  cr_assert_neq(SSL_get0_session(ssl[0]), SSL_get0_session(ssl[1]));
  size_t len0 = 0, len1 = 0;
  const unsigned char *t0 = NULL, *t1 = NULL;
  SSL_SESSION_get0_ticket(SSL_get0_session(ssl[0]), &t0, &len0);
  SSL_SESSION_get0_ticket(SSL_get0_session(ssl[1]), &t1, &len1);
  cr_assert(len0 > 0 && len1 > 0);
  cr_assert(len0 != len1 || memcmp(t0, t1, len0) != 0, "the same ticket offered twice");
  cr_assert_null(SSL_get0_session(ssl[2]), "a third connection found a ticket that was taken");
  cr_assert_eq(ce_tls_sesscache_count(env.client), 0u);
  for (size_t i = 0; i < 3; i++)
    SSL_free(ssl[i]);
}

Test(sesscache, a_key_holds_at_most_its_share) {
  /* An origin that sends more tickets than a key may hold. */
  SSL_CTX_set_num_tickets(env.origin, CE_TLS_SESSCACHE_PER_KEY + 4);
  cr_assert_not(resumed("api.example.com", 443, WIRE(H2_H11)));
  cr_assert_eq(ce_tls_sesscache_count(env.client), CE_TLS_SESSCACHE_PER_KEY);
  /* Another key has its own share beside it. */
  cr_assert_not(resumed("www.example.com", 443, WIRE(H2_H11)));
  cr_assert_eq(ce_tls_sesscache_count(env.client), 2 * CE_TLS_SESSCACHE_PER_KEY);
  cr_assert(resumed("www.example.com", 443, WIRE(H2_H11)));
  cr_assert(resumed("api.example.com", 443, WIRE(H2_H11)));
  cr_assert_leq(ce_tls_sesscache_count(env.client), 2 * CE_TLS_SESSCACHE_PER_KEY);
}

Test(sesscache, another_name_port_or_alpn_does_not_resume) {
  SSL_CTX_set_num_tickets(env.origin, 1); /* one ticket per key below */
  cr_assert_not(resumed("api.example.com", 443, WIRE(H2_H11)));
  cr_assert_not(resumed("www.example.com", 443, WIRE(H2_H11)));
  cr_assert_not(resumed("api.example.com", 8443, WIRE(H2_H11)));
  cr_assert_not(resumed("api.example.com", 443, WIRE(H11)));
  cr_assert_not(resumed("api.example.com", 443, NULL, 0));
  cr_assert_eq(ce_tls_sesscache_count(env.client), 5u);
  /* ... while each of them now resumes with its own. */
  cr_assert(resumed("www.example.com", 443, WIRE(H2_H11)));
  cr_assert(resumed("api.example.com", 8443, WIRE(H2_H11)));
  cr_assert(resumed("api.example.com", 443, NULL, 0));
}

/* An origin that sends a key's full share of tickets at once: none of
 * them stands in for another name, port or ALPN offer. */
Test(sesscache, many_tickets_still_resume_only_their_own_key) {
  SSL_CTX_set_num_tickets(env.origin, CE_TLS_SESSCACHE_PER_KEY + 4);
  cr_assert_not(resumed("api.example.com", 443, WIRE(H2_H11)));
  cr_assert_eq(ce_tls_sesscache_count(env.client), CE_TLS_SESSCACHE_PER_KEY);
  cr_assert_not(resumed("www.example.com", 443, WIRE(H2_H11)));
  cr_assert_not(resumed("api.example.com", 8443, WIRE(H2_H11)));
  cr_assert_not(resumed("api.example.com", 443, WIRE(H11)));
  cr_assert(resumed("api.example.com", 443, WIRE(H2_H11)));
}

/* When the store is full, a key's new tickets push out the least recently
 * stored ones of other keys. */
Test(sesscache, a_full_store_drops_the_oldest_tickets_of_any_key) {
  SSL_CTX_set_num_tickets(env.origin, 2);
  cr_assert_eq(ce__tls_sesscache_attach(env.client, 3), CE_OK);
  cr_assert_not(resumed("a.example.com", 443, WIRE(H11))); /* a1 a2 */
  cr_assert_not(resumed("b.example.com", 443, WIRE(H11))); /* b1 b2 push out a1 */
  cr_assert_eq(ce_tls_sesscache_count(env.client), 3u);
  cr_assert(resumed("a.example.com", 443, WIRE(H11)), "a2 is still there");
  cr_assert(resumed("b.example.com", 443, WIRE(H11)));
  cr_assert_eq(ce_tls_sesscache_count(env.client), 3u);
}

Test(sesscache, no_resumption_without_a_port) {
  cr_assert_not(resumed("api.example.com", 0, WIRE(H2_H11)));
  cr_assert_eq(ce_tls_sesscache_count(env.client), 0u);
  cr_assert_not(resumed("api.example.com", 0, WIRE(H2_H11)));
  SSL *ssl = NULL;
  cr_assert_eq(ce_tls_client_ssl_new(env.client, "api.example.com", WIRE(H2_H11), &ssl), CE_OK);
  cr_assert_null(SSL_get0_session(ssl));
  SSL_free(ssl);
}

Test(sesscache, a_failed_verification_never_stores_a_session) {
  SSL_CTX_set_num_tickets(env.origin, 1);
  bool r = true;
  /* The origin presents a leaf for another name: hostname mismatch. */
  cr_assert_eq(connect_once("evil.example.net", "api.example.com", 443, WIRE(H2_H11), &r),
               CE_ETLS);
  cr_assert_not(r);
  cr_assert_eq(ce_tls_sesscache_count(env.client), 0u);
  /* A verified connection to evil.example.net stores under that name only. */
  cr_assert_not(resumed("evil.example.net", 443, WIRE(H2_H11)));
  cr_assert_eq(connect_once("evil.example.net", "api.example.com", 443, WIRE(H2_H11), &r),
               CE_ETLS);
  cr_assert_not(r);
  cr_assert_eq(ce_tls_sesscache_count(env.client), 1u);
}

Test(sesscache, an_untrusted_origin_never_stores_a_session) {
  char err[256];
  SSL_CTX *mozilla = NULL;
  cr_assert_eq(ce_tls_client_ctx_new(MOZILLA_PEM, NULL, &mozilla, err, sizeof(err)), CE_OK);
  SSL_CTX *keep = env.client;
  env.client = mozilla;
  bool r = true;
  cr_assert_eq(connect_once("api.example.com", "api.example.com", 443, WIRE(H2_H11), &r),
               CE_ETLS);
  cr_assert_eq(ce_tls_sesscache_count(mozilla), 0u);
  env.client = keep;
  SSL_CTX_free(mozilla);
}

Test(sesscache, tls12_sessions_are_not_stored) {
  SSL_CTX_set_max_proto_version(env.origin, TLS1_2_VERSION);
  cr_assert_not(resumed("api.example.com", 443, WIRE(H2_H11)));
  cr_assert_eq(ce_tls_sesscache_count(env.client), 0u);
  cr_assert_not(resumed("api.example.com", 443, WIRE(H2_H11)));
}

Test(sesscache, the_bound_holds_and_the_oldest_goes_first) {
  SSL_CTX_set_num_tickets(env.origin, 1); /* one ticket per key below */
  cr_assert_eq(ce__tls_sesscache_attach(env.client, 3), CE_OK);
  const char *hosts[] = {"a.example.com", "b.example.com", "c.example.com", "d.example.com"};
  for (size_t i = 0; i < 4; i++)
    cr_assert_not(resumed(hosts[i], 443, WIRE(H11)));
  cr_assert_eq(ce_tls_sesscache_count(env.client), 3u);
  cr_assert_not(resumed("a.example.com", 443, WIRE(H11)), "the oldest entry was dropped");
  cr_assert(resumed("c.example.com", 443, WIRE(H11)));
  cr_assert(resumed("d.example.com", 443, WIRE(H11)));
  cr_assert_eq(ce_tls_sesscache_count(env.client), 3u);
}

Test(sesscache, the_default_bound_is_256) {
  for (unsigned i = 0; i < CE_TLS_SESSCACHE_MAX + 4; i++) {
    char host[64];
    snprintf(host, sizeof(host), "h%u.example.com", i);
    cr_assert_not(resumed(host, 443, NULL, 0));
  }
  cr_assert_eq(ce_tls_sesscache_count(env.client), CE_TLS_SESSCACHE_MAX);
}

Test(sesscache, attach_refuses_bad_arguments) {
  cr_assert_eq(ce__tls_sesscache_attach(NULL, 4), CE_EINVAL);
  cr_assert_eq(ce__tls_sesscache_attach(env.client, 0), CE_EINVAL);
  cr_assert_eq(ce__tls_sesscache_attach(env.client, CE_TLS_SESSCACHE_MAX + 1), CE_EINVAL);
  cr_assert_eq(ce_tls_sesscache_count(NULL), 0u);
}

Test(sesscache, uncacheable_keys_do_a_full_handshake) {
  /* An ALPN offer longer than the store keeps. */
  unsigned char alpn[45]; /* five names of 9 bytes */
  cr_assert_gt(sizeof(alpn), CE_TLS_SESSCACHE_ALPN_MAX);
  for (size_t i = 0; i < sizeof(alpn); i += 9) {
    alpn[i] = 8;
    memcpy(alpn + i + 1, "http/1.1", 8);
  }
  cr_assert_not(resumed("api.example.com", 443, alpn, sizeof(alpn)));
  cr_assert_eq(ce_tls_sesscache_count(env.client), 0u);
}

static void expect_enomem(int rc, size_t n) {
  if (ce_failalloc_last_source() == CE_FAILALLOC_OPENSSL)
    cr_assert(rc == CE_ENOMEM || rc == CE_ETLS, "allocation %zu (OpenSSL): %s", n, ce_err_name(rc));
  else
    cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
}

Test(sesscache, attach_under_allocation_failures) {
  for (size_t n = 0;; n++) {
    ce_failalloc_arm(n);
    int rc = ce__tls_sesscache_attach(env.client, 4);
    ce_failalloc_disarm();
    if (rc == CE_OK && ce_failalloc_failures() == 0)
      break;
    if (rc != CE_OK)
      expect_enomem(rc, n);
  }
  cr_assert_not(resumed("api.example.com", 443, WIRE(H11)));
  cr_assert(resumed("api.example.com", 443, WIRE(H11)));
}

Test(sesscache, resuming_ssl_under_allocation_failures) {
  SSL_CTX_set_num_tickets(env.origin, 1);
  for (size_t n = 0;; n++) {
    /* A stored session each round, so that every allocation of the
     * resuming path is reached. */
    if (ce_tls_sesscache_count(env.client) == 0)
      (void)resumed("api.example.com", 443, WIRE(H11));
    cr_assert_eq(ce_tls_sesscache_count(env.client), 1u);
    SSL *ssl = NULL;
    ce_failalloc_arm(n);
    int rc = ce_tls_client_ssl_new_at(env.client, "api.example.com", 443, WIRE(H11), &ssl);
    ce_failalloc_disarm();
    if (rc == CE_OK) {
      SSL_free(ssl);
      if (ce_failalloc_failures() == 0)
        break;
      continue;
    }
    expect_enomem(rc, n);
    cr_assert_null(ssl);
  }
}
