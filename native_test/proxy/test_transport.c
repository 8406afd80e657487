/* Tests for c_src/proxy/transport.c: what the HTTP code may ask of a
 * side without knowing whether it is plain TCP or TLS. */
#include <criterion/criterion.h>
#include <errno.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"
#include "proxy/conn_internal.h"
#include "support/failalloc.h"
#include "proxy/transport.h"
#include "tls/ca.h"
#include "tls/context.h"
#include "tls/fixtures.h"
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
  cr_assert_eq(ce_transport_close_notify(&s), CE_EAGAIN, "nothing to flush on plain TCP");
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
  cr_assert_eq(ce_transport_close_notify(&s), CE_EAGAIN, "no close_notify before the handshake");
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

/* ---- gathering: one write per turn, full records ------------------------- */

/* A TLS side of the proxy (the workspace's, server role) on one end of a
 * socket pair, its handshake done in memory with a client engine that
 * plays the workspace and reads the other end. */
typedef struct {
  uv_loop_t loop;
  ce_proxy_t proxy;
  ce_conn_t *c;
  ce_tlsconn_t *peer; /* the workspace's TLS */
  int fd;             /* the workspace's end of the pair */
  ce_ca_t *ca;
  ce_leaf_cache_t *leaves;
  SSL_CTX *server_ctx, *client_ctx;
  int closed;
} gx_t;

static void gx_closed(uv_handle_t *h) { ((gx_t *)h->data)->closed++; }

static void gx_open(gx_t *g) {
  memset(g, 0, sizeof(*g));
  fx_setup();
  fx_generate_ca(7);
  char cert[FX_PATH_MAX], key[FX_PATH_MAX], err[512];
  cr_assert_eq(ce_ca_load(fx_path(cert, "ca.pem"), fx_path(key, "ca.key"), &g->ca, err, sizeof(err)), CE_OK, "%s",
               err);
  cr_assert_eq(ce_leaf_cache_new(g->ca, 0, &g->leaves), CE_OK);
  cr_assert_eq(ce_tls_server_ctx_new(&g->server_ctx, err, sizeof(err)), CE_OK);
  g->client_ctx = SSL_CTX_new(TLS_client_method());
  cr_assert_not_null(g->client_ctx);
  SSL_CTX_set_verify(g->client_ctx, SSL_VERIFY_NONE, NULL);

  cr_assert_eq(uv_loop_init(&g->loop), 0);
  g->proxy.loop = &g->loop;
  ce_bufpool_init(&g->proxy.inbufs, CE_CONN_INPUT_MAX, 1);
  g->c = calloc(1, sizeof(*g->c));
  cr_assert_not_null(g->c);
  g->c->proxy = &g->proxy;
  g->c->state = ST_CLOSING; /* a write's completion drives nothing */
  side_t *s = &g->c->c;
  s->conn = g->c->u.conn = g->c;
  s->name = "client";

  X509 *leaf = NULL;
  EVP_PKEY *lkey = NULL;
  cr_assert_eq(ce_leaf_get(g->leaves, "example.test", &leaf, &lkey), CE_OK);
  SSL *ssl = NULL;
  cr_assert_eq(ce_tls_server_ssl_new(g->server_ctx, leaf, lkey, NULL, 0, &ssl), CE_OK);
  X509_free(leaf);
  EVP_PKEY_free(lkey);
  cr_assert_eq(ce_tlsconn_new(ssl, true, &s->tls), CE_OK);
  SSL *cssl = SSL_new(g->client_ctx);
  cr_assert_not_null(cssl);
  cr_assert_eq(ce_tlsconn_new(cssl, false, &g->peer), CE_OK);
  int crc = CE_EAGAIN, src = CE_EAGAIN;
  for (int i = 0; i < 10 && (crc == CE_EAGAIN || src == CE_EAGAIN); i++) {
    crc = ce_tlsconn_handshake(g->peer);
    fx_shuttle(g->peer, s->tls);
    src = ce_tlsconn_handshake(s->tls);
    fx_shuttle(s->tls, g->peer);
  }
  cr_assert_eq(crc, CE_OK, "%s", ce_tlsconn_error(g->peer));
  cr_assert_eq(src, CE_OK, "%s", ce_tlsconn_error(s->tls));
  /* What the server still had to say (TLS 1.3 tickets: none here). */
  fx_shuttle(s->tls, g->peer);

  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  g->fd = sv[0];
  uv_tcp_init(&g->loop, &s->tcp);
  s->tcp.data = g;
  cr_assert_eq(uv_tcp_open(&s->tcp, sv[1]), 0);
  s->open = s->connected = s->handshaken = true;
}

