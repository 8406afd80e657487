#include "dns/stub.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/trace.h"
#include "proxy/netaddr.h"

/* The query as sent: header, a name of at most 255 bytes, type, class,
 * the OPT record. */
#define QUERY_MAX (CE_DNS_HEADER_LEN + CE_DNS_NAME_WIRE_MAX + 4 + 11)
/* A UDP answer larger than the payload size announced is not read whole:
 * the receive buffer is the largest datagram. */
#define UDP_BUF 65536u

typedef struct query query_t;

/* One attempt's transport: a UDP socket, or a TCP connection after a
 * truncated answer. It frees itself in its close callback; the query
 * detaches from it (x->q = NULL) when it moves on, after which its
 * callbacks do nothing. */
typedef struct xport {
  ce_dns_stub_t *s;
  query_t *q;
  struct xport *next, *prev;
  bool tcp;
  bool closing;
  union {
    uv_udp_t udp;
    uv_tcp_t tcp;
    uv_handle_t handle;
  } h;
  uv_udp_send_t sreq;
  uv_connect_t creq;
  uv_write_t wreq;
  uint8_t out[2 + QUERY_MAX];
  uint8_t *in;      /* TCP: 2 + CE_DNS_MAX_MSG bytes, allocated on the first read */
  size_t in_len;
} xport_t;

struct query {
  ce_dns_stub_t *s;
  query_t *next, *prev;
  ce_dns_query_cb cb;
  void *data;
  char name[CE_DNS_NAME_MAX + 1];
  size_t name_len;
  uint16_t qtype;
  uint16_t id;
  uint8_t pkt[QUERY_MAX];
  size_t pkt_len;
  unsigned attempt;  /* attempts started */
  int last_status;   /* what the query ends with if nothing better comes */
  uint64_t deadline; /* uv_now() ms */
  uv_timer_t timer;
  bool timer_closing;
  bool done;
  bool immediate;    /* result ready (hosts table, no upstream): delivered by the timer */
  int immediate_status;
  xport_t *x;
  ce_dns_result_t result;
};

typedef struct literal literal_t;

struct ce_dns_stub {
  uv_loop_t *loop;
  ce_dns_stub_opts_t opts;
  query_t *queries;
  literal_t *literals;
  xport_t *xports;
  size_t inflight;
  bool closing;
  uint8_t *udp_buf;  /* UDP_BUF bytes: every datagram is read into it and parsed at once */
  ce_dns_msg_t *msg; /* parse scratch */
};

static void query_next(query_t *q);
static void query_finish(query_t *q, int status);
static void tcp_connect(xport_t *x);

/* ---- helpers ------------------------------------------------------------- */

/* A closed stub goes once its last handle closed. */
static void stub_maybe_free(ce_dns_stub_t *s) {
  if (s->closing && s->queries == NULL && s->xports == NULL && s->literals == NULL) {
    free(s->udp_buf);
    free(s->msg);
    free(s);
  }
}

static uint16_t random_id(void) {
  uint16_t id = 0;
  if (RAND_bytes((unsigned char *)&id, sizeof(id)) != 1) {
    /* OpenSSL's generator failing is not expected; a fixed id would still
     * be checked against the question and the source address. */
    id = (uint16_t)(uv_hrtime() ^ (uint64_t)getpid());
  }
  return id;
}

static const struct sockaddr_storage *upstream_of(const query_t *q) {
  const ce_dns_stub_opts_t *o = &q->s->opts;
  return &o->upstreams[(q->attempt - 1) % o->upstream_count];
}

/* ---- transports ----------------------------------------------------------- */

static void xport_closed(uv_handle_t *h) {
  xport_t *x = h->data;
  ce_dns_stub_t *s = x->s;
  if (x->prev != NULL)
    x->prev->next = x->next;
  else
    s->xports = x->next;
  if (x->next != NULL)
    x->next->prev = x->prev;
  free(x->in);
  free(x);
  stub_maybe_free(s);
}

static void xport_close(xport_t *x) {
  if (x->closing)
    return;
  x->closing = true;
  x->q = NULL;
  uv_close(&x->h.handle, xport_closed);
}

/* Detaches the query's transport (its late answers are ignored). */
static void query_drop_xport(query_t *q) {
  if (q->x != NULL) {
    xport_close(q->x);
    q->x = NULL;
  }
}

