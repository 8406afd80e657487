/*
 * pods/portforward (ce_kube_forward, internal.h): a listener on loopback
 * or a Unix socket (control/listen.h's code), and for each accepted
 * connection a tunnel, one WebSocket on v4.channel.k8s.io. Bytes read
 * from the local socket go as channel-0 frames; each direction is
 * bounded (CE_KUBE_FWD_QUEUE_MAX) and the other side is paused past it.
 * Each channel's stream opens with the 2-byte port it is for; the error
 * channel's text ends the tunnel and goes to the listener's owner.
 */
#include "kube/internal.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/text.h"
#include "control/listen.h"

/* What the error channel may say, at most. */
#define FWD_ERR_MAX 4096u

static bool local_open(const conn_t *cn) {
  return cn->local_state == LOCAL_HELD || cn->local_state == LOCAL_READING ||
         cn->local_state == LOCAL_EOF;
}

static void on_local_closed(uv_handle_t *h) {
  conn_t *cn = h->data;
  cn->handles--;
  ce__kube_conn_maybe_free(cn);
}

static void on_local_shutdown(uv_shutdown_t *req, int status) {
  conn_t *cn = req->data;
  free(req);
  uv_close((uv_handle_t *)&cn->local, on_local_closed);
}

/* Closes the local socket once what is queued towards it is written. */
void ce__kube_tunnel_close_local(conn_t *cn) {
  if (!local_open(cn))
    return;
  cn->local_state = LOCAL_CLOSED;
  uv_read_stop((uv_stream_t *)&cn->local);
  uv_shutdown_t *req = cn->failed ? NULL : malloc(sizeof(*req));
  if (req != NULL) {
    req->data = cn;
    if (uv_shutdown(req, (uv_stream_t *)&cn->local, on_local_shutdown) == 0)
      return;
    free(req);
  }
  uv_close((uv_handle_t *)&cn->local, on_local_closed);
}

static void on_local_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  chunk_t *ch = malloc(sizeof(chunk_t) + LWS_PRE + 1 + CE_KUBE_STDIN_FRAME);
  if (ch == NULL) {
    *b = uv_buf_init(NULL, 0);
    return;
  }
  *b = uv_buf_init((char *)ch->data + LWS_PRE + 1, CE_KUBE_STDIN_FRAME);
}

static void on_local_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  conn_t *cn = s->data;
  chunk_t *ch = b->base != NULL ? (chunk_t *)(b->base - LWS_PRE - 1 - offsetof(chunk_t, data))
                                : NULL;
  if (n <= 0) {
    free(ch);
    if (n == 0)
      return;
    /* EOF or an error: what is queued still goes, then the tunnel ends. */
    uv_read_stop(s);
    cn->local_state = LOCAL_EOF;
    if (cn->wsi != NULL && cn->stage != KC_GONE)
      lws_callback_on_writable(cn->wsi);
    return;
  }
  /* What is queued is counted as allocated: a small read gets a chunk of
   * its size (1-byte segments would otherwise hold 64 KiB each). */
  if ((size_t)n < CE_KUBE_STDIN_FRAME / 2) {
    chunk_t *small = realloc(ch, CHUNK_COST((size_t)n));
    if (small != NULL)
      ch = small;
  }
  ch->next = NULL;
  ch->len = (size_t)n;
  ch->data[LWS_PRE] = CE_KUBE_PF_DATA;
  if (cn->q_tail != NULL)
    cn->q_tail->next = ch;
  else
    cn->q_head = ch;
  cn->q_tail = ch;
  cn->q_bytes += CHUNK_COST((size_t)n);
  if (cn->q_bytes > CE_KUBE_FWD_QUEUE_MAX) {
    uv_read_stop(s);
    cn->local_state = LOCAL_HELD;
  }
  if (cn->wsi != NULL && cn->stage != KC_GONE)
    lws_callback_on_writable(cn->wsi);
}

static void on_local_written(uv_write_t *req, int status) {
  conn_t *cn = req->data;
  free(req);
  if (cn->rx_paused && local_open(cn) && cn->wsi != NULL && cn->stage != KC_GONE &&
      cn->local.tcp.write_queue_size < CE_KUBE_FWD_QUEUE_MAX) {
    cn->rx_paused = false;
    lws_rx_flow_control(cn->wsi, 1);
  }
}