static void gx_close(gx_t *g) {
  side_t *s = &g->c->c;
  ce_conn_side_close(s, gx_closed);
  ce_transport_reset(s);
  ce_conn_writes_close(&g->proxy);
  uv_run(&g->loop, UV_RUN_DEFAULT);
  cr_assert_eq(g->closed, 1);
  cr_assert_eq(g->proxy.recbufs.out, 0, "every record buffer went back");
  cr_assert_eq(uv_loop_close(&g->loop), 0);
  s->in_len = 0;
  ce_conn_release_input(s);
  ce_bufpool_clear(&g->proxy.inbufs);
  free(g->c);
  ce_tlsconn_free(g->peer);
  if (g->fd >= 0)
    close(g->fd);
  SSL_CTX_free(g->client_ctx);
  SSL_CTX_free(g->server_ctx);
  ce_leaf_cache_free(g->leaves);
  ce_ca_free(g->ca);
  fx_teardown();
}

/* Reads everything the pair holds into buf (NULL: counts only). */
static size_t gx_read(gx_t *g, uint8_t *buf, size_t cap) {
  size_t n = 0;
  for (;;) {
    ssize_t r = read(g->fd, buf + n, cap - n);
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  return n;
}

/* The record lengths of a TLS stream (each record's header: type,
 * version, 2-byte length; RFC 8446 §5.1); returns how many. */
static size_t record_lengths(const uint8_t *wire, size_t len, size_t *lens, size_t max) {
  size_t n = 0, off = 0;
  while (off + 5 <= len) {
    cr_assert_eq(wire[off], 23, "application data records only");
    size_t rl = ((size_t)wire[off + 3] << 8) | wire[off + 4];
    cr_assert_lt(n, max);
    lens[n++] = rl;
    off += 5 + rl;
  }
  cr_assert_eq(off, len, "whole records");
  return n;
}

/* Decrypts the wire bytes with the workspace's engine into out. */
static size_t open_records(gx_t *g, const uint8_t *wire, size_t len, uint8_t *out, size_t cap) {
  cr_assert_eq(ce_tlsconn_feed(g->peer, wire, len), CE_OK);
  size_t n = 0;
  for (;;) {
    size_t got = 0;
    int rc = ce_tlsconn_read(g->peer, out + n, cap - n, &got);
    if (rc != CE_OK)
      break;
    n += got;
  }
  return n;
}

Test(transport, a_tls_side_gathers_a_turn_and_writes_it_once_in_full_records_in_order) {
  gx_t g;
  gx_open(&g);
  side_t *s = &g.c->c;
  /* A small head, a body given in odd pieces: 100 + 1000 + 70,000 + 3 bytes. */
  size_t total = 100 + 1000 + 70000 + 3;
  uint8_t *plain = malloc(total);
  cr_assert_not_null(plain);
  for (size_t i = 0; i < total; i++)
    plain[i] = (uint8_t)(i % 251);
  size_t pieces[] = {100, 1000, 70000, 3}, off = 0;
  for (size_t i = 0; i < 4; i++) {
    cr_assert_eq(ce_transport_send(s, (const char *)plain + off, pieces[i]), CE_OK);
    off += pieces[i];
    cr_assert_eq(s->queued, off, "given bytes count against the output bound at once");
  }
  uint8_t probe[16];
  cr_assert_eq(read(g.fd, probe, sizeof(probe)), -1, "nothing is written before the turn ends");
  cr_assert_eq(errno, EAGAIN);
  cr_assert(ce_transport_has_output(s));

  cr_assert_eq(ce_transport_flush(s), CE_OK);
  cr_assert_not(ce_transport_has_output(s));
  cr_assert_null(s->rec, "the record buffer goes back once written");
  cr_assert_eq(s->pending, 0);
  size_t cap = total * 2;
  uint8_t *wire = malloc(cap);
  cr_assert_not_null(wire);
  size_t wlen = gx_read(&g, wire, cap);
  cr_assert_eq(s->queued, 0, "the socket took it all: nothing waits in a write request");

  /* 71,103 bytes: four full records and one of the rest (TLS 1.3 with
   * AES-GCM: 16 bytes of tag and 1 of content type per record). */
  size_t lens[16];
  size_t nrec = record_lengths(wire, wlen, lens, 16);
  cr_assert_eq(nrec, total / CE_CONN_RECORD + 1, "%zu records", nrec);
  for (size_t i = 0; i + 1 < nrec; i++)
    cr_assert_eq(lens[i], CE_CONN_RECORD + 17, "record %zu carries %zu bytes", i, lens[i]);
  cr_assert_eq(lens[nrec - 1], total % CE_CONN_RECORD + 17);

  uint8_t *back = malloc(total);
  cr_assert_not_null(back);
  cr_assert_eq(open_records(&g, wire, wlen, back, total), total);
  cr_assert(memcmp(back, plain, total) == 0, "the bytes arrive whole and in order");

  uv_run(&g.loop, UV_RUN_NOWAIT); /* the write's completion */
  cr_assert_eq(s->queued, 0);
  free(back);
  free(wire);
  free(plain);
  gx_close(&g);
}

Test(transport, a_seal_sends_the_gathered_bytes_as_a_short_record_and_a_whole_one_then_goes_as_given) {
  gx_t g;
  gx_open(&g);
  side_t *s = &g.c->c;
  /* An h2 HEADERS frame's worth, sealed, then one whole record (a DATA
   * frame of a whole chunk) and a small rest. */
  size_t total = 60 + CE_CONN_RECORD + 500;
  uint8_t *plain = malloc(total);
  cr_assert_not_null(plain);
  for (size_t i = 0; i < total; i++)
    plain[i] = (uint8_t)(i % 251);
  cr_assert_eq(ce_transport_send(s, (const char *)plain, 60), CE_OK);
  cr_assert_eq(ce_transport_seal(s), CE_OK);
  cr_assert_eq(s->rec_len, 0, "nothing gathered after a seal");
  cr_assert_eq(ce_transport_seal(s), CE_OK, "a seal with nothing gathered does nothing");
  cr_assert_eq(ce_transport_send(s, (const char *)plain + 60, CE_CONN_RECORD), CE_OK);
  cr_assert_eq(s->rec_len, 0, "the whole record was not copied into the record buffer");
  cr_assert_eq(ce_transport_send(s, (const char *)plain + 60 + CE_CONN_RECORD, 500), CE_OK);
  cr_assert_eq(ce_transport_flush(s), CE_OK);

  uint8_t *wire = malloc(total * 2);
  cr_assert_not_null(wire);
  size_t wlen = gx_read(&g, wire, total * 2);
  size_t lens[8];
  cr_assert_eq(record_lengths(wire, wlen, lens, 8), 3);
  cr_assert_eq(lens[0], 60 + 17, "the sealed bytes are a record of their own");
  cr_assert_eq(lens[1], CE_CONN_RECORD + 17);
  cr_assert_eq(lens[2], 500 + 17);
  uint8_t *back = malloc(total);
  cr_assert_not_null(back);
  cr_assert_eq(open_records(&g, wire, wlen, back, total), total);
  cr_assert(memcmp(back, plain, total) == 0, "in order");
  uv_run(&g.loop, UV_RUN_NOWAIT);
  free(back);
  free(wire);
  free(plain);
  gx_close(&g);
}

Test(transport, what_the_socket_does_not_take_of_a_turn_waits_in_order) {
  gx_t g;
  gx_open(&g);
  side_t *s = &g.c->c;
  /* A socket with little room: the turn's records go partly straight to
   * it, the rest into a write request that the loop writes later. */
  int fd = -1;
  uv_fileno((uv_handle_t *)&s->tcp, &fd);
  int small = 4096;
  cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
  size_t total = 200000;
  uint8_t *plain = malloc(total), *back = malloc(total), *wire = malloc(2 * total);
  cr_assert(plain != NULL && back != NULL && wire != NULL);
  for (size_t i = 0; i < total; i++)
    plain[i] = (uint8_t)(i % 253);
  cr_assert_eq(ce_transport_send(s, (const char *)plain, total), CE_OK);
  cr_assert_eq(ce_transport_flush(s), CE_OK);
  cr_assert_gt(s->queued, 0, "the rest waits in a write request");
  cr_assert_lt(s->queued, total + total / 10);
  size_t wlen = 0;
  for (int i = 0; i < 2000 && s->queued > 0; i++) {
    wlen += gx_read(&g, wire + wlen, 2 * total - wlen);
    uv_run(&g.loop, UV_RUN_NOWAIT);
  }
  wlen += gx_read(&g, wire + wlen, 2 * total - wlen);
  cr_assert_eq(s->queued, 0);
  cr_assert_eq(open_records(&g, wire, wlen, back, total), total);
  cr_assert(memcmp(back, plain, total) == 0, "the bytes arrive whole and in order");
  free(wire);
  free(back);
  free(plain);
  gx_close(&g);
}

Test(transport, gathered_output_goes_before_the_close_notify_and_on_close) {
  gx_t g;
  gx_open(&g);
  side_t *s = &g.c->c;
  cr_assert_eq(ce_transport_send(s, "last words", 10), CE_OK);
  cr_assert_eq(ce_transport_close_notify(s), CE_OK);
  cr_assert_eq(ce_transport_flush(s), CE_OK);
  uint8_t wire[512], back[64];
  size_t wlen = gx_read(&g, wire, sizeof(wire));
  cr_assert_eq(ce_tlsconn_feed(g.peer, wire, wlen), CE_OK);
  size_t got = 0;
  cr_assert_eq(ce_tlsconn_read(g.peer, back, sizeof(back), &got), CE_OK);
  cr_assert_eq(got, 10);
  cr_assert(memcmp(back, "last words", 10) == 0);
  cr_assert_eq(ce_tlsconn_read(g.peer, back, sizeof(back), &got), CE_ECLOSED, "then the close_notify");
  gx_close(&g);
}

Test(transport, a_side_closed_with_output_gathered_writes_it_and_frees_its_buffers) {
  gx_t g;
  gx_open(&g);
  side_t *s = &g.c->c;
  static char big[3 * CE_CONN_RECORD + 5];
  memset(big, 'x', sizeof(big));
  cr_assert_eq(ce_transport_send(s, "head", 4), CE_OK);
  cr_assert_eq(ce_transport_send(s, big, sizeof(big)), CE_OK);
  cr_assert_not_null(s->rec, "a partial record waits");
  /* The workspace is gone: the write on close fails, and nothing stays. */
  close(g.fd);
  g.fd = -1;
  signal(SIGPIPE, SIG_IGN);
  g.c->dead = true; /* an aborting connection: nothing more to report */
  ce_conn_side_close(s, gx_closed);
  cr_assert_null(s->rec);
  cr_assert_eq(s->queued, 0);
  cr_assert_eq(s->pending, 0);
  gx_close(&g); /* asserts the record buffer's return; LSan the rest */
}

Test(transport, a_close_notify_that_cannot_seal_the_gathered_bytes_says_so) {
  gx_t g;
  gx_open(&g);
  side_t *s = &g.c->c;
  cr_assert_eq(ce_transport_send(s, "last words", 10), CE_OK);
  cr_assert_not_null(s->rec, "gathered, not sealed yet");
  /* An engine that can no longer write (here: already shut): the end of
   * the answer cannot go, and the caller must hear it, not end cleanly. */
  ce_tlsconn_shutdown(s->tls);
  cr_assert_eq(ce_transport_close_notify(s), CE_ETLS);
  cr_assert_eq(s->rec_len, 0);
  g.c->dead = true;
  gx_close(&g); /* asserts the record buffer's return */
}

Test(transport, a_flush_whose_write_fails_gives_its_record_buffer_back) {
  /* Every allocation of the flush fails in turn (OpenSSL's sealing, the
   * write request): the record buffer goes back to the pool each time. */
  for (size_t n = 0; n < 64; n++) {
    gx_t g;
    gx_open(&g);
    side_t *s = &g.c->c;
    cr_assert_eq(ce_transport_send(s, "an answer", 9), CE_OK);
    cr_assert_not_null(s->rec);
    g.c->dead = true;            /* an aborting connection: nothing to report */
    s->close_after_flush = true; /* through a write request, not straight */
    ce_failalloc_arm(n);
    int rc = ce_transport_flush(s);
    ce_failalloc_disarm();
    bool hit = ce_failalloc_failures() > 0;
    cr_assert_null(s->rec, "the record buffer went back (allocation %zu)", n);
    s->close_after_flush = false;
    gx_close(&g); /* asserts the pool's count */
    if (!hit) {
      cr_assert_eq(rc, CE_OK);
      return;
    }
    cr_assert_neq(rc, CE_OK, "allocation %zu failed, and the flush says so", n);
  }
  cr_assert_fail("the flush never got through without an injected failure");
}