static xport_t *xport_new(query_t *q, bool tcp, int *err) {
  ce_dns_stub_t *s = q->s;
  const struct sockaddr_storage *up = upstream_of(q);
  int fd = socket(up->ss_family, (tcp ? SOCK_STREAM : SOCK_DGRAM) | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = CE_EUNAVAIL;
    return NULL;
  }
  /* The mark lets the query out of the pod and keeps the pod's own DNS
   * redirect from sending it back to the sidecar (docs/netfilter.md). */
  if (s->opts.mark != 0 && ce_set_mark(fd, s->opts.mark) != CE_OK) {
    close(fd);
    *err = CE_EUNAVAIL;
    return NULL;
  }
  xport_t *x = calloc(1, sizeof(*x));
  if (x == NULL) {
    close(fd);
    *err = CE_ENOMEM;
    return NULL;
  }
  x->s = s;
  x->q = q;
  x->tcp = tcp;
  int rc = tcp ? uv_tcp_init(s->loop, &x->h.tcp) : uv_udp_init(s->loop, &x->h.udp);
  if (rc != 0) {
    close(fd);
    free(x);
    *err = CE_ENOMEM;
    return NULL;
  }
  x->h.handle.data = x;
  x->next = s->xports;
  if (s->xports != NULL)
    s->xports->prev = x;
  s->xports = x;
  rc = tcp ? uv_tcp_open(&x->h.tcp, fd) : uv_udp_open(&x->h.udp, fd);
  if (rc != 0) {
    close(fd);
    xport_close(x);
    *err = CE_EUNAVAIL;
    return NULL;
  }
  return x;
}

/* Follows the CNAME chain of msg from the question's name into q->result.
 * Returns CE_OK or CE_EPROTO. */
static int take_answer(query_t *q, const ce_dns_msg_t *m) {
  ce_dns_result_t *r = &q->result;
  r->rcode = (uint8_t)CE_DNS_RCODE(m->flags);
  r->count = 0;
  r->from_hosts = false;
  const char *cur = q->name;
  size_t cur_len = q->name_len;
  for (unsigned links = 0;; links++) {
    const ce_dns_rr_t *cname = NULL;
    for (size_t i = 0; i < m->answer_count && cname == NULL; i++) {
      const ce_dns_rr_t *rr = &m->answers[i];
      if (rr->type == CE_DNS_TYPE_CNAME && rr->name_len == cur_len && memcmp(rr->name, cur, cur_len) == 0)
        cname = rr;
    }
    if (cname == NULL || q->qtype == CE_DNS_TYPE_CNAME) {
      if (cname != NULL)
        r->rrs[r->count++] = *cname;
      break;
    }
    if (links >= CE_DNS_MAX_CNAME)
      return CE_EPROTO;
    r->rrs[r->count++] = *cname;
    cur = r->rrs[r->count - 1].target;
    cur_len = r->rrs[r->count - 1].target_len;
  }
  for (size_t i = 0; i < m->answer_count && r->count < CE_DNS_MAX_ANSWERS; i++) {
    const ce_dns_rr_t *rr = &m->answers[i];
    if (rr->type == q->qtype && rr->type != CE_DNS_TYPE_CNAME && rr->name_len == cur_len &&
        memcmp(rr->name, cur, cur_len) == 0)
      r->rrs[r->count++] = *rr;
  }
  return CE_OK;
}

/* An answer's bytes, from the upstream q is asking (UDP: the connected
 * socket only takes its datagrams; TCP: the connection). */
