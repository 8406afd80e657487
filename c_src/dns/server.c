#include "dns/server.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/jsonw.h"
#include "common/trace.h"
#include "dns/wire.h"
#include "proxy/event.h"
#include "proxy/netaddr.h"

typedef struct {
  bool used;
  uint8_t family;
  uint8_t addr[16];
  double tokens;
  uint64_t last_ms;
} bucket_t;

typedef struct tcpconn tcpconn_t;

/* One query waiting for the stub. */
typedef struct pending {
  ce_dns_server_t *srv;
  struct pending *next, *prev;
  size_t listener;              /* UDP: the socket that answers */
  struct sockaddr_storage peer; /* UDP: where to */
  tcpconn_t *tc;                /* TCP: the connection (referenced), or NULL for UDP */
  uint16_t id;
  uint16_t rd;
  ce_dns_question_t q;
  char client[CE_ADDR_TEXT_MAX];
} pending_t;

struct tcpconn {
  ce_dns_server_t *srv;
  tcpconn_t *next, *prev;
  uv_tcp_t h;
  int refs;                 /* the handle (until closed) and a pending query */
  bool closing;
  bool reading;
  uint64_t last_ms;
  struct sockaddr_storage peer;
  uint8_t in[2 + CE_DNS_SERVER_MAX_QUERY];
  size_t in_len;
};

typedef struct {
  uv_write_t req;
  size_t len;
  uint8_t data[];
} tcp_write_t;

struct ce_dns_server {
  uv_loop_t *loop;
  ce_dns_server_opts_t opts;
  uv_udp_t udp[CE_DNS_SERVER_MAX_LISTEN];
  uv_tcp_t tcp[CE_DNS_SERVER_MAX_LISTEN];
  size_t listeners;
  uv_timer_t sweep;
  int handles;              /* open handles of the server itself */
  tcpconn_t *conns;
  size_t conn_count;
  pending_t *pending;
  size_t pending_count;
  bool closing;
  bucket_t global;
  bucket_t sources[CE_DNS_SERVER_SOURCES];
  uint8_t rbuf[CE_DNS_SERVER_MAX_QUERY + 1];
  uint8_t obuf[CE_DNS_MAX_MSG];
  ce_dns_msg_t msg;
  ce_dns_server_stats_t stats;
};

static void server_maybe_free(ce_dns_server_t *srv) {
  if (srv->closing && srv->handles == 0 && srv->conns == NULL && srv->pending == NULL)
    free(srv);
}

/* ---- rate ------------------------------------------------------------------ */

static bool take_token(bucket_t *b, uint32_t rate, uint32_t burst, uint64_t now) {
  if (!b->used) {
    b->used = true;
    b->tokens = burst;
    b->last_ms = now;
  }
  double add = (double)(now - b->last_ms) * rate / 1000.0;
  b->tokens = b->tokens + add > burst ? burst : b->tokens + add;
  b->last_ms = now;
  if (b->tokens < 1.0)
    return false;
  b->tokens -= 1.0;
  return true;
}