static int tunnel_to_local(conn_t *cn, struct lws *wsi, const uint8_t *d, size_t n) {
  if (n == 0 || !local_open(cn))
    return 0;
  uv_write_t *req = malloc(sizeof(*req) + n);
  if (req == NULL)
    return -1;
  char *copy = (char *)(req + 1);
  memcpy(copy, d, n);
  req->data = cn;
  uv_buf_t b = uv_buf_init(copy, (unsigned)n);
  if (uv_write(req, (uv_stream_t *)&cn->local, &b, 1, on_local_written) != 0) {
    free(req);
    return -1;
  }
  if (cn->local.tcp.write_queue_size > CE_KUBE_FWD_QUEUE_MAX && !cn->rx_paused) {
    cn->rx_paused = true;
    lws_rx_flow_control(wsi, 0);
  }
  return 0;
}

static int tunnel_rx(conn_t *cn, struct lws *wsi, const uint8_t *d, size_t n) {
  if (!cn->in_msg) {
    unsigned chan;
    const uint8_t *data;
    size_t dl;
    if (!ce_kube_frame_split(d, n, &chan, &data, &dl))
      return 0;
    cn->cur_chan = chan;
    cn->in_msg = true;
    d = data;
    n = dl;
  }
  bool end = lws_is_final_fragment(wsi) && lws_remaining_packet_payload(wsi) == 0;
  if (end)
    cn->in_msg = false;
  if (cn->cur_chan > CE_KUBE_PF_ERROR)
    return 0;
  ce_kube_prefix_t *pre = &cn->pre[cn->cur_chan];
  size_t skip = 0;
  uint16_t port = cn->fwd != NULL ? cn->fwd->port : 0;
  if (!ce_kube_prefix_done(pre)) {
    if (ce_kube_prefix_feed(pre, port, d, n, &skip) != 0) {
      ce__kube_conn_finish(cn, CE_EPROTO, "port-forward: the %s channel named port %u, not %u",
                           cn->cur_chan == 0 ? "data" : "error",
                           (unsigned)(pre->bytes[0] | pre->bytes[1] << 8), port);
      cn->failed = true;
      return -1;
    }
    d += skip;
    n -= skip;
  }
  if (cn->cur_chan == CE_KUBE_PF_DATA)
    return tunnel_to_local(cn, wsi, d, n);
  size_t room = FWD_ERR_MAX - cn->fwd_err.n;
  if (!ce__kube_buf_add(&cn->fwd_err, d, n < room ? n : room))
    return -1;
  if (end && cn->fwd_err.n > 0) {
    char s[CE__KUBE_SHOWN_MAX];
    ce_text_sanitize(s, sizeof(s), cn->fwd_err.p, cn->fwd_err.n, 0);
    ce__kube_conn_finish(cn, CE_EPROTO, "port-forward to %s/%s:%u: %s", cn->fwd->ns, cn->fwd->pod,
                         port, s);
    cn->failed = true;
    return -1;
  }
  return 0;
}

static int tunnel_write(conn_t *cn, struct lws *wsi) {
  chunk_t *ch = cn->q_head;
  if (ch == NULL) {
    if (cn->local_state == LOCAL_EOF) {
      ce__kube_conn_finish(cn, CE_OK, NULL);
      return -1;
    }
    return 0;
  }
  cn->q_head = ch->next;
  if (cn->q_head == NULL)
    cn->q_tail = NULL;
  cn->q_bytes -= CHUNK_COST(ch->len);
  int w = lws_write(wsi, ch->data + LWS_PRE, ch->len + 1, LWS_WRITE_BINARY);
  free(ch);
  if (w < 0)
    return -1;
  if (cn->local_state == LOCAL_HELD && cn->q_bytes <= CE_KUBE_FWD_QUEUE_MAX / 2 &&
      uv_read_start((uv_stream_t *)&cn->local, on_local_alloc, on_local_read) == 0)
    cn->local_state = LOCAL_READING;
  if (cn->q_head != NULL || cn->local_state == LOCAL_EOF)
    lws_callback_on_writable(wsi);
  return 0;
}