static void got_answer(query_t *q, const uint8_t *buf, size_t len, bool over_tcp) {
  ce_dns_msg_t *m = q->s->msg;
  if (ce_dns_parse(buf, len, m) != CE_OK) {
    CE_TRACE_D("dns", 0, 0, "query %s: an answer that does not parse, dropped", q->name);
    return;
  }
  /* RFC 5452 §3: the id, the question and the source must match; the
   * source is the connected socket's peer. */
  if (!(m->flags & CE_DNS_FLAG_QR) || m->id != q->id || !m->has_question || m->q.type != q->qtype ||
      m->q.cls != CE_DNS_CLASS_IN || m->q.name_len != q->name_len || memcmp(m->q.name, q->name, q->name_len) != 0 ||
      CE_DNS_OPCODE(m->flags) != 0) {
    CE_TRACE_D("dns", 0, 0, "query %s: an answer for another question, dropped", q->name);
    return;
  }
  unsigned rcode = CE_DNS_RCODE(m->flags);
  if (rcode != CE_DNS_RCODE_NOERROR && rcode != CE_DNS_RCODE_NXDOMAIN) {
    CE_TRACE_D("dns", 0, 0, "query %s: rcode %u, trying the next upstream", q->name, rcode);
    q->last_status = CE_EUNAVAIL;
    query_drop_xport(q);
    query_next(q);
    return;
  }
  if ((m->flags & CE_DNS_FLAG_TC) && !over_tcp) {
    CE_TRACE_D("dns", 0, 0, "query %s: truncated, asking again over TCP", q->name);
    query_drop_xport(q);
    int err = 0;
    xport_t *x = xport_new(q, true, &err);
    if (x == NULL) {
      q->last_status = err;
      query_next(q);
      return;
    }
    q->x = x;
    x->out[0] = (uint8_t)(q->pkt_len >> 8);
    x->out[1] = (uint8_t)q->pkt_len;
    memcpy(x->out + 2, q->pkt, q->pkt_len);
    tcp_connect(x);
    return;
  }
  int rc = take_answer(q, m);
  query_finish(q, rc);
}

static void udp_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  xport_t *x = h->data;
  buf->base = (char *)x->s->udp_buf;
  buf->len = UDP_BUF;
}

static void udp_read(uv_udp_t *u, ssize_t nread, const uv_buf_t *buf, const struct sockaddr *addr,
                     unsigned flags) {
  xport_t *x = u->data;
  query_t *q = x->q;
  if (q == NULL || nread == 0)
    return;
  if (nread < 0) {
    /* ECONNREFUSED from an ICMP port unreachable: the next upstream. */
    q->last_status = CE_EUNAVAIL;
    query_drop_xport(q);
    query_next(q);
    return;
  }
  if (addr == NULL || (flags & UV_UDP_PARTIAL))
    return;
  got_answer(q, (const uint8_t *)buf->base, (size_t)nread, false);
}

static void udp_sent(uv_udp_send_t *req, int status) {
  xport_t *x = req->handle->data;
  query_t *q = x->q;
  if (q == NULL || status == 0)
    return;
  q->last_status = CE_EUNAVAIL;
  query_drop_xport(q);
  query_next(q);
}

static void tcp_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  xport_t *x = h->data;
  if (x->in == NULL)
    x->in = malloc(2 + CE_DNS_MAX_MSG);
  if (x->in == NULL || x->in_len >= 2 + CE_DNS_MAX_MSG) {
    buf->base = NULL;
    buf->len = 0;
    return;
  }
  buf->base = (char *)x->in + x->in_len;
  buf->len = 2 + CE_DNS_MAX_MSG - x->in_len;
}

static void tcp_failed(query_t *q) {
  q->last_status = CE_EUNAVAIL;
  query_drop_xport(q);
  query_next(q);
}

static void tcp_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  xport_t *x = st->data;
  query_t *q = x->q;
  if (q == NULL || nread == 0)
    return;
  if (nread < 0) { /* UV_ENOBUFS (no memory) included */
    tcp_failed(q);
    return;
  }
  x->in_len += (size_t)nread;
  if (x->in_len < 2)
    return;
  size_t want = ((size_t)x->in[0] << 8) | x->in[1];
  if (x->in_len < 2 + want)
    return;
  got_answer(q, x->in + 2, want, true);
}

static void tcp_written(uv_write_t *req, int status) {
  xport_t *x = req->handle->data;
  if (x->q != NULL && status != 0)
    tcp_failed(x->q);
}

static void tcp_connected(uv_connect_t *req, int status) {
  xport_t *x = req->handle->data;
  query_t *q = x->q;
  if (q == NULL)
    return;
  if (status != 0) {
    tcp_failed(q);
    return;
  }
  uv_buf_t b = uv_buf_init((char *)x->out, (unsigned)(2 + q->pkt_len));
  if (uv_write(&x->wreq, (uv_stream_t *)&x->h.tcp, &b, 1, tcp_written) != 0 ||
      uv_read_start((uv_stream_t *)&x->h.tcp, tcp_alloc, tcp_read) != 0)
    tcp_failed(q);
}

