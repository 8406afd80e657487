/* Tests for c_src/proxy/transport.c: what the HTTP code may ask of a
 * side without knowing whether it is plain TCP or TLS. */
#include <criterion/criterion.h>
#include <openssl/ssl.h>
#include <string.h>

#include "common/error.h"
#include "proxy/conn_internal.h"
#include "proxy/transport.h"
#include "tls/tlsconn.h"

Test(transport, a_plain_side_is_ready_once_connected_and_its_fin_is_a_clean_end) {
  side_t s;
  memset(&s, 0, sizeof(s));
  s.open = true;
  cr_assert_not(ce_transport_ready(&s));
  s.connected = true;
  cr_assert(ce_transport_ready(&s));
  cr_assert(ce_transport_clean_end(&s), "plain TCP has nothing but the FIN");
  cr_assert_not(ce_transport_speaks_h2(&s));
  cr_assert_not(ce_transport_close_notify(&s), "nothing to flush on plain TCP");
  cr_assert_eq(ce_transport_received(&s, "x", 1), CE_EINVAL, "conn.c reads a plain side straight into its input");
  ce_transport_rest(&s);
}

/* A TLS side before its handshake (no peer needed). */
static void tls_side(side_t *s, SSL_CTX *ctx) {
  memset(s, 0, sizeof(*s));
  SSL *ssl = SSL_new(ctx);
  cr_assert_not_null(ssl);
  SSL_set_connect_state(ssl);
  cr_assert_eq(ce_tlsconn_new(ssl, false, &s->tls), CE_OK);
  s->open = true;
  s->connected = true;
}

Test(transport, a_tls_side_is_ready_only_after_its_handshake_and_ends_clean_only_by_close_notify) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  cr_assert_not_null(ctx);
  side_t s;
  tls_side(&s, ctx);
  cr_assert_not(ce_transport_ready(&s), "connected is not enough for TLS");
  cr_assert_not(ce_transport_clean_end(&s), "a bare TCP close may cut a body short");
  cr_assert_not(ce_transport_close_notify(&s), "no close_notify before the handshake");
  cr_assert_not(ce_transport_speaks_h2(&s));
  cr_assert_eq(ce_transport_received(&s, "\x16\x03\x01", 3), CE_OK);
  s.handshaken = true;
  cr_assert(ce_transport_ready(&s));
  s.close_notify = true;
  cr_assert(ce_transport_clean_end(&s));
  ce_transport_rest(&s);

  /* Reset: the engine goes, the side can be connected again. */
  s.eof = s.shut = s.shut_done = s.close_after_flush = true;
  s.in_len = 5;
  ce_transport_reset(&s);
  cr_assert_null(s.tls);
  cr_assert_not(s.connected || s.handshaken || s.eof || s.close_notify || s.shut || s.shut_done ||
                s.close_after_flush);
  cr_assert_eq(s.in_len, 0);
  SSL_CTX_free(ctx);
}
