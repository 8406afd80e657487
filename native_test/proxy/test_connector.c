/* Tests for c_src/proxy/connector.c: reaching an upstream over loopback,
 * without network namespaces. A fake owner holds the side and reads it
 * as the connection would (feeding TLS, telling the connector about a
 * close); a tiny TCP server on 127.0.0.1 plays the upstream: refusing,
 * answering garbage to the ClientHello, resetting, or just accepting. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "support/loopback.h"
#include "common/error.h"
#include "dns/stub.h"
#include "policy/policy.h"
#include "proxy/conn_internal.h"
#include "proxy/connector.h"
#include "proxy/options.h"
#include "tls/tlsconn.h"

/* What the upstream does with a connection. */
typedef enum {
  UP_ACCEPT,  /* accept and keep it */
  UP_GARBAGE, /* answer the ClientHello with bytes that are no TLS */
  UP_RESET,   /* reset it (SO_LINGER 0) when the ClientHello comes */
} upstream_mode_t;

typedef struct {
  uv_loop_t loop;
  ce_proxy_t proxy;
  ce_proxy_options_t opts;
  ce_policy_t *policy;
  ce_dns_stub_t *dns;
  side_t side;
  ce_connector_t k;
  int handles;            /* what the connector asked the owner to count */
  bool dead;
  int done;               /* times done ran */
  int status;
  char reason[400];
  int resolved;
  /* The upstream. */
  uv_tcp_t server;
  uv_tcp_t peer;
  bool peer_open;
  upstream_mode_t mode;
  uint16_t port;
  char buf[16384];
} fx_t;

static fx_t *fx_of_side(uv_handle_t *h) { return (fx_t *)((char *)h - offsetof(fx_t, side.tcp)); }

/* ---- the fake owner ------------------------------------------------------ */

static void hold(ce_connector_t *k) { ((fx_t *)k->owner)->handles++; }
static void release(ce_connector_t *k) { ((fx_t *)k->owner)->handles--; }
static bool alive(ce_connector_t *k) { return !((fx_t *)k->owner)->dead; }

static void side_closed(uv_handle_t *h) {
  fx_t *f = fx_of_side(h);
  f->side.closing = false;
  f->handles--;
  ce_connector_closed(&f->k);
}

static void close_side(fx_t *f) {
  if (!f->side.open)
    return;
  f->side.open = false;
  f->side.closing = true;
  uv_close((uv_handle_t *)&f->side.tcp, side_closed);
}

static void fake_close(ce_connector_t *k) { close_side(k->owner); }

static void on_written(uv_write_t *w, int status) {
  (void)status;
  free(w);
}

static void fake_flush(ce_connector_t *k) {
  fx_t *f = k->owner;
  size_t n;
  while (f->side.tls != NULL && f->side.open && (n = ce_tlsconn_pending_out(f->side.tls)) > 0) {
    uv_write_t *w = malloc(sizeof(*w) + n);
    cr_assert_not_null(w);
    char *data = (char *)(w + 1);
    n = ce_tlsconn_take_out(f->side.tls, (uint8_t *)data, n);
    uv_buf_t b = uv_buf_init(data, (unsigned)n);
    if (uv_write(w, (uv_stream_t *)&f->side.tcp, &b, 1, on_written) != 0)
      free(w);
  }
}

static void side_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  fx_t *f = fx_of_side(h);
  *buf = uv_buf_init(f->buf, sizeof(f->buf));
}

static void side_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  fx_t *f = fx_of_side((uv_handle_t *)st);
  if (nread == 0)
    return;
  if (nread < 0) {
    uv_read_stop(st);
    ce_connector_fail(&f->k, 502, "upstream_tls: the server closed during the handshake");
    return;
  }
  cr_assert_eq(ce_tlsconn_feed(f->side.tls, (const uint8_t *)buf->base, (size_t)nread), CE_OK);
  ce_connector_handshake(&f->k);
}

static void fake_reading(ce_connector_t *k) {
  fx_t *f = k->owner;
  uv_read_start((uv_stream_t *)&f->side.tcp, side_alloc, side_read);
}

static void fake_resolved(ce_connector_t *k) { ((fx_t *)k->owner)->resolved++; }

static void fake_done(ce_connector_t *k, int status, const char *reason) {
  fx_t *f = k->owner;
  f->done++;
  f->status = status;
  snprintf(f->reason, sizeof(f->reason), "%s", reason != NULL ? reason : "");
}

static const ce_connector_ops_t ops = {
    .hold = hold,
    .release = release,
    .alive = alive,
    .close = fake_close,
    .flush = fake_flush,
    .reading = fake_reading,
    .resolved = fake_resolved,
    .done = fake_done,
};

/* ---- the upstream -------------------------------------------------------- */

static void peer_closed(uv_handle_t *h) { (void)h; }

static void peer_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  fx_t *f = (fx_t *)((char *)h - offsetof(fx_t, peer));
  *buf = uv_buf_init(f->buf, sizeof(f->buf));
}