/* The source's bucket: its own, else the least recently used one. */
static bucket_t *source_bucket(ce_dns_server_t *srv, const struct sockaddr *sa) {
  uint8_t family = sa->sa_family == AF_INET6 ? 6 : 4;
  uint8_t addr[16] = {0};
  if (family == 4)
    memcpy(addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
  else
    memcpy(addr, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
  bucket_t *lru = &srv->sources[0];
  for (size_t i = 0; i < CE_DNS_SERVER_SOURCES; i++) {
    bucket_t *b = &srv->sources[i];
    if (b->used && b->family == family && memcmp(b->addr, addr, 16) == 0)
      return b;
    if (!b->used || (lru->used && b->last_ms < lru->last_ms))
      lru = b;
  }
  memset(lru, 0, sizeof(*lru));
  lru->family = family;
  memcpy(lru->addr, addr, 16);
  return lru;
}

static bool rate_ok(ce_dns_server_t *srv, const struct sockaddr *sa) {
  uint64_t now = uv_now(srv->loop);
  const ce_dns_server_opts_t *o = &srv->opts;
  bucket_t *b = source_bucket(srv, sa);
  if (!take_token(b, o->source_rate, o->source_burst, now) || !take_token(&srv->global, o->rate, o->burst, now)) {
    srv->stats.rate_limited++;
    if ((srv->stats.rate_limited & (srv->stats.rate_limited - 1)) == 0) /* 1, 2, 4, 8...: no trace flood */
      CE_TRACE_W("dns", 0, 0, "query rate over the cap: %llu queries dropped so far",
                 (unsigned long long)srv->stats.rate_limited);
    return false;
  }
  return true;
}

/* ---- events ------------------------------------------------------------- */

typedef struct {
  const char *name;
  uint64_t id;
  const ce_dns_question_t *q;
  const char *client;
  const char *transport;
  int32_t rule;
  const char *kind;
  const char *reason;
  const char *rcode;
} dns_event_t;

#define KEY(w, lit) ce_jsonw_raw((w), lit, sizeof(lit) - 1)

static void write_time(ce_jsonw_t *w, int64_t us) {
  char buf[40];
  ce_format_time(us, buf, sizeof(buf));
  ce_jsonw_string(w, buf, strlen(buf));
}

/* The members of the request events (docs/control-channel.md) that a
 * query has, the HTTP ones null, plus "dns": the query's own fields
 * (docs/dns.md, "Events"). */
static void write_dns_event(ce_jsonw_t *w, const void *arg) {
  const dns_event_t *e = arg;
  char tbuf[16];
  const char *qtype = ce_dns_type_name(e->q->type, tbuf);
  int64_t now = ce_now_us();
  KEY(w, ",\"event\":");
  ce_jsonw_string(w, e->name, strlen(e->name));
  KEY(w, ",\"at\":");
  write_time(w, now);
  KEY(w, ",\"id\":\"");
  ce_jsonw_uint(w, e->id);
  KEY(w, "\",\"connection_id\":\"0\",\"scheme\":\"dns\",\"protocol\":\"dns\",\"method\":null,\"host\":");
  if (e->q->name_len > 0)
    ce_jsonw_string(w, e->q->name, e->q->name_len);
  else
    ce_jsonw_raw(w, "\".\"", 3);
  KEY(w, ",\"port\":53,\"path\":null,\"query\":null,\"http_version\":null,\"sni\":null,\"headers\":[],"
         "\"status\":null,\"response_headers\":null,\"bytes_in\":0,\"bytes_out\":0,\"opened_at\":");
  write_time(w, now);
  KEY(w, ",\"responded_at\":null,\"closed_at\":null,\"matched_rule\":");
  if (e->rule >= 0) {
    KEY(w, "{\"index\":");
    ce_jsonw_int(w, e->rule);
    KEY(w, ",\"kind\":");
    ce_jsonw_string(w, e->kind, strlen(e->kind));
    ce_jsonw_raw(w, "}", 1);
  } else {
    ce_jsonw_raw(w, "null", 4);
  }
  KEY(w, ",\"reason\":");
  ce_jsonw_string(w, e->reason, strlen(e->reason));
  KEY(w, ",\"dns\":{\"qname\":");
  ce_jsonw_string(w, e->q->name, e->q->name_len);
  KEY(w, ",\"qtype\":");
  ce_jsonw_string(w, qtype, strlen(qtype));
  KEY(w, ",\"rcode\":");
  ce_jsonw_string(w, e->rcode, strlen(e->rcode));
  KEY(w, ",\"transport\":");
  ce_jsonw_string(w, e->transport, strlen(e->transport));
  KEY(w, ",\"client\":");
  ce_jsonw_string(w, e->client, strlen(e->client));
  ce_jsonw_raw(w, "}", 1);
}

static void emit(ce_dns_server_t *srv, const char *name, const ce_dns_question_t *q, const char *client,
                 bool tcp, const ce_verdict_t *v, const char *reason, const char *rcode) {
  if (srv->opts.control == NULL)
    return;
  dns_event_t e = {
      .name = name,
      .id = ++*srv->opts.next_id,
      .q = q,
      .client = client,
      .transport = tcp ? "tcp" : "udp",
      .rule = v != NULL ? v->rule_index : -1,
      .kind = v != NULL ? ce_rule_kind_name(v->rule_kind) : "deny",
      .reason = reason,
      .rcode = rcode,
  };
  ce_control_emit_with(srv->opts.control, write_dns_event, &e);
}

/* ---- answering ----------------------------------------------------------- */

static void tcp_release(tcpconn_t *tc);
static void tcp_resume(tcpconn_t *tc);

static void tcp_written(uv_write_t *req, int status) {
  (void)status;
  free(req->data);
}

/* Sends an answer built in srv->obuf (UDP: at most 512 bytes, else
 * rebuilt with TC by the caller). */
static void send_answer(ce_dns_server_t *srv, size_t listener, const struct sockaddr *peer, tcpconn_t *tc,
                        size_t len) {
  if (tc == NULL) {
    uv_buf_t b = uv_buf_init((char *)srv->obuf, (unsigned)len);
    /* A full socket buffer drops the answer: the client asks again. */
    (void)uv_udp_try_send(&srv->udp[listener], &b, 1, peer);
    return;
  }
  if (tc->closing)
    return;
  tcp_write_t *wr = malloc(sizeof(*wr) + 2 + len);
  if (wr == NULL)
    return;
  wr->req.data = wr;
  wr->len = 2 + len;
  wr->data[0] = (uint8_t)(len >> 8);
  wr->data[1] = (uint8_t)len;
  memcpy(wr->data + 2, srv->obuf, len);
  uv_buf_t b = uv_buf_init((char *)wr->data, (unsigned)wr->len);
  if (uv_write(&wr->req, (uv_stream_t *)&tc->h, &b, 1, tcp_written) != 0)
    free(wr);
}

/* Builds and sends an answer with the given rcode and records. */
static void answer(ce_dns_server_t *srv, size_t listener, const struct sockaddr *peer, tcpconn_t *tc, uint16_t id,
                   uint16_t rd, const ce_dns_question_t *q, unsigned rcode, const ce_dns_rr_t *rrs, size_t count) {
  size_t cap = tc != NULL ? CE_DNS_MAX_MSG : CE_DNS_SERVER_UDP_ANSWER;
  size_t len = 0;
  uint16_t flags = (uint16_t)(CE_DNS_FLAG_RA | rd | (rcode & 0xfu));
  if (ce_dns_build_response(srv->obuf, cap, id, flags, q, rrs, count, &len) != CE_OK &&
      ce_dns_build_response(srv->obuf, cap, id, (uint16_t)(CE_DNS_FLAG_RA | rd | CE_DNS_RCODE_SERVFAIL), NULL,
                            NULL, 0, &len) != CE_OK)
    return;
  send_answer(srv, listener, peer, tc, len);
}

static void pending_free(pending_t *pd) {
  ce_dns_server_t *srv = pd->srv;
  if (pd->prev != NULL)
    pd->prev->next = pd->next;
  else
    srv->pending = pd->next;
  if (pd->next != NULL)
    pd->next->prev = pd->prev;
  srv->pending_count--;
  tcpconn_t *tc = pd->tc;
  free(pd);
  if (tc != NULL) {
    tcp_resume(tc);
    tcp_release(tc);
  }
  server_maybe_free(srv);
}

static void on_resolved(void *data, int status, const ce_dns_result_t *res) {
  pending_t *pd = data;
  ce_dns_server_t *srv = pd->srv;
  if (status == CE_OK) {
    srv->stats.resolved++;
    answer(srv, pd->listener, (const struct sockaddr *)&pd->peer, pd->tc, pd->id, pd->rd, &pd->q, res->rcode,
           res->rrs, res->count);
  } else if (status != CE_ECLOSED) {
    CE_TRACE_D("dns", 0, 0, "%s: upstream: %s; SERVFAIL", pd->q.name, ce_strerror(status));
    answer(srv, pd->listener, (const struct sockaddr *)&pd->peer, pd->tc, pd->id, pd->rd, &pd->q,
           CE_DNS_RCODE_SERVFAIL, NULL, 0);
  }
  pending_free(pd);
}

/* One query from the workspace, in buf[0..len). tc is the TCP connection
 * or NULL for UDP (listener and peer say where to answer). Returns true
 * when an upstream query now runs for it (TCP: the connection waits). */
static bool handle_query(ce_dns_server_t *srv, size_t listener, const struct sockaddr *peer, tcpconn_t *tc,
                         const uint8_t *buf, size_t len) {
  ce_dns_msg_t *m = &srv->msg;
  bool tcp = tc != NULL;
  if (!rate_ok(srv, peer)) {
    /* UDP: dropped (an answer would be a reflection); TCP: REFUSED. */
    if (tcp && len >= CE_DNS_HEADER_LEN)
      answer(srv, listener, peer, tc, (uint16_t)((buf[0] << 8) | buf[1]), 0, NULL, CE_DNS_RCODE_REFUSED, NULL, 0);
    return false;
  }
  int rc = ce_dns_parse(buf, len, m);
  if (rc != CE_OK || (m->flags & CE_DNS_FLAG_QR)) {
    srv->stats.malformed++;
    if (len >= CE_DNS_HEADER_LEN && !(buf[2] & 0x80))
      answer(srv, listener, peer, tc, (uint16_t)((buf[0] << 8) | buf[1]), 0, NULL, CE_DNS_RCODE_FORMERR, NULL, 0);
    return false;
  }
  uint16_t rd = m->flags & CE_DNS_FLAG_RD;
  if (CE_DNS_OPCODE(m->flags) != 0) {
    answer(srv, listener, peer, tc, m->id, rd, m->has_question ? &m->q : NULL, CE_DNS_RCODE_NOTIMP, NULL, 0);
    return false;
  }
  if (!m->has_question || m->ancount != 0) {
    srv->stats.malformed++;
    answer(srv, listener, peer, tc, m->id, rd, NULL, CE_DNS_RCODE_FORMERR, NULL, 0);
    return false;
  }
  srv->stats.queries++;
  ce_dns_question_t q = m->q;
  char client[CE_ADDR_TEXT_MAX];
  ce_addr_text(peer, client);
  if (q.cls != CE_DNS_CLASS_IN) {
    answer(srv, listener, peer, tc, m->id, rd, &q, CE_DNS_RCODE_REFUSED, NULL, 0);
    return false;
  }
  if (q.type == CE_DNS_TYPE_ANY) {
    answer(srv, listener, peer, tc, m->id, rd, &q, CE_DNS_RCODE_NOTIMP, NULL, 0);
    return false;
  }
  ce_verdict_t v;
  ce_decision_t d = ce_policy_could_allow(srv->opts.policy, q.name, q.name_len, &v);
  char tbuf[16];
  const char *qtype = ce_dns_type_name(q.type, tbuf);
  if (d == CE_DECISION_DENY) {
    srv->stats.denied++;
    char reason[64];
    const char *why = ce_reason_name(v.reason);
    snprintf(reason, sizeof(reason), "dns: %s", why != NULL ? why : "default_deny");
    CE_TRACE_D("dns", 0, 0, "%s %s from %s: %s; NXDOMAIN", q.name, qtype, client, reason);
    emit(srv, "request_denied", &q, client, tcp, v.rule_index >= 0 ? &v : NULL, reason, "NXDOMAIN");
    answer(srv, listener, peer, tc, m->id, rd, &q, CE_DNS_RCODE_NXDOMAIN, NULL, 0);
    return false;
  }
  bool address = q.type == CE_DNS_TYPE_A || q.type == CE_DNS_TYPE_AAAA || q.type == CE_DNS_TYPE_CNAME;
  if (q.type == CE_DNS_TYPE_HTTPS || q.type == CE_DNS_TYPE_SVCB) {
    /* No record: clients go on with A and AAAA (RFC 9460 §3). */
    answer(srv, listener, peer, tc, m->id, rd, &q, CE_DNS_RCODE_NOERROR, NULL, 0);
    return false;
  }
  if (!address) {
    char reason[64];
    snprintf(reason, sizeof(reason), "dns: query type %s not served", qtype);
    srv->stats.denied++;
    emit(srv, "request_denied", &q, client, tcp, v.rule_index >= 0 ? &v : NULL, reason, "REFUSED");
    answer(srv, listener, peer, tc, m->id, rd, &q, CE_DNS_RCODE_REFUSED, NULL, 0);
    return false;
  }
  if (d == CE_DECISION_DECIDE) {
    /* Nothing leaves the pod for a name only a decider may allow: the
     * synthetic address brings the HTTP request to the proxy, where the
     * decider sees it whole. */
    srv->stats.deferred++;
    ce_dns_rr_t rr;
    memset(&rr, 0, sizeof(rr));
    size_t n = 0;
    if (q.type == CE_DNS_TYPE_A) {
      memcpy(rr.name, q.name, q.name_len + 1);
      rr.name_len = q.name_len;
      rr.type = CE_DNS_TYPE_A;
      rr.ttl = CE_DNS_DEFERRED_TTL;
      inet_pton(AF_INET, CE_DNS_DEFERRED_V4, rr.addr);
      n = 1;
    }
    emit(srv, "request_allowed", &q, client, tcp, &v, "dns: deferred to the decider", "NOERROR");
    answer(srv, listener, peer, tc, m->id, rd, &q, CE_DNS_RCODE_NOERROR, &rr, n);
    return false;
  }
  if (srv->pending_count >= CE_DNS_SERVER_MAX_PENDING) {
    answer(srv, listener, peer, tc, m->id, rd, &q, CE_DNS_RCODE_SERVFAIL, NULL, 0);
    return false;
  }
  pending_t *pd = calloc(1, sizeof(*pd));
  if (pd == NULL) {
    answer(srv, listener, peer, tc, m->id, rd, &q, CE_DNS_RCODE_SERVFAIL, NULL, 0);
    return false;
  }
  pd->srv = srv;
  pd->listener = listener;
  memcpy(&pd->peer, peer, peer->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
  pd->id = m->id;
  pd->rd = rd;
  pd->q = q;
  memcpy(pd->client, client, sizeof(client));
  if (ce_dns_stub_query(srv->opts.stub, q.name, q.name_len, q.type, on_resolved, pd) != CE_OK) {
    free(pd);
    answer(srv, listener, peer, tc, m->id, rd, &q, CE_DNS_RCODE_SERVFAIL, NULL, 0);
    return false;
  }
  pd->tc = tc;
  if (tc != NULL)
    tc->refs++;
  pd->next = srv->pending;
  if (srv->pending != NULL)
    srv->pending->prev = pd;
  srv->pending = pd;
  srv->pending_count++;
  return true;
}

/* ---- UDP ------------------------------------------------------------------- */

static void udp_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  ce_dns_server_t *srv = h->data;
  buf->base = (char *)srv->rbuf;
  buf->len = sizeof(srv->rbuf);
}

static void udp_read(uv_udp_t *u, ssize_t nread, const uv_buf_t *buf, const struct sockaddr *addr,
                     unsigned flags) {
  ce_dns_server_t *srv = u->data;
  if (nread <= 0 || addr == NULL || srv->closing)
    return;
  /* A query larger than the cap (or cut by the buffer) is dropped. */
  if ((flags & UV_UDP_PARTIAL) || (size_t)nread > CE_DNS_SERVER_MAX_QUERY) {
    srv->stats.malformed++;
    return;
  }
  size_t listener = (size_t)(u - srv->udp);
  handle_query(srv, listener, addr, NULL, (const uint8_t *)buf->base, (size_t)nread);
}

/* ---- TCP ------------------------------------------------------------------- */

static void tcp_closed(uv_handle_t *h) {
  tcp_release(h->data);
}

static void tcp_release(tcpconn_t *tc) {
  if (--tc->refs > 0)
    return;
  ce_dns_server_t *srv = tc->srv;
  if (tc->prev != NULL)
    tc->prev->next = tc->next;
  else
    srv->conns = tc->next;
  if (tc->next != NULL)
    tc->next->prev = tc->prev;
  srv->conn_count--;
  free(tc);
  server_maybe_free(srv);
}

static void tcp_close(tcpconn_t *tc) {
  if (tc->closing)
    return;
  tc->closing = true;
  uv_close((uv_handle_t *)&tc->h, tcp_closed);
}

static void tcp_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  tcpconn_t *tc = h->data;
  buf->base = (char *)tc->in + tc->in_len;
  buf->len = sizeof(tc->in) - tc->in_len;
}

static void tcp_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* Serves the queries buffered on tc, one at a time. */
static void tcp_process(tcpconn_t *tc) {
  ce_dns_server_t *srv = tc->srv;
  while (!tc->closing && tc->in_len >= 2) {
    size_t want = ((size_t)tc->in[0] << 8) | tc->in[1];
    if (want == 0 || want > CE_DNS_SERVER_MAX_QUERY) {
      srv->stats.malformed++;
      tcp_close(tc);
      return;
    }
    if (tc->in_len < 2 + want)
      return;
    uint8_t q[CE_DNS_SERVER_MAX_QUERY];
    memcpy(q, tc->in + 2, want);
    memmove(tc->in, tc->in + 2 + want, tc->in_len - 2 - want);
    tc->in_len -= 2 + want;
    tc->last_ms = uv_now(srv->loop);
    if (handle_query(srv, 0, (const struct sockaddr *)&tc->peer, tc, q, want)) {
      /* One query at a time: reading waits for its answer. */
      if (tc->reading) {
        uv_read_stop((uv_stream_t *)&tc->h);
        tc->reading = false;
      }
      return;
    }
  }
}

static void tcp_resume(tcpconn_t *tc) {
  if (tc->closing || tc->reading)
    return;
  tc->last_ms = uv_now(tc->srv->loop);
  if (uv_read_start((uv_stream_t *)&tc->h, tcp_alloc, tcp_read) != 0) {
    tcp_close(tc);
    return;
  }
  tc->reading = true;
  tcp_process(tc);
}

static void tcp_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  tcpconn_t *tc = st->data;
  if (nread == 0)
    return;
  if (nread < 0) {
    tcp_close(tc);
    return;
  }
  tc->in_len += (size_t)nread;
  tcp_process(tc);
}