static void tcp_connect(xport_t *x) {
  query_t *q = x->q;
  const struct sockaddr_storage *up = upstream_of(q);
  if (uv_tcp_connect(&x->creq, &x->h.tcp, (const struct sockaddr *)up, tcp_connected) != 0)
    tcp_failed(q);
}

/* ---- queries ------------------------------------------------------------- */

static void query_closed(uv_handle_t *h) {
  query_t *q = h->data;
  ce_dns_stub_t *s = q->s;
  if (q->prev != NULL)
    q->prev->next = q->next;
  else
    s->queries = q->next;
  if (q->next != NULL)
    q->next->prev = q->prev;
  s->inflight--;
  free(q);
  stub_maybe_free(s);
}

static void query_release(query_t *q) {
  query_drop_xport(q);
  if (!q->timer_closing) {
    q->timer_closing = true;
    uv_close((uv_handle_t *)&q->timer, query_closed);
  }
}

static void query_finish(query_t *q, int status) {
  if (q->done)
    return;
  q->done = true;
  query_drop_xport(q);
  uv_timer_stop(&q->timer);
  CE_TRACE_D("dns", 0, 0, "query %s type %u: %s%s", q->name, (unsigned)q->qtype,
             status == CE_OK ? "answered" : ce_strerror(status),
             status == CE_OK && q->result.rcode == CE_DNS_RCODE_NXDOMAIN ? " (no such name)" : "");
  /* The callback may start new queries, or close the stub (which closes
   * this query's timer too: query_release is idempotent). */
  q->cb(q->data, status, status == CE_OK ? &q->result : NULL);
  query_release(q);
}

static void query_timeout(uv_timer_t *t) {
  query_t *q = t->data;
  if (q->done)
    return;
  if (q->immediate) {
    query_finish(q, q->immediate_status);
    return;
  }
  q->last_status = CE_ETIMEDOUT;
  query_drop_xport(q);
  query_next(q);
}

/* Starts the next attempt, or ends the query. */
static void query_next(query_t *q) {
  ce_dns_stub_t *s = q->s;
  uint64_t now = uv_now(s->loop);
  if (q->done)
    return;
  if (q->attempt >= 2 * s->opts.upstream_count || now >= q->deadline) {
    query_finish(q, q->last_status);
    return;
  }
  q->attempt++;
  q->id = random_id();
  q->pkt[0] = (uint8_t)(q->id >> 8);
  q->pkt[1] = (uint8_t)q->id;
  uint64_t left = q->deadline - now;
  uint64_t wait = s->opts.attempt_ms < left ? s->opts.attempt_ms : left;
  uv_timer_start(&q->timer, query_timeout, wait, 0);
  int err = 0;
  xport_t *x = xport_new(q, false, &err);
  if (x == NULL) {
    q->last_status = err;
    return; /* the timer tries the next one: no recursion on a hard failure */
  }
  q->x = x;
  const struct sockaddr_storage *up = upstream_of(q);
  uv_buf_t b = uv_buf_init((char *)q->pkt, (unsigned)q->pkt_len);
  int rc = uv_udp_connect(&x->h.udp, (const struct sockaddr *)up);
  if (rc == 0)
    rc = uv_udp_recv_start(&x->h.udp, udp_alloc, udp_read);
  if (rc == 0)
    rc = uv_udp_send(&x->sreq, &x->h.udp, &b, 1, NULL, udp_sent);
  if (rc != 0) {
    q->last_status = CE_EUNAVAIL;
    query_drop_xport(q);
  }
}

/* The hosts table's answer for q, when it has the name. */
static bool from_hosts(query_t *q) {
  const ce_hosts_t *h = q->s->opts.hosts;
  ce_hosts_addr_t addrs[CE_HOSTS_MAX_ADDRS];
  size_t n = ce_hosts_lookup(h, q->name, q->name_len, addrs, CE_HOSTS_MAX_ADDRS);
  if (n == 0)
    return false;
  ce_dns_result_t *r = &q->result;
  r->rcode = CE_DNS_RCODE_NOERROR;
  r->from_hosts = true;
  r->count = 0;
  uint8_t want = q->qtype == CE_DNS_TYPE_A ? 4 : q->qtype == CE_DNS_TYPE_AAAA ? 6 : 0;
  for (size_t i = 0; i < n; i++) {
    if (addrs[i].family != want)
      continue;
    ce_dns_rr_t *rr = &r->rrs[r->count++];
    memcpy(rr->name, q->name, q->name_len + 1);
    rr->name_len = q->name_len;
    rr->type = q->qtype;
    rr->ttl = CE_DNS_HOSTS_TTL;
    memcpy(rr->addr, addrs[i].addr, 16);
  }
  return true;
}

