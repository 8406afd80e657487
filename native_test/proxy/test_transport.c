/* Tests for c_src/proxy/transport.c: what the HTTP code may ask of a
 * side without knowing whether it is plain TCP or TLS. */
#include <criterion/criterion.h>
#include <openssl/ssl.h>
#include <stdlib.h>
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
  cr_assert_not(ce_transport_handshaking(&s));
  cr_assert_not(ce_transport_input_full(&s), "a plain side's reads are bounded by its room instead");
  cr_assert_eq(ce_transport_pump(&s), CE_EAGAIN, "nothing waits inside a plain side");
  cr_assert_str_eq(ce_transport_error(&s), "");
  cr_assert_not(ce_transport_peer_rejected_cert(&s));
  ce_transport_rest(&s);
}

Test(transport, a_plain_side_takes_read_bytes_into_its_input_up_to_its_room) {
  ce_proxy_t proxy;
  memset(&proxy, 0, sizeof(proxy));
  ce_bufpool_init(&proxy.inbufs, CE_CONN_INPUT_MAX, 1);
  ce_conn_t *c = calloc(1, sizeof(*c));
  cr_assert_not_null(c);
  c->proxy = &proxy;
  side_t *s = &c->c;
  s->conn = c;
  s->open = s->connected = true;
  cr_assert_eq(ce_transport_read_room(s, CE_CONN_READ_CHUNK), CE_CONN_READ_CHUNK);
  cr_assert_eq(ce_transport_received(s, "GET ", 4), CE_OK);
  cr_assert_eq(s->in_len, 4);
  cr_assert(memcmp(s->in, "GET ", 4) == 0);
  /* Near the end of the input, a read may bring only what still fits. */
  s->in_len = CE_CONN_INPUT_MAX - 3;
  cr_assert_eq(ce_transport_read_room(s, CE_CONN_READ_CHUNK), 3);
  cr_assert_eq(ce_transport_received(s, "abcd", 4), CE_ETOOBIG, "never past the input's end");
  cr_assert_eq(s->in_len, CE_CONN_INPUT_MAX - 3);
  cr_assert_eq(ce_transport_received(s, "abc", 3), CE_OK);
  cr_assert_eq(s->in_len, CE_CONN_INPUT_MAX);
  s->in_len = 0;
  ce_conn_release_input(s);
  ce_bufpool_clear(&proxy.inbufs);
  free(c);
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
  cr_assert(ce_transport_handshaking(&s));
  cr_assert_eq(ce_transport_read_room(&s, CE_CONN_READ_CHUNK), CE_CONN_READ_CHUNK, "the engine holds what waits");
  cr_assert_eq(ce_transport_pump(&s), CE_EAGAIN, "no plaintext before the handshake");
  cr_assert_eq(ce_transport_received(&s, "\x16\x03\x01", 3), CE_OK);
  s.handshaken = true;
  cr_assert_not(ce_transport_handshaking(&s));
  s.in_len = CE_CONN_INPUT_MAX - 1;
  cr_assert(ce_transport_input_full(&s), "more bytes would only wait inside the engine");
  s.in_len = 0;
  cr_assert(ce_transport_ready(&s));
  s.close_notify = true;
  cr_assert(ce_transport_clean_end(&s));
  ce_transport_rest(&s);

  /* Reset: the engine goes, the side can be connected again. */
  s.eof = s.close_after_flush = true;
  s.shut = SIDE_SHUT;
  s.in_len = 5;
  ce_transport_reset(&s);
  cr_assert_null(s.tls);
  cr_assert_not(s.connected || s.handshaken || s.eof || s.close_notify || s.shut != SIDE_WRITING ||
                s.close_after_flush);
  cr_assert_eq(s.in_len, 0);
  SSL_CTX_free(ctx);
}