int ce__kube_tunnel_cb(conn_t *cn, struct lws *wsi, enum lws_callback_reasons reason, void *in,
                     size_t len) {
  switch (reason) {
  case LWS_CALLBACK_CLIENT_ESTABLISHED:
    if (cn->local_state == LOCAL_HELD &&
        uv_read_start((uv_stream_t *)&cn->local, on_local_alloc, on_local_read) == 0)
      cn->local_state = LOCAL_READING;
    return 0;
  case LWS_CALLBACK_CLIENT_RECEIVE:
    if (cn->finished)
      return -1;
    return tunnel_rx(cn, wsi, in, len);
  case LWS_CALLBACK_CLIENT_WRITEABLE:
    if (cn->finished)
      return -1;
    return tunnel_write(cn, wsi);
  case LWS_CALLBACK_CLIENT_CLOSED:
    ce__kube_conn_finish(cn, CE_OK, NULL);
    ce__kube_tunnel_close_local(cn);
    ce__kube_conn_lws_gone(cn);
    return 0;
  default:
    return 0;
  }
}


static void on_fwd_closed(uv_handle_t *h) {
  fwd_t *f = h->data;
  free(f->path);
  free(f);
}

void ce__kube_fwd_close(fwd_t *f) {
  ce_kube_client_t *c = f->c;
  for (fwd_t **pp = &c->fwds; *pp != NULL; pp = &(*pp)->next)
    if (*pp == f) {
      *pp = f->next;
      break;
    }
  f->closing = true;
  if (f->k != NULL) {
    for (conn_t *cn = f->k->conns; cn != NULL; cn = cn->next) {
      if (cn->kind != K_TUNNEL || cn->fwd != f)
        continue;
      cn->fwd = NULL;
      ce__kube_conn_drop(cn);
      cn->failed = true;
      ce__kube_tunnel_close_local(cn);
    }
  }
  if (f->is_unix && f->path != NULL)
    ce__listen_remove(f->path);
  uv_close((uv_handle_t *)&f->l, on_fwd_closed);
}

bool ce_kube_forward_close(ce_kube_client_t *c, uint64_t fchan) {
  for (fwd_t *f = c->fwds; f != NULL; f = f->next)
    if (f->id == fchan) {
      ce__kube_fwd_close(f);
      return true;
    }
  return false;
}


static void on_refused_closed(uv_handle_t *h) { free(h); }

/* A connection over the listener's tunnel limit: accepted and closed. */
static void fwd_refuse(fwd_t *f, uv_stream_t *server) {
  uv_stream_t *s = malloc(f->is_unix ? sizeof(uv_pipe_t) : sizeof(uv_tcp_t));
  if (s == NULL)
    return;
  int rc = f->is_unix ? uv_pipe_init(f->c->loop, (uv_pipe_t *)s, 0)
                      : uv_tcp_init(f->c->loop, (uv_tcp_t *)s);
  if (rc != 0) {
    free(s);
    return;
  }
  uv_accept(server, s);
  uv_close((uv_handle_t *)s, on_refused_closed);
  char msg[128];
  snprintf(msg, sizeof(msg),
           "port-forward: a connection was refused: the listener already has %u tunnels",
           CE_KUBE_FWD_TUNNELS_MAX);
  f->cb(f->arg, f->id, msg);
}