static void on_tcp_connection(uv_stream_t *listener, int status) {
  ce_dns_server_t *srv = listener->data;
  if (status < 0 || srv->closing)
    return;
  tcpconn_t *tc = calloc(1, sizeof(*tc));
  if (tc == NULL)
    return;
  tc->srv = srv;
  uv_tcp_init(srv->loop, &tc->h);
  tc->h.data = tc;
  tc->refs = 1;
  tc->next = srv->conns;
  if (srv->conns != NULL)
    srv->conns->prev = tc;
  srv->conns = tc;
  srv->conn_count++;
  if (uv_accept(listener, (uv_stream_t *)&tc->h) != 0) {
    tcp_close(tc);
    return;
  }
  int alen = sizeof(tc->peer);
  if (srv->conn_count > CE_DNS_SERVER_MAX_TCP ||
      uv_tcp_getpeername(&tc->h, (struct sockaddr *)&tc->peer, &alen) != 0) {
    tcp_close(tc);
    return;
  }
  tcp_resume(tc);
}

/* Closes TCP connections idle past CE_DNS_SERVER_TCP_IDLE_MS. */
static void on_sweep(uv_timer_t *t) {
  ce_dns_server_t *srv = t->data;
  uint64_t now = uv_now(srv->loop);
  for (tcpconn_t *tc = srv->conns; tc != NULL; tc = tc->next)
    if (tc->reading && now - tc->last_ms >= CE_DNS_SERVER_TCP_IDLE_MS)
      tcp_close(tc);
}

