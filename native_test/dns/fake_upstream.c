#include "dns/fake_upstream.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "dns/wire.h"

static void set_rr(ce_dns_rr_t *rr, const char *name, uint16_t type) {
  memset(rr, 0, sizeof(*rr));
  snprintf(rr->name, sizeof(rr->name), "%s", name);
  rr->name_len = strlen(rr->name);
  rr->type = type;
  rr->ttl = 60;
}

/* The answer to m in f->out; returns its length. */
static size_t build(fake_upstream_t *f, const ce_dns_msg_t *m, bool tcp, int nth) {
  ce_dns_rr_t rrs[16];
  size_t n = 0;
  unsigned rcode = CE_DNS_RCODE_NOERROR;
  uint16_t flags = CE_DNS_FLAG_RA | CE_DNS_FLAG_RD;
  uint16_t id = m->id;
  ce_dns_question_t q = m->q;
  if (f->mode == FAKE_SERVFAIL)
    rcode = CE_DNS_RCODE_SERVFAIL;
  if (f->mode == FAKE_TRUNCATE && !tcp)
    flags |= CE_DNS_FLAG_TC;
  if (f->mode == FAKE_FORGED_FIRST) {
    if (nth == 0)
      id = (uint16_t)(id + 1);
    if (nth == 1)
      snprintf(q.name, sizeof(q.name), "forged.test"), q.name_len = 11;
    if (nth == 2)
      q.type = q.type == CE_DNS_TYPE_A ? CE_DNS_TYPE_AAAA : CE_DNS_TYPE_A;
  }
  bool answer = rcode == CE_DNS_RCODE_NOERROR && !(flags & CE_DNS_FLAG_TC);
  const char *owner = m->q.name;
  if (answer && strcmp(m->q.name, "nx.test") == 0) {
    rcode = CE_DNS_RCODE_NXDOMAIN;
    answer = false;
  }
  if (answer && strcmp(m->q.name, "empty.test") == 0)
    answer = false;
  if (answer && strcmp(m->q.name, "cname.test") == 0) {
    set_rr(&rrs[n], "cname.test", CE_DNS_TYPE_CNAME);
    snprintf(rrs[n].target, sizeof(rrs[n].target), "target.test");
    rrs[n].target_len = 11;
    n++;
    owner = "target.test";
    /* A record for a name off the chain: ignored by the stub. */
    set_rr(&rrs[n], "elsewhere.test", CE_DNS_TYPE_A);
    memcpy(rrs[n].addr, "\x0a\x00\x00\x09", 4);
    n++;
  }
  if (answer && strcmp(m->q.name, "loop.test") == 0) {
    set_rr(&rrs[n], "loop.test", CE_DNS_TYPE_CNAME);
    snprintf(rrs[n].target, sizeof(rrs[n].target), "loop.test");
    rrs[n].target_len = 9;
    n++;
    answer = false;
  }
  if (answer && strcmp(m->q.name, "long.test") == 0) {
    for (int i = 0; i < 12; i++) {
      char from[32], to[32];
      snprintf(from, sizeof(from), i == 0 ? "long.test" : "l%d.test", i);
      snprintf(to, sizeof(to), "l%d.test", i + 1);
      set_rr(&rrs[n], from, CE_DNS_TYPE_CNAME);
      snprintf(rrs[n].target, sizeof(rrs[n].target), "%s", to);
      rrs[n].target_len = strlen(to);
      n++;
    }
    answer = false;
  }
  if (answer && m->q.type == CE_DNS_TYPE_A) {
    set_rr(&rrs[n], owner, CE_DNS_TYPE_A);
    memcpy(rrs[n].addr, "\xc0\x00\x02\x01", 4);
    n++;
  } else if (answer && m->q.type == CE_DNS_TYPE_AAAA) {
    set_rr(&rrs[n], owner, CE_DNS_TYPE_AAAA);
    memcpy(rrs[n].addr, "\x20\x01\x0d\xb8\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01", 16);
    n++;
  }
  size_t len = 0;
  cr_assert_eq(ce_dns_build_response(f->out, sizeof(f->out), id, (uint16_t)(flags | rcode), &q, rrs, n, &len), CE_OK);
  return len;
}

static void on_alloc(uv_handle_t *h, size_t s, uv_buf_t *b) {
  (void)s;
  fake_upstream_t *f = h->data;
  b->base = (char *)f->in + f->in_len;
  b->len = sizeof(f->in) - f->in_len;
}