static void peer_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  fx_t *f = (fx_t *)((char *)st - offsetof(fx_t, peer));
  if (nread <= 0)
    return;
  if (f->mode == UP_RESET && f->peer_open) {
    f->peer_open = false;
    uv_tcp_close_reset(&f->peer, peer_closed);
    return;
  }
  if (f->mode == UP_GARBAGE) {
    static char junk[] = "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
    uv_write_t *w = malloc(sizeof(*w));
    cr_assert_not_null(w);
    uv_buf_t b = uv_buf_init(junk, sizeof(junk) - 1);
    uv_write(w, st, &b, 1, on_written);
  }
}

static void on_peer(uv_stream_t *server, int status) {
  fx_t *f = (fx_t *)((char *)server - offsetof(fx_t, server));
  cr_assert_eq(status, 0);
  uv_tcp_init(&f->loop, &f->peer);
  cr_assert_eq(uv_accept(server, (uv_stream_t *)&f->peer), 0);
  f->peer_open = true;
  uv_read_start((uv_stream_t *)&f->peer, peer_alloc, peer_read);
}

/* listening: false leaves the port closed (a refused connect). */
static void fixture(fx_t *f, bool listening, upstream_mode_t mode, const char *allow_private) {
  memset(f, 0, sizeof(*f));
  cr_assert_eq(uv_loop_init(&f->loop), 0);
  f->mode = mode;
  static const char policy[] = "{\"version\":1,\"default\":\"deny\",\"rules\":["
                               "{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"127.0.0.2\"]}]}";
  ce_policy_error_t err;
  cr_assert_eq(ce_policy_load_buffer(policy, strlen(policy), &f->policy, &err), 0, "%s", err.message);
  if (allow_private != NULL) {
    cr_assert_eq(ce_cidr_parse(allow_private, &f->opts.allow_private[0]), CE_OK);
    f->opts.allow_private_count = 1;
  }
  f->opts.mark = 0x2a;
  ce_dns_stub_opts_t dopts = {0};
  cr_assert_eq(ce_dns_stub_new(&f->loop, &dopts, &f->dns), CE_OK);
  f->proxy.loop = &f->loop;
  f->proxy.opts = &f->opts;
  f->proxy.policy = f->policy;
  f->proxy.dns = f->dns;
  f->proxy.client_ctx = SSL_CTX_new(TLS_client_method());
  cr_assert_not_null(f->proxy.client_ctx);
  f->side.name = "upstream";
  ce_connector_init(&f->k, &ops, f, &f->proxy, 1, &f->side);

  /* A port: bound, then listening or closed again (refused). */
  f->port = ce_test_bind_loopback(&f->loop, &f->server);
  if (listening)
    cr_assert_eq(uv_listen((uv_stream_t *)&f->server, 8, on_peer), 0);
  else
    uv_close((uv_handle_t *)&f->server, NULL);
}

static void run_until_done(fx_t *f) {
  for (int i = 0; i < 2000 && f->done == 0; i++)
    uv_run(&f->loop, UV_RUN_ONCE);
  cr_assert_eq(f->done, 1, "the attempt never ended");
}

static void fixture_free(fx_t *f) {
  close_side(f);
  if (f->peer_open)
    uv_close((uv_handle_t *)&f->peer, peer_closed);
  if (!uv_is_closing((uv_handle_t *)&f->server))
    uv_close((uv_handle_t *)&f->server, NULL);
  ce_dns_stub_close(f->dns);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  cr_assert_eq(f->handles, 0, "every handle and lookup the connector started was released");
  ce_connector_reset(&f->k);
  ce_tlsconn_free(f->side.tls);
  SSL_CTX_free(f->proxy.client_ctx);
  ce_policy_free(f->policy);
  cr_assert_eq(uv_loop_close(&f->loop), 0);
}

/* ---- tests --------------------------------------------------------------- */

Test(connector, a_private_address_the_policy_does_not_name_is_refused_before_any_connect) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f, true, UP_ACCEPT, NULL);
  cr_assert_eq(ce_connector_start(&f->k, "127.0.0.1", f->port, false, CE_ALPN_HTTP11), CE_OK);
  cr_assert_eq(f->k.state, CE_CONNECTOR_RESOLVING);
  run_until_done(f);
  cr_assert_eq(f->status, 403);
  cr_assert_str_eq(f->reason, "upstream_private_address: 127.0.0.1");
  cr_assert_eq(f->resolved, 0);
  cr_assert_not(f->side.open, "no socket was opened");
  fixture_free(f);
  free(f);
}