int ce_dns_stub_query(ce_dns_stub_t *s, const char *name, size_t len, uint16_t qtype, ce_dns_query_cb cb,
                      void *data) {
  if (s->closing || s->inflight >= CE_DNS_STUB_MAX_INFLIGHT)
    return CE_EAGAIN;
  query_t *q = calloc(1, sizeof(*q));
  if (q == NULL)
    return CE_ENOMEM;
  q->s = s;
  q->cb = cb;
  q->data = data;
  q->qtype = qtype;
  int rc = ce_dns_build_query(q->pkt, sizeof(q->pkt), 0, name, len, qtype, true, CE_DNS_STUB_EDNS_UDP,
                              &q->pkt_len);
  if (rc != CE_OK) {
    free(q);
    return CE_EINVAL;
  }
  /* The question as text, lowered (answers are compared with it). */
  size_t off = CE_DNS_HEADER_LEN;
  if (ce_dns_name_read(q->pkt, q->pkt_len, &off, q->name, &q->name_len) != CE_OK) {
    free(q);
    return CE_EINVAL;
  }
  uv_timer_init(s->loop, &q->timer);
  q->timer.data = q;
  q->next = s->queries;
  if (s->queries != NULL)
    s->queries->prev = q;
  s->queries = q;
  s->inflight++;
  q->deadline = uv_now(s->loop) + s->opts.deadline_ms;
  q->last_status = CE_ETIMEDOUT;
  if (from_hosts(q) || s->opts.upstream_count == 0) {
    q->immediate = true;
    q->immediate_status = q->result.from_hosts ? CE_OK : CE_EUNAVAIL;
    uv_timer_start(&q->timer, query_timeout, 0, 0);
    return CE_OK;
  }
  query_next(q);
  return CE_OK;
}

/* ---- address lookups ------------------------------------------------------ */

typedef struct {
  ce_dns_stub_t *s;
  ce_dns_addrs_cb cb;
  void *data;
  uint16_t port;
  int pending;
  int status[2];      /* A, AAAA */
  bool nodata[2];     /* answered, without an address */
  ce_dns_addrs_t found[2];
} lookup_t;

static void put_addr(ce_dns_addrs_t *a, int family, const uint8_t *bytes, uint16_t port) {
  if (a->count >= CE_DNS_MAX_ADDRS)
    return;
  struct sockaddr_storage *ss = &a->addrs[a->count++];
  memset(ss, 0, sizeof(*ss));
  if (family == 4) {
    struct sockaddr_in *in = (struct sockaddr_in *)ss;
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    memcpy(&in->sin_addr, bytes, 4);
  } else {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    memcpy(&in6->sin6_addr, bytes, 16);
  }
}

static void lookup_done(lookup_t *lk) {
  ce_dns_addrs_t all;
  all.count = 0;
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < lk->found[k].count && all.count < CE_DNS_MAX_ADDRS; i++)
      all.addrs[all.count++] = lk->found[k].addrs[i];
  int status;
  if (all.count > 0)
    status = CE_OK;
  else if (lk->nodata[0] && lk->nodata[1])
    status = CE_ENOENT;
  else if (lk->status[0] == CE_ETIMEDOUT || lk->status[1] == CE_ETIMEDOUT)
    status = CE_ETIMEDOUT;
  else
    status = lk->status[0] != CE_OK ? lk->status[0] : lk->status[1];
  if (status == CE_OK && all.count == 0)
    status = CE_ENOENT;
  ce_dns_addrs_cb cb = lk->cb;
  void *data = lk->data;
  free(lk);
  cb(data, status, &all);
}