static void on_fwd_connection(uv_stream_t *server, int status) {
  fwd_t *f = server->data;
  if (status < 0 || f->closing || f->k == NULL)
    return;
  if (f->tunnels >= CE_KUBE_FWD_TUNNELS_MAX) {
    fwd_refuse(f, server);
    return;
  }
  conn_t *cn = ce__kube_conn_new(f->k, K_TUNNEL);
  if (cn == NULL)
    return;
  cn->fwd = f;
  f->tunnels++;
  int rc = f->is_unix ? uv_pipe_init(f->c->loop, &cn->local.pipe, 0)
                      : uv_tcp_init(f->c->loop, &cn->local.tcp);
  if (rc != 0) {
    ce__kube_conn_drop(cn);
    ce__kube_conn_lws_gone(cn);
    return;
  }
  cn->local.tcp.data = cn;
  cn->handles++;
  cn->local_state = LOCAL_HELD;
  if (uv_accept(server, (uv_stream_t *)&cn->local) != 0) {
    ce__kube_conn_drop(cn);
    cn->failed = true;
    ce__kube_tunnel_close_local(cn);
    ce__kube_conn_lws_gone(cn);
    return;
  }
  size_t used = 0;
  char port[16];
  snprintf(port, sizeof(port), "%u", f->port);
  /* A listener's namespace and pod are at most 253 bytes each: the URL
   * always fits. */
  char *u = ce__kube_pod_url(f->k, f->ns, f->pod, "/portforward?ports=", &used);
  if (u == NULL || !ce__kube_url_put(u, CE__KUBE_URL_MAX, &used, port)) {
    free(u);
    ce__kube_conn_fail_early(cn, CE_ENOMEM, "port-forward: out of memory");
    return;
  }
  cn->url = u;
  ce__kube_conn_start(cn);
}

int ce_kube_forward(ce_kube_t *k, const ce_kube_fwd_req_t *req, ce_kube_fwd_err_cb cb,
                    void *arg, uint64_t *fchan, uint16_t *bound_port, char *err,
                    size_t errlen) {
  ce_kube_client_t *c = k->c;
  ce__listen_addr_t la;
  char why[256];
  int rc = ce__listen_parse(req->listen, &la, why, sizeof(why));
  if (rc != CE_OK)
    return ce__kube_efmt(err, errlen, rc, "kube_forward: %s", why);
  fwd_t *f = calloc(1, sizeof(*f));
  if (f == NULL)
    return ce__kube_efmt(err, errlen, CE_ENOMEM, "kube_forward: out of memory");
  f->c = c;
  f->k = k;
  f->is_unix = la.is_unix;
  f->port = req->port;
  f->cb = cb;
  f->arg = arg;
  snprintf(f->ns, sizeof(f->ns), "%s", req->ns);
  snprintf(f->pod, sizeof(f->pod), "%s", req->pod);
  if (la.is_unix && (f->path = strdup(la.path)) == NULL) {
    free(f);
    return ce__kube_efmt(err, errlen, CE_ENOMEM, "kube_forward: out of memory");
  }
  int fd = -1, port = 0;
  /* The sidecar's own listener code: 0600 sockets, stale ones replaced,
   * live ones and other files refused. */
  rc = ce__listen_open(&la, 64, &fd, &port, why, sizeof(why));
  if (rc != CE_OK) {
    free(f->path);
    free(f);
    return ce__kube_efmt(err, errlen, rc, "kube_forward: %s", why);
  }
  int urc = la.is_unix ? uv_pipe_init(c->loop, &f->l.pipe, 0) : uv_tcp_init(c->loop, &f->l.tcp);
  if (urc != 0) {
    close(fd);
    if (la.is_unix)
      ce__listen_remove(la.path);
    free(f->path);
    free(f);
    return ce__kube_efmt(err, errlen, CE_EIO, "kube_forward: %s", uv_strerror(urc));
  }
  f->l.tcp.data = f;
  urc = la.is_unix ? uv_pipe_open(&f->l.pipe, fd) : uv_tcp_open(&f->l.tcp, fd);
  if (urc != 0)
    close(fd);
  else
    urc = uv_listen((uv_stream_t *)&f->l, 64, on_fwd_connection);
  if (urc != 0) {
    if (la.is_unix)
      ce__listen_remove(la.path);
    free(f->path);
    f->path = NULL;
    uv_close((uv_handle_t *)&f->l, on_fwd_closed);
    return ce__kube_efmt(err, errlen, CE_EIO, "kube_forward: cannot listen: %s", uv_strerror(urc));
  }
  *bound_port = (uint16_t)port;
  f->id = c->next_fchan++;
  f->next = c->fwds;
  c->fwds = f;
  *fchan = f->id;
  return CE_OK;
}