static void udp_read(uv_udp_t *u, ssize_t n, const uv_buf_t *b, const struct sockaddr *from, unsigned flags) {
  (void)flags;
  fake_upstream_t *f = u->data;
  if (n <= 0 || from == NULL)
    return;
  ce_dns_msg_t m;
  if (ce_dns_parse((const uint8_t *)b->base, (size_t)n, &m) != CE_OK || !m.has_question)
    return;
  snprintf(f->last_name, sizeof(f->last_name), "%s", m.q.name);
  f->udp_queries++;
  if (f->mode == FAKE_SILENT)
    return;
  int sends = f->mode == FAKE_FORGED_FIRST ? 4 : 1;
  for (int i = 0; i < sends; i++) {
    size_t len = build(f, &m, false, i);
    uv_buf_t out = uv_buf_init((char *)f->out, (unsigned)len);
    cr_assert_geq(uv_udp_try_send(u, &out, 1, from), 0);
  }
}

static void conn_closed(uv_handle_t *h) {
  fake_upstream_t *f = h->data;
  f->conn_open = false;
}

static void tcp_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
  (void)b;
  fake_upstream_t *f = st->data;
  if (n < 0) {
    if (!uv_is_closing((uv_handle_t *)&f->conn))
      uv_close((uv_handle_t *)&f->conn, conn_closed);
    return;
  }
  f->in_len += (size_t)n;
  if (f->in_len < 2)
    return;
  size_t want = ((size_t)f->in[0] << 8) | f->in[1];
  if (f->in_len < 2 + want)
    return;
  ce_dns_msg_t m;
  cr_assert_eq(ce_dns_parse(f->in + 2, want, &m), CE_OK);
  f->tcp_queries++;
  f->in_len = 0;
  size_t len = build(f, &m, true, 3);
  static uint8_t framed[4096 + 2];
  framed[0] = (uint8_t)(len >> 8);
  framed[1] = (uint8_t)len;
  memcpy(framed + 2, f->out, len);
  uv_buf_t out = uv_buf_init((char *)framed, (unsigned)(len + 2));
  cr_assert_eq(uv_try_write(st, &out, 1), (int)(len + 2));
}

static void on_conn(uv_stream_t *l, int status) {
  fake_upstream_t *f = l->data;
  cr_assert_eq(status, 0);
  cr_assert_not(f->conn_open, "one TCP connection at a time");
  uv_tcp_init(l->loop, &f->conn);
  f->conn.data = f;
  f->conn_open = true;
  f->in_len = 0;
  cr_assert_eq(uv_accept(l, (uv_stream_t *)&f->conn), 0);
  uv_read_start((uv_stream_t *)&f->conn, on_alloc, tcp_read);
}

static void udp_alloc(uv_handle_t *h, size_t s, uv_buf_t *b) {
  (void)s;
  fake_upstream_t *f = h->data;
  b->base = (char *)f->out;
  b->len = sizeof(f->out);
}

/* UDP gets a free port from the kernel; TCP may find it taken (another
 * test running at the same time): then both go and it tries again. */
void fake_start(uv_loop_t *loop, fake_upstream_t *f, fake_mode_t mode) {
  memset(f, 0, sizeof(*f));
  f->mode = mode;
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", 0, &a);
  for (int tries = 0;; tries++) {
    cr_assert_lt(tries, 20, "no port free for both UDP and TCP");
    cr_assert_eq(uv_udp_init(loop, &f->udp), 0);
    f->udp.data = f;
    cr_assert_eq(uv_udp_bind(&f->udp, (struct sockaddr *)&a, 0), 0);
    int len = sizeof(f->addr);
    cr_assert_eq(uv_udp_getsockname(&f->udp, (struct sockaddr *)&f->addr, &len), 0);
    cr_assert_eq(uv_tcp_init(loop, &f->tcp), 0);
    f->tcp.data = f;
    if (uv_tcp_bind(&f->tcp, (struct sockaddr *)&f->addr, 0) == 0 &&
        uv_listen((uv_stream_t *)&f->tcp, 8, on_conn) == 0)
      break;
    uv_close((uv_handle_t *)&f->udp, NULL);
    uv_close((uv_handle_t *)&f->tcp, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
  }
  cr_assert_eq(uv_udp_recv_start(&f->udp, udp_alloc, udp_read), 0);
}

void fake_stop(fake_upstream_t *f) {
  uv_close((uv_handle_t *)&f->udp, NULL);
  uv_close((uv_handle_t *)&f->tcp, NULL);
  if (f->conn_open && !uv_is_closing((uv_handle_t *)&f->conn))
    uv_close((uv_handle_t *)&f->conn, conn_closed);
}