static void lookup_part(lookup_t *lk, int k, int status, const ce_dns_result_t *res) {
  lk->status[k] = status;
  if (status == CE_OK) {
    lk->nodata[k] = true;
    uint16_t want = k == 0 ? CE_DNS_TYPE_A : CE_DNS_TYPE_AAAA;
    for (size_t i = 0; i < res->count; i++)
      if (res->rrs[i].type == want) {
        put_addr(&lk->found[k], k == 0 ? 4 : 6, res->rrs[i].addr, lk->port);
        lk->nodata[k] = false;
      }
  }
  if (--lk->pending == 0)
    lookup_done(lk);
}

static void lookup_a(void *data, int status, const ce_dns_result_t *res) {
  lookup_part(data, 0, status, res);
}

static void lookup_aaaa(void *data, int status, const ce_dns_result_t *res) {
  lookup_part(data, 1, status, res);
}

/* An IP literal answers itself; the lookup still calls back from the
 * loop, through a query of the hosts table's kind. */
struct literal {
  ce_dns_stub_t *s;
  literal_t *next, *prev;
  ce_dns_addrs_cb cb;
  void *data;
  bool fired;
  ce_dns_addrs_t addrs;
  uv_timer_t timer;
};

static void literal_closed(uv_handle_t *h) {
  literal_t *l = h->data;
  ce_dns_stub_t *s = l->s;
  if (l->prev != NULL)
    l->prev->next = l->next;
  else
    s->literals = l->next;
  if (l->next != NULL)
    l->next->prev = l->prev;
  s->inflight--;
  free(l);
  stub_maybe_free(s);
}

/* Calls back once (status CE_OK from the timer, CE_ECLOSED from close). */
static void literal_fire_with(literal_t *l, int status) {
  if (l->fired)
    return;
  l->fired = true;
  l->cb(l->data, status, &l->addrs);
  uv_close((uv_handle_t *)&l->timer, literal_closed);
}

static void literal_fire(uv_timer_t *t) {
  literal_fire_with(t->data, CE_OK);
}

int ce_dns_stub_lookup(ce_dns_stub_t *s, const char *host, uint16_t port, ce_dns_addrs_cb cb, void *data) {
  char text[CE_DNS_NAME_MAX + 1];
  size_t len = strlen(host);
  if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
    host++;
    len -= 2;
  }
  if (len > CE_DNS_NAME_MAX)
    return CE_EINVAL;
  memcpy(text, host, len);
  text[len] = '\0';
  uint8_t bytes[16];
  int fam = inet_pton(AF_INET, text, bytes) == 1 ? 4 : inet_pton(AF_INET6, text, bytes) == 1 ? 6 : 0;
  if (fam != 0) {
    if (s->inflight >= CE_DNS_STUB_MAX_INFLIGHT)
      return CE_EAGAIN;
    if (s->closing)
      return CE_EAGAIN;
    literal_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
      return CE_ENOMEM;
    l->s = s;
    l->next = s->literals;
    if (s->literals != NULL)
      s->literals->prev = l;
    s->literals = l;
    s->inflight++;
    l->cb = cb;
    l->data = data;
    put_addr(&l->addrs, fam, bytes, port);
    uv_timer_init(s->loop, &l->timer);
    l->timer.data = l;
    uv_timer_start(&l->timer, literal_fire, 0, 0);
    return CE_OK;
  }
  lookup_t *lk = calloc(1, sizeof(*lk));
  if (lk == NULL)
    return CE_ENOMEM;
  lk->s = s;
  lk->cb = cb;
  lk->data = data;
  lk->port = port;
  int rc = ce_dns_stub_query(s, text, len, CE_DNS_TYPE_A, lookup_a, lk);
  if (rc != CE_OK) {
    free(lk);
    return rc;
  }
  lk->pending = 1;
  rc = ce_dns_stub_query(s, text, len, CE_DNS_TYPE_AAAA, lookup_aaaa, lk);
  if (rc != CE_OK) {
    /* The A query runs on and ends the lookup alone, with its status. */
    lk->status[1] = rc;
    return CE_OK;
  }
  lk->pending = 2;
  return CE_OK;
}

/* ---- the stub ------------------------------------------------------------ */