/* ---- the server -------------------------------------------------------------- */

static void handle_closed(uv_handle_t *h) {
  ce_dns_server_t *srv = h->data;
  srv->handles--;
  server_maybe_free(srv);
}

static void close_handle(ce_dns_server_t *srv, uv_handle_t *h) {
  if (!uv_is_closing(h))
    uv_close(h, handle_closed);
  (void)srv;
}

int ce_dns_server_start(uv_loop_t *loop, const ce_dns_server_opts_t *opts, ce_dns_server_t **out, char *err,
                        size_t err_cap) {
  if (opts->listen_count > CE_DNS_SERVER_MAX_LISTEN || opts->next_id == NULL) {
    snprintf(err, err_cap, "too many DNS listen addresses");
    return CE_EINVAL;
  }
  struct sockaddr_storage addrs[CE_DNS_SERVER_MAX_LISTEN];
  for (size_t i = 0; i < opts->listen_count; i++) {
    if (ce_addr_parse(opts->listen[i], &addrs[i]) != CE_OK) {
      snprintf(err, err_cap, "--dns-listen expects ADDRESS:PORT (IPv6 in brackets), got '%s'", opts->listen[i]);
      return CE_EINVAL;
    }
  }
  ce_dns_server_t *srv = calloc(1, sizeof(*srv));
  if (srv == NULL)
    return CE_ENOMEM;
  srv->loop = loop;
  srv->opts = *opts;
  if (srv->opts.rate == 0)
    srv->opts.rate = CE_DNS_SERVER_RATE;
  if (srv->opts.burst == 0)
    srv->opts.burst = CE_DNS_SERVER_BURST;
  if (srv->opts.source_rate == 0)
    srv->opts.source_rate = CE_DNS_SERVER_SOURCE_RATE;
  if (srv->opts.source_burst == 0)
    srv->opts.source_burst = CE_DNS_SERVER_SOURCE_BURST;
  uv_timer_init(loop, &srv->sweep);
  srv->sweep.data = srv;
  srv->handles++;
  uv_timer_start(&srv->sweep, on_sweep, 1000, 1000);
  uv_unref((uv_handle_t *)&srv->sweep);
  int rc = CE_OK;
  for (size_t i = 0; i < opts->listen_count && rc == CE_OK; i++) {
    const struct sockaddr *sa = (const struct sockaddr *)&addrs[i];
    bool v6 = sa->sa_family == AF_INET6;
    uv_udp_init(loop, &srv->udp[i]);
    srv->udp[i].data = srv;
    srv->handles++;
    uv_tcp_init(loop, &srv->tcp[i]);
    srv->tcp[i].data = srv;
    srv->handles++;
    srv->listeners++;
    int r = uv_udp_bind(&srv->udp[i], sa, v6 ? UV_UDP_IPV6ONLY : 0);
    if (r == 0)
      r = uv_udp_recv_start(&srv->udp[i], udp_alloc, udp_read);
    /* Port 0 (tests): TCP takes the port the kernel gave UDP. */
    struct sockaddr_storage bound;
    int blen = sizeof(bound);
    if (r == 0)
      r = uv_udp_getsockname(&srv->udp[i], (struct sockaddr *)&bound, &blen);
    if (r == 0)
      r = uv_tcp_bind(&srv->tcp[i], (const struct sockaddr *)&bound, v6 ? UV_TCP_IPV6ONLY : 0);
    if (r == 0)
      r = uv_listen((uv_stream_t *)&srv->tcp[i], 64, on_tcp_connection);
    if (r != 0) {
      snprintf(err, err_cap, "cannot listen for DNS on %s: %s", opts->listen[i], uv_strerror(r));
      rc = CE_EIO;
    }
  }
  if (rc != CE_OK) {
    ce_dns_server_close(srv);
    return rc;
  }
  *out = srv;
  return CE_OK;
}

void ce_dns_server_close(ce_dns_server_t *srv) {
  if (srv == NULL || srv->closing)
    return;
  srv->closing = true;
  close_handle(srv, (uv_handle_t *)&srv->sweep);
  for (size_t i = 0; i < srv->listeners; i++) {
    close_handle(srv, (uv_handle_t *)&srv->udp[i]);
    close_handle(srv, (uv_handle_t *)&srv->tcp[i]);
  }
  for (tcpconn_t *tc = srv->conns; tc != NULL; tc = tc->next)
    tcp_close(tc);
  /* Pending queries end when the stub answers or is closed. */
}

int ce_dns_server_address(const ce_dns_server_t *srv, size_t i, struct sockaddr_storage *out) {
  if (i >= srv->listeners)
    return CE_EINVAL;
  int len = sizeof(*out);
  return uv_udp_getsockname(&srv->udp[i], (struct sockaddr *)out, &len) == 0 ? CE_OK : CE_EINVAL;
}

void ce_dns_server_stats(const ce_dns_server_t *srv, ce_dns_server_stats_t *out) {
  *out = srv->stats;
}