Test(connector, an_allowed_private_range_connects_plain_tcp) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f, true, UP_ACCEPT, "127.0.0.0/8");
  cr_assert_eq(ce_connector_start(&f->k, "127.0.0.1", f->port, false, CE_ALPN_HTTP11), CE_OK);
  run_until_done(f);
  cr_assert_eq(f->status, 0, "%s", f->reason);
  cr_assert_eq(f->k.state, CE_CONNECTOR_READY);
  cr_assert_eq(f->resolved, 1);
  cr_assert(f->side.connected);
  /* The socket carries the mark that lets it past the REDIRECT. */
  uv_os_fd_t fd;
  cr_assert_eq(uv_fileno((uv_handle_t *)&f->side.tcp, &fd), 0);
  unsigned mark = 0;
  socklen_t ml = sizeof(mark);
  cr_assert_eq(getsockopt(fd, SOL_SOCKET, SO_MARK, &mark, &ml), 0);
  cr_assert_eq(mark, 0x2a);
  fixture_free(f);
  free(f);
}

Test(connector, an_ip_literal_the_policy_allows_is_not_private_to_it) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f, false, UP_ACCEPT, NULL);
  struct sockaddr_in sa;
  uv_ip4_addr("127.0.0.2", 80, &sa);
  char why[200] = "";
  cr_assert(ce_connector_addr_ok(&f->proxy, (const struct sockaddr *)&sa, why, sizeof(why)));
  uv_ip4_addr("10.1.2.3", 80, &sa);
  cr_assert_not(ce_connector_addr_ok(&f->proxy, (const struct sockaddr *)&sa, why, sizeof(why)));
  cr_assert_str_eq(why, "upstream_private_address: 10.1.2.3");
  uv_ip4_addr("93.184.216.34", 80, &sa);
  cr_assert(ce_connector_addr_ok(&f->proxy, (const struct sockaddr *)&sa, why, sizeof(why)));
  fixture_free(f);
  free(f);
}

Test(connector, a_refused_connect_is_502_upstream_unreachable) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f, false, UP_ACCEPT, "127.0.0.0/8");
  cr_assert_eq(ce_connector_start(&f->k, "127.0.0.1", f->port, true, CE_ALPN_HTTP11), CE_OK);
  run_until_done(f);
  cr_assert_eq(f->status, 502);
  cr_assert_str_eq(f->reason, "upstream_unreachable: connection refused");
  cr_assert_eq(f->k.state, CE_CONNECTOR_FAILED);
  fixture_free(f);
  free(f);
}

Test(connector, a_server_that_speaks_no_tls_fails_the_handshake) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f, true, UP_GARBAGE, "127.0.0.0/8");
  cr_assert_eq(ce_connector_start(&f->k, "127.0.0.1", f->port, true, CE_ALPN_H2_HTTP11), CE_OK);
  run_until_done(f);
  cr_assert_eq(f->status, 502);
  cr_assert_eq(strncmp(f->reason, "upstream_tls: ", 14), 0, "%s", f->reason);
  cr_assert_not(f->side.handshaken);
  fixture_free(f);
  free(f);
}

Test(connector, a_reset_during_the_handshake_is_502) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f, true, UP_RESET, "127.0.0.0/8");
  cr_assert_eq(ce_connector_start(&f->k, "127.0.0.1", f->port, true, CE_ALPN_HTTP11), CE_OK);
  run_until_done(f);
  cr_assert_eq(f->status, 502);
  cr_assert_str_eq(f->reason, "upstream_tls: the server closed during the handshake");
  fixture_free(f);
  free(f);
}

Test(connector, a_reset_attempt_drops_its_late_lookup) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f, true, UP_ACCEPT, "127.0.0.0/8");
  cr_assert_eq(ce_connector_start(&f->k, "127.0.0.1", f->port, false, CE_ALPN_HTTP11), CE_OK);
  cr_assert_eq(f->handles, 1, "the lookup is counted");
  ce_connector_reset(&f->k); /* the owner's timer fired, say */
  for (int i = 0; i < 50 && f->handles > 0; i++)
    uv_run(&f->loop, UV_RUN_ONCE);
  cr_assert_eq(f->handles, 0, "the lookup came back and was released");
  cr_assert_eq(f->done, 0, "a dropped attempt says nothing");
  cr_assert_eq(f->k.state, CE_CONNECTOR_IDLE);
  fixture_free(f);
  free(f);
}

Test(connector, a_failure_the_owner_saw_ends_the_attempt_once) {
  fx_t *f = calloc(1, sizeof(*f));
  fixture(f, true, UP_ACCEPT, "127.0.0.0/8");
  cr_assert_eq(ce_connector_start(&f->k, "127.0.0.1", f->port, true, CE_ALPN_HTTP11), CE_OK);
  for (int i = 0; i < 200 && f->k.state != CE_CONNECTOR_HANDSHAKING; i++)
    uv_run(&f->loop, UV_RUN_ONCE);
  cr_assert_eq(f->k.state, CE_CONNECTOR_HANDSHAKING, "the upstream never answers the ClientHello");
  ce_connector_fail(&f->k, 504, "upstream_unreachable: connect timed out");
  ce_connector_fail(&f->k, 502, "again");
  cr_assert_eq(f->done, 1);
  cr_assert_eq(f->status, 504);
  fixture_free(f);
  free(f);
}