int ce_dns_stub_new(uv_loop_t *loop, const ce_dns_stub_opts_t *opts, ce_dns_stub_t **out) {
  if (opts->upstream_count > CE_DNS_STUB_MAX_UPSTREAMS)
    return CE_EINVAL;
  for (size_t i = 0; i < opts->upstream_count; i++)
    if (opts->upstreams[i].ss_family != AF_INET && opts->upstreams[i].ss_family != AF_INET6)
      return CE_EINVAL;
  ce_dns_stub_t *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return CE_ENOMEM;
  s->udp_buf = malloc(UDP_BUF);
  s->msg = malloc(sizeof(*s->msg));
  if (s->udp_buf == NULL || s->msg == NULL) {
    free(s->udp_buf);
    free(s->msg);
    free(s);
    return CE_ENOMEM;
  }
  s->loop = loop;
  s->opts = *opts;
  if (s->opts.attempt_ms == 0)
    s->opts.attempt_ms = CE_DNS_STUB_ATTEMPT_MS;
  if (s->opts.deadline_ms == 0)
    s->opts.deadline_ms = CE_DNS_STUB_DEADLINE_MS;
  *out = s;
  return CE_OK;
}

void ce_dns_stub_close(ce_dns_stub_t *s) {
  if (s == NULL)
    return;
  s->closing = true;
  /* Every caller hears of the end (CE_ECLOSED), so that nothing it holds
   * for the answer leaks; new queries are refused meanwhile. The lists
   * change only in close callbacks, which run later. */
  for (query_t *q = s->queries; q != NULL; q = q->next) {
    if (!q->done) {
      q->done = true;
      q->cb(q->data, CE_ECLOSED, NULL);
    }
    query_release(q);
  }
  for (literal_t *l = s->literals; l != NULL; l = l->next)
    literal_fire_with(l, CE_ECLOSED);
  for (xport_t *x = s->xports; x != NULL; x = x->next)
    xport_close(x);
  stub_maybe_free(s);
}

size_t ce_dns_stub_inflight(const ce_dns_stub_t *s) {
  return s->inflight;
}

int ce_dns_upstream_parse(const char *text, struct sockaddr_storage *out) {
  char buf[80];
  size_t len = strlen(text);
  if (len == 0 || len >= sizeof(buf))
    return CE_EINVAL;
  memcpy(buf, text, len + 1);
  memset(out, 0, sizeof(*out));
  uint8_t bytes[16];
  if (inet_pton(AF_INET, buf, bytes) == 1 || inet_pton(AF_INET6, buf, bytes) == 1) {
    char with_port[96];
    snprintf(with_port, sizeof(with_port), strchr(buf, ':') != NULL ? "[%s]:53" : "%s:53", buf);
    return ce_addr_parse(with_port, out) == CE_OK ? CE_OK : CE_EINVAL;
  }
  if (ce_addr_parse(buf, out) != CE_OK)
    return CE_EINVAL;
  return ce_addr_port((const struct sockaddr *)out) != 0 ? CE_OK : CE_EINVAL;
}

size_t ce_dns_resolv_conf_parse(const char *buf, size_t len, ce_dns_stub_opts_t *opts) {
  size_t taken = 0, pos = 0;
  opts->upstream_count = 0;
  while (pos < len) {
    size_t end = pos;
    while (end < len && buf[end] != '\n')
      end++;
    static const char kw[] = "nameserver";
    size_t i = pos;
    while (i < end && (buf[i] == ' ' || buf[i] == '\t'))
      i++;
    if (end - i > sizeof(kw) - 1 && memcmp(buf + i, kw, sizeof(kw) - 1) == 0 &&
        (buf[i + sizeof(kw) - 1] == ' ' || buf[i + sizeof(kw) - 1] == '\t')) {
      i += sizeof(kw) - 1;
      while (i < end && (buf[i] == ' ' || buf[i] == '\t'))
        i++;
      size_t w = i;
      while (i < end && buf[i] != ' ' && buf[i] != '\t' && buf[i] != '\r' && buf[i] != '#' && buf[i] != ';')
        i++;
      char addr[64];
      if (i > w && i - w < sizeof(addr) && opts->upstream_count < CE_DNS_STUB_MAX_UPSTREAMS) {
        memcpy(addr, buf + w, i - w);
        addr[i - w] = '\0';
        struct sockaddr_storage ss;
        if (strchr(addr, '%') == NULL && ce_dns_upstream_parse(addr, &ss) == CE_OK) {
          opts->upstreams[opts->upstream_count++] = ss;
          taken++;
        }
      }
    }
    pos = end + 1;
  }
  return taken;
}
