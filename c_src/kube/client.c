/*
 * The Kubernetes client (client.h) on libwebsockets: the core (see
 * internal.h for how the files divide the work).
 *
 * Every operation is a conn_t: a REST exchange (K_HTTP), an exec stream
 * (K_EXEC) or one tunnelled connection of a forward listener (K_TUNNEL).
 * A conn may first wait for credentials (a token file re-read, an exec
 * plugin run with uv_spawn, credentials.c), then resolves the server's
 * name and tries its addresses in turn (connect.c); each attempt is one
 * wsi of libwebsockets, whose opaque user data points back at the conn.
 * A conn is freed once libwebsockets is done with its last wsi (stage
 * KC_GONE: a terminal callback, or no wsi at all) and its libuv handles
 * are closed.
 *
 * TLS (tls.c): each handle's vhost gets its own SSL_CTX, trusting the
 * handle's CA only; the host name is checked by us.
 */
#include "kube/internal.h"

#include <errno.h>
#include <openssl/err.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/text.h"

#define HDR_DATA_MAX 32768u
#define RX_BUFFER (64u * 1024u)

/* ---- small helpers ------------------------------------------------------------------ */

bool ce__kube_buf_add(buf_t *b, const void *d, size_t n) {
  if (n == 0)
    return true;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n + 1)
      cap *= 2;
    char *q = realloc(b->p, cap);
    if (q == NULL)
      return false;
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
  b->p[b->n] = '\0';
  return true;
}

void ce__kube_buf_free(buf_t *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

bool ce__kube_trace_on(void) {
  static int on = -1;
  if (on < 0)
    on = getenv("CONDUKT_PORT_DEBUG") != NULL;
  return on == 1;
}

const char *ce__kube_shown(char *dst, const char *s) {
  ce_text_sanitize(dst, CE__KUBE_SHOWN_MAX, s, strlen(s), 1);
  return dst;
}

int ce__kube_efmt(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return code;
}

bool ce__kube_url_escape(char *u, size_t cap, size_t *used, const char *s) {
  return ce_kube_query_escape(u, cap, used, s, strlen(s));
}

bool ce__kube_url_put(char *u, size_t cap, size_t *used, const char *s) {
  size_t n = strlen(s);
  if (*used + n >= cap)
    return false;
  memcpy(u + *used, s, n + 1);
  *used += n;
  return true;
}

char *ce__kube_pod_url(const ce_kube_t *k, const char *ns, const char *pod, const char *sub,
                       size_t *used) {
  char *u = malloc(CE__KUBE_URL_MAX);
  if (u == NULL)
    return NULL;
  const size_t cap = CE__KUBE_URL_MAX;
  *used = 0;
  u[0] = '\0';
  if (ce__kube_url_put(u, cap, used, k->cfg.path_prefix) &&
      ce__kube_url_put(u, cap, used, "/api/v1/namespaces/") &&
      ce__kube_url_escape(u, cap, used, ns) && ce__kube_url_put(u, cap, used, "/pods/") &&
      ce__kube_url_escape(u, cap, used, pod) && ce__kube_url_put(u, cap, used, sub))
    return u;
  free(u);
  return NULL;
}

/* ---- libwebsockets ---------------------------------------------------------------------- */

static int kube_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                   size_t len);

static const struct lws_protocols PROTOCOLS[] = {
    {"kube-http", kube_cb, 0, RX_BUFFER, 0, NULL, 0},
    {"kube-ws", kube_cb, 0, RX_BUFFER, 0, NULL, 0},
    {"v5.channel.k8s.io", kube_cb, 0, RX_BUFFER, 0, NULL, 0},
    {"v4.channel.k8s.io", kube_cb, 0, RX_BUFFER, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

static int ensure_context(ce_kube_client_t *c, char *err, size_t errlen) {
  if (c->lws != NULL)
    return CE_OK;
  static bool logs_set;
  if (!logs_set) {
    /* libwebsockets logs to stderr, which is the port's log: errors only. */
    /* Our own messages say what failed; libwebsockets' log is for
     * debugging (CONDUKT_PORT_DEBUG=1). */
    lws_set_log_level(getenv("CONDUKT_PORT_DEBUG") != NULL ? LLL_ERR | LLL_WARN | LLL_NOTICE
                                                            : 0,
                      NULL);
    logs_set = true;
  }
  void *loops[1] = {c->loop};
  struct lws_context_creation_info info;
  memset(&info, 0, sizeof(info));
  info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT |
                 LWS_SERVER_OPTION_EXPLICIT_VHOSTS;
  info.foreign_loops = loops;
  info.port = CONTEXT_PORT_NO_LISTEN;
  info.max_http_header_data = HDR_DATA_MAX;
  info.pt_serv_buf_size = 2 * HDR_DATA_MAX;
  c->lws = lws_create_context(&info);
  if (c->lws == NULL)
    return ce__kube_efmt(err, errlen, CE_EUNAVAIL,
                         "kube_open: libwebsockets could not start on the event loop (is "
                         "libwebsockets-evlib-uv installed?)");
  return CE_OK;
}

/* A vhost for k with its own TLS context holding the given client
 * certificate (or none). libwebsockets would otherwise share one client
 * SSL_CTX between vhosts whose creation info looks the same. */
int ce__kube_make_vhost(ce_kube_t *k, const char *cert, size_t cert_len, const char *key,
                      size_t key_len, vhost_t *out, char *err, size_t errlen) {
  char name[64];
  snprintf(name, sizeof(name), "kube-%llu-%u", (unsigned long long)k->id, k->gen++);
  SSL_CTX *ctx = ce__kube_tls_context(k, cert, cert_len, key, key_len, err, errlen);
  if (ctx == NULL)
    return CE_ETLS;
  struct lws_context_creation_info vi;
  memset(&vi, 0, sizeof(vi));
  vi.port = CONTEXT_PORT_NO_LISTEN;
  vi.protocols = PROTOCOLS;
  vi.vhost_name = name;
  vi.options = LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
  if (k->cfg.ca_pem != NULL)
    vi.options |= LWS_SERVER_OPTION_DISABLE_OS_CA_CERTS;
  vi.provided_client_ssl_ctx = ctx;
  vi.user = k;
  /* Each operation's own timer decides; libwebsockets' stage timeouts
   * only back it up. */
  vi.timeout_secs = CE_KUBE_TIMEOUT_MAX / 1000;
  vi.connect_timeout_secs = CE_KUBE_TIMEOUT_MAX / 1000;
  struct lws_vhost *vh = lws_create_vhost(k->c->lws, &vi);
  if (vh == NULL) {
    SSL_CTX_free(ctx);
    return ce__kube_efmt(err, errlen, CE_ETLS, "libwebsockets could not make a vhost");
  }
  out->vh = vh;
  out->ctx = ctx;
  return CE_OK;
}

/* The vhost is no longer used by k: destroyed now, its TLS context freed
 * (connections still on it hold their own references). While the client
 * is being destroyed, lws_context_destroy() ends the vhost and the
 * context waits for ce_kube_client_free(). */
static void vhost_drop(ce_kube_client_t *c, vhost_t *v) {
  if (v->vh == NULL)
    return;
  if (!c->destroying) {
    lws_vhost_destroy(v->vh);
    SSL_CTX_free(v->ctx);
  } else {
    SSL_CTX **h = realloc(c->held, (c->n_held + 1) * sizeof(*h));
    if (h != NULL) {
      c->held = h;
      c->held[c->n_held++] = v->ctx;
    }
    /* Out of memory: the context is left (a leak, never a use after
     * free). */
  }
  v->vh = NULL;
  v->ctx = NULL;
}

/* ---- conns --------------------------------------------------------------------------- */

static const char *const STAGE_NAMES[] = {"new",        "cred", "resolving", "connecting",
                                          "next address", "open", "gone"};

void ce__kube_conn_stage(conn_t *cn, kconn_stage_t stage) {
  if (ce__kube_trace_on())
    fprintf(stderr, "condukt-egress port: kube: conn %p: %s -> %s\n", (void *)cn,
            STAGE_NAMES[cn->stage], STAGE_NAMES[stage]);
  cn->stage = stage;
}

static void on_conn_handle_closed(uv_handle_t *h) {
  conn_t *cn = h->data;
  cn->handles--;
  ce__kube_conn_maybe_free(cn);
}

static void conn_unlink(conn_t *cn) {
  if (cn->k == NULL)
    return;
  for (conn_t **pp = &cn->k->conns; *pp != NULL; pp = &(*pp)->next)
    if (*pp == cn) {
      *pp = cn->next;
      break;
    }
}

void ce__kube_conn_maybe_free(conn_t *cn) {
  if (cn->stage != KC_GONE || cn->in_connect)
    return;
  if (!uv_is_closing((uv_handle_t *)&cn->timer)) {
    uv_close((uv_handle_t *)&cn->timer, on_conn_handle_closed);
    uv_close((uv_handle_t *)&cn->attempt, on_conn_handle_closed);
    /* A resolution still running calls back (cancelled) before the
     * conn goes: it is counted in cn->handles. */
    if (cn->gai_busy)
      uv_cancel((uv_req_t *)&cn->gai);
    return;
  }
  if (cn->kind == K_TUNNEL && cn->local_state != LOCAL_NONE && cn->local_state != LOCAL_CLOSED) {
    ce__kube_tunnel_close_local(cn);
    return;
  }
  if (cn->handles > 0)
    return;
  conn_unlink(cn);
  if (cn->fwd != NULL)
    cn->fwd->tunnels--;
  SSL_CTX_free(cn->ctx);
  if (cn->bearer != NULL)
    OPENSSL_clear_free(cn->bearer, strlen(cn->bearer));
  free(cn->url);
  free(cn->body);
  free(cn->ctype);
  ce__kube_buf_free(&cn->resp);
  free(cn->stdin_data);
  ce__kube_buf_free(&cn->out);
  ce__kube_buf_free(&cn->errout);
  ce__kube_buf_free(&cn->st);
  ce__kube_buf_free(&cn->fwd_err);
  for (chunk_t *q = cn->q_head, *nx; q != NULL; q = nx) {
    nx = q->next;
    free(q);
  }
  free(cn);
}

conn_t *ce__kube_conn_new(ce_kube_t *k, kind_t kind) {
  conn_t *cn = calloc(1, sizeof(*cn));
  if (cn == NULL)
    return NULL;
  cn->kind = kind;
  cn->stage = KC_NEW;
  cn->k = k;
  uv_timer_init(k->c->loop, &cn->timer);
  uv_timer_init(k->c->loop, &cn->attempt);
  cn->timer.data = cn;
  cn->attempt.data = cn;
  cn->gai.data = cn;
  cn->handles = 2;
  cn->next = k->conns;
  k->conns = cn;
  bool v6 = strchr(k->cfg.host, ':') != NULL;
  snprintf(cn->hosthdr, sizeof(cn->hosthdr), "%s%s%s:%u", v6 ? "[" : "", k->cfg.host,
           v6 ? "]" : "", k->cfg.port);
  return cn;
}

void ce__kube_conn_lws_gone(conn_t *cn) {
  if (ce__kube_trace_on())
    fprintf(stderr, "condukt-egress port: kube: conn %p done with wsi %p\n", (void *)cn,
            (void *)cn->wsi);
  if (cn->wsi != NULL)
    lws_set_opaque_user_data(cn->wsi, NULL);
  cn->wsi = NULL;
  if (cn->stage != KC_GONE)
    ce__kube_conn_stage(cn, KC_GONE);
  ce__kube_conn_maybe_free(cn);
}

/* Ends what the conn is doing now: its wsi is killed (its terminal
 * callback then ends the conn); a resolution is cancelled and a step to
 * the next address hurried (their callbacks end it). */
static void conn_stop(conn_t *cn) {
  uv_timer_stop(&cn->timer);
  switch (cn->stage) {
  case KC_CONNECTING:
    /* Never from inside this wsi's callbacks (the first one that comes
     * after the connect makes the stage KC_OPEN, or detaches the wsi), so
     * it can go now; and it must: libwebsockets 4.1 kills a connecting
     * wsi asynchronously without closing its libuv poll handle. Its last
     * callbacks end the conn. */
    if (cn->wsi != NULL)
      lws_set_timeout(cn->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_SYNC);
    break;
  case KC_OPEN:
    if (cn->wsi != NULL)
      lws_set_timeout(cn->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
    break;
  case KC_RESOLVING:
    if (cn->gai_busy)
      uv_cancel((uv_req_t *)&cn->gai);
    break;
  case KC_NEXT:
    /* The step to the next address is already due (0 ms): it sees
     * cn->finished and ends the conn. */
    break;
  default:
    break;
  }
}

void ce__kube_conn_drop(conn_t *cn) {
  if (cn->finished)
    return;
  cn->finished = true;
  conn_stop(cn);
}

void ce__kube_conn_finish(conn_t *cn, int err, const char *fmt, ...) {
  if (cn->finished)
    return;
  cn->finished = true;
  char msg[CE_KUBE_MSG_MAX];
  msg[0] = '\0';
  if (fmt != NULL) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
  }
  if (cn->kind == K_HTTP) {
    ce_kube_http_res_t r = {.err = err, .msg = msg, .status = cn->status,
                            .content_type = cn->resp_ctype,
                            .body = cn->resp.p != NULL ? cn->resp.p : "",
                            .body_len = cn->resp.n};
    cn->hcb(cn->harg, &r);
  } else if (cn->kind == K_EXEC) {
    ce_kube_exec_res_t r = {.err = err, .msg = msg, .protocol = cn->protocol,
                            .out = cn->out.p != NULL ? cn->out.p : "", .out_len = cn->out.n,
                            .errout = cn->errout.p != NULL ? cn->errout.p : "",
                            .err_len = cn->errout.n, .out_dropped = cn->out_dropped,
                            .err_dropped = cn->err_dropped};
    json_t *status = NULL;
    if (err == CE_OK && cn->st.n > 0) {
      status = json_loadb(cn->st.p, cn->st.n, 0, NULL);
      if (status == NULL) {
        r.err = CE_EPROTO;
        r.msg = "exec: the status channel did not carry JSON";
      }
    }
    r.status = status;
    r.has_exit = status != NULL && ce_kube_exit_code(status, &r.exit_code);
    cn->ecb(cn->earg, &r);
    json_decref(status);
  } else if (cn->kind == K_TUNNEL && err != CE_OK && msg[0] != '\0' && cn->fwd != NULL &&
             !cn->fwd->closing) {
    cn->fwd->cb(cn->fwd->arg, cn->fwd->id, msg);
  }
  conn_stop(cn);
}

static void on_conn_timeout(uv_timer_t *t) {
  conn_t *cn = t->data;
  ce__kube_conn_finish(cn, CE_ETIMEDOUT, "%s: no answer within %u ms",
                       cn->kind == K_EXEC ? "kube_exec" : "kube_request", cn->timeout_ms);
}

void ce__kube_conn_arm(conn_t *cn) {
  if (cn->timeout_ms > 0)
    uv_timer_start(&cn->timer, on_conn_timeout, cn->timeout_ms, 0);
}

/* An error before any HTTP answer on a server that was reached: TLS, a
 * connection that ended. */
void ce__kube_conn_connect_error(conn_t *cn, const char *why) {
  char s[CE__KUBE_SHOWN_MAX];
  const char *w = why != NULL ? why : "connection failed";
  const char *server = cn->k != NULL ? cn->k->cfg.server : "?";
  if (cn->tls_err[0] != '\0')
    ce__kube_conn_finish(cn, CE_ETLS, "%s: TLS: %s", server, cn->tls_err);
  else if (strstr(w, "SSL") != NULL || strstr(w, "ssl") != NULL || strstr(w, "tls") != NULL ||
           strstr(w, "TLS") != NULL)
    ce__kube_conn_finish(cn, CE_ETLS, "%s: TLS: %s", server, ce__kube_shown(s, w));
  else
    ce__kube_conn_finish(cn, CE_EUNAVAIL, "%s: cannot connect: %s", server,
                         ce__kube_shown(s, w));
}

void ce__kube_conn_fail_early(conn_t *cn, int code, const char *msg) {
  ce__kube_conn_finish(cn, code, "%s", msg);
  if (cn->kind == K_TUNNEL) {
    cn->failed = true;
    ce__kube_tunnel_close_local(cn);
  }
  ce__kube_conn_lws_gone(cn);
}

/* ---- the callback ---------------------------------------------------------------------- */

/* The HTTP status of a refused upgrade as our error code. */
static int upgrade_code(int status) {
  if (status == 401 || status == 403)
    return CE_EPERM;
  if (status == 404)
    return CE_ENOENT;
  return CE_EPROTO;
}

/* Callbacks that only come once the server was reached (TLS done, or an
 * answer). */
static bool reached(enum lws_callback_reasons reason) {
  switch (reason) {
  case LWS_CALLBACK_OPENSSL_PERFORM_SERVER_CERT_VERIFICATION:
  case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER:
  case LWS_CALLBACK_ESTABLISHED_CLIENT_HTTP:
  case LWS_CALLBACK_CLIENT_FILTER_PRE_ESTABLISH:
  case LWS_CALLBACK_CLIENT_ESTABLISHED:
    return true;
  default:
    return false;
  }
}

/* The wsi failed (or ended) with no answer. Before the server was
 * reached another address may be tried; after, it is the error. */
static void conn_wsi_failed(conn_t *cn, const char *why) {
  if (cn->stage == KC_CONNECTING && cn->tls_err[0] == '\0' && ce__kube_connect_failed(cn, why))
    return; /* the next address: this wsi is no longer the conn's */
  if (!cn->finished)
    ce__kube_conn_connect_error(cn, why);
  if (cn->kind == K_TUNNEL) {
    cn->failed = true;
    ce__kube_tunnel_close_local(cn);
  }
  ce__kube_conn_lws_gone(cn);
}

static int kube_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                   size_t len) {
  if (ce__kube_trace_on())
    fprintf(stderr, "condukt-egress port: kube: wsi %p reason %d len %zu conn %p\n",
            (void *)wsi, (int)reason, len, wsi != NULL ? lws_get_opaque_user_data(wsi) : NULL);
  conn_t *cn = wsi != NULL ? lws_get_opaque_user_data(wsi) : NULL;
  if (cn == NULL) {
    /* No operation to check the certificate for: refused. */
    if (reason == LWS_CALLBACK_OPENSSL_PERFORM_SERVER_CERT_VERIFICATION) {
      X509_STORE_CTX_set_error((X509_STORE_CTX *)user, X509_V_ERR_APPLICATION_VERIFICATION);
      return 1;
    }
    return 0;
  }
  /* Not ci.pwsi: libwebsockets clears that pointer at the upgrade. */
  cn->wsi = wsi;
  if (cn->k == NULL) {
    /* The handle was closed under a live connection: end it. */
    switch (reason) {
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
    case LWS_CALLBACK_CLOSED_CLIENT_HTTP:
    case LWS_CALLBACK_CLIENT_CLOSED:
    case LWS_CALLBACK_WSI_DESTROY:
      if (cn->kind == K_TUNNEL)
        ce__kube_tunnel_close_local(cn);
      ce__kube_conn_lws_gone(cn);
      return 0;
    case LWS_CALLBACK_OPENSSL_PERFORM_SERVER_CERT_VERIFICATION:
      return 1;
    default:
      return -1;
    }
  }
  if (cn->stage == KC_CONNECTING && reached(reason))
    ce__kube_connect_reached(cn);
  switch (reason) {
  case LWS_CALLBACK_OPENSSL_PERFORM_SERVER_CERT_VERIFICATION:
    return ce__kube_tls_verify(cn, (X509_STORE_CTX *)user, (int)len);
  case LWS_CALLBACK_CLIENT_CONNECTION_ERROR: {
    int status = (int)lws_http_client_http_response(wsi);
    bool exec_auth = cn->k->cfg.auth == CE_KUBE_AUTH_EXEC;
    if (status == 401 && exec_auth && cn->kind == K_TUNNEL && cn->k->cred_valid) {
      /* A tunnel is not retried (its client is waiting): the next
       * connection runs the plugin again. */
      ce_kube_cred_free(&cn->k->cred);
      cn->k->cred_valid = false;
    }
    if (status == 401 && cn->kind == K_EXEC && exec_auth && cn->try == TRY_FIRST) {
      ce__kube_retry_after_401(cn);
    } else if (status >= 200 && cn->kind != K_HTTP) {
      ce__kube_conn_finish(cn, upgrade_code(status),
                           "%s: the API server refused the WebSocket upgrade with HTTP %d",
                           cn->kind == K_EXEC ? "kube_exec" : "port-forward", status);
    } else {
      char why[200];
      ce_text_sanitize(why, sizeof(why), in != NULL ? (const char *)in : "",
                       in != NULL ? strnlen((const char *)in, 512) : 0, 0);
      conn_wsi_failed(cn, why);
      return 0;
    }
    if (cn->kind == K_TUNNEL) {
      cn->failed = true;
      ce__kube_tunnel_close_local(cn);
    }
    ce__kube_conn_lws_gone(cn);
    return 0;
  }
  case LWS_CALLBACK_WSI_DESTROY:
    conn_wsi_failed(cn, "the connection ended");
    return 0;
  default:
    break;
  }
  if (reason == LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER && cn->kind != K_HTTP) {
    unsigned char **p = (unsigned char **)in;
    return ce__kube_add_auth_header(cn, wsi, p, *p + len);
  }
  switch (cn->kind) {
  case K_HTTP:
    return ce__kube_http_cb(cn, wsi, reason, in, len);
  case K_EXEC:
    return ce__kube_exec_cb(cn, wsi, reason, in, len);
  default:
    return ce__kube_tunnel_cb(cn, wsi, reason, in, len);
  }
}

void ce__kube_conn_connect(conn_t *cn, const char *address) {
  ce_kube_t *k = cn->k;
  struct lws_client_connect_info ci;
  memset(&ci, 0, sizeof(ci));
  /* Every attempt of one operation goes through the vhost (and TLS
   * context) it started on, even if a new credential made another. */
  if (cn->ctx == NULL && SSL_CTX_up_ref(k->vh.ctx) == 1) {
    cn->ctx = k->vh.ctx;
    cn->vh = k->vh.vh;
  }
  if (cn->ctx == NULL) {
    ce__kube_conn_fail_early(cn, CE_ENOMEM, "out of memory");
    return;
  }
  ci.context = k->c->lws;
  ci.vhost = cn->vh;
  ci.address = address;
  ci.port = (int)k->cfg.port;
  ci.path = cn->url;
  ci.host = cn->hosthdr;
  ci.origin = cn->hosthdr;
  ci.alpn = "http/1.1";
  /* A redirect is never followed (the bearer token would go along): a
   * 3xx is the answer. */
  ci.ssl_connection = LCCSCF_USE_SSL | LCCSCF_SKIP_SERVER_CERT_HOSTNAME_CHECK |
                      LCCSCF_HTTP_NO_FOLLOW_REDIRECT;
  if (k->cfg.insecure)
    ci.ssl_connection |= LCCSCF_ALLOW_SELFSIGNED | LCCSCF_ALLOW_EXPIRED | LCCSCF_ALLOW_INSECURE;
  if (cn->kind == K_HTTP) {
    ci.method = cn->method;
    ci.protocol = "kube-http";
  } else {
    ci.protocol = cn->kind == K_EXEC ? "v5.channel.k8s.io,v4.channel.k8s.io"
                                     : "v4.channel.k8s.io";
    ci.local_protocol_name = "kube-ws";
  }
  ci.opaque_user_data = cn;
  /* libwebsockets may call back (and fail the attempt) before it
   * returns: the guard keeps the conn alive until then. */
  cn->in_connect = true;
  struct lws *w = lws_client_connect_via_info(&ci);
  cn->in_connect = false;
  if (cn->stage == KC_GONE) {
    ce__kube_conn_maybe_free(cn);
    return;
  }
  if (cn->stage != KC_CONNECTING)
    return; /* failed inside, and went on to the next address */
  if (w != NULL) {
    cn->wsi = w;
    return;
  }
  cn->wsi = NULL;
  conn_wsi_failed(cn, "libwebsockets could not start the connection");
}

/* ---- handles --------------------------------------------------------------------------- */

ce_kube_client_t *ce_kube_client_new(uv_loop_t *loop) {
  ce_kube_client_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return NULL;
  c->loop = loop;
  c->next_kube = 1;
  c->next_fchan = 1;
  return c;
}

int ce_kube_open(ce_kube_client_t *c, ce_kube_config_t *cfg, ce_kube_t **out, char *err,
                 size_t errlen) {
  *out = NULL;
  int rc = ensure_context(c, err, errlen);
  if (rc != CE_OK) {
    ce_kube_config_free(cfg);
    return rc;
  }
  ce_kube_t *k = calloc(1, sizeof(*k));
  if (k == NULL) {
    ce_kube_config_free(cfg);
    return ce__kube_efmt(err, errlen, CE_ENOMEM, "kube_open: out of memory");
  }
  k->c = c;
  k->id = c->next_kube++;
  k->cfg = *cfg;
  memset(cfg, 0, sizeof(*cfg));
  char why[300];
  rc = ce__kube_make_vhost(k, k->cfg.cert_pem, k->cfg.cert_len, k->cfg.key_pem,
                           k->cfg.key_len, &k->vh, why, sizeof(why));
  if (rc != CE_OK) {
    ce_kube_config_free(&k->cfg);
    free(k);
    return ce__kube_efmt(err, errlen, CE_ETLS, "kube_open: %s", why);
  }
  k->next = c->kubes;
  c->kubes = k;
  *out = k;
  return CE_OK;
}

ce_kube_t *ce_kube_find(ce_kube_client_t *c, uint64_t id) {
  for (ce_kube_t *k = c->kubes; k != NULL; k = k->next)
    if (k->id == id)
      return k;
  return NULL;
}

uint64_t ce_kube_id(const ce_kube_t *k) { return k->id; }

const ce_kube_config_t *ce_kube_config(const ce_kube_t *k) { return &k->cfg; }

static void kube_free(ce_kube_t *k) {
  ce_kube_client_t *c = k->c;
  for (ce_kube_t **pp = &c->kubes; *pp != NULL; pp = &(*pp)->next)
    if (*pp == k) {
      *pp = k->next;
      break;
    }
  for (fwd_t *f = c->fwds, *nx; f != NULL; f = nx) {
    nx = f->next;
    if (f->k == k)
      ce__kube_fwd_close(f);
  }
  ce__kube_creds_close(k);
  /* Running conns end with closed; they no longer point at k. */
  for (conn_t *cn = k->conns, *nx; cn != NULL; cn = nx) {
    nx = cn->next;
    ce__kube_conn_finish(cn, CE_ECLOSED, "kube: the handle was closed");
    if (cn->kind == K_TUNNEL) {
      cn->failed = true;
      ce__kube_tunnel_close_local(cn);
    }
    cn->k = NULL;
    cn->next = NULL;
    if (cn->wsi == NULL)
      ce__kube_conn_lws_gone(cn);
  }
  k->conns = NULL;
  for (size_t i = 0; i < k->n_old_vh; i++)
    vhost_drop(c, &k->old_vh[i]);
  free(k->old_vh);
  vhost_drop(c, &k->vh);
  ce_kube_config_free(&k->cfg);
  free(k);
}

void ce_kube_close(ce_kube_t *k) { kube_free(k); }

void ce_kube_client_destroy(ce_kube_client_t *c) {
  if (c == NULL)
    return;
  c->destroying = true;
  while (c->fwds != NULL)
    ce__kube_fwd_close(c->fwds);
  /* Conns forget their wsi first: libwebsockets' own teardown then finds
   * no user data to call back into. */
  for (ce_kube_t *k = c->kubes; k != NULL; k = k->next)
    for (conn_t *cn = k->conns; cn != NULL; cn = cn->next)
      if (cn->wsi != NULL && cn->stage != KC_GONE) {
        lws_set_opaque_user_data(cn->wsi, NULL);
        cn->wsi = NULL;
      }
  while (c->kubes != NULL) {
    ce_kube_t *k = c->kubes;
    for (conn_t *cn = k->conns; cn != NULL; cn = cn->next)
      ce__kube_conn_stage(cn, KC_GONE);
    kube_free(k);
  }
  /* With a foreign loop this only starts: libwebsockets closes its libuv
   * handles as the loop runs on; ce_kube_client_free() finishes. */
  if (c->lws != NULL)
    lws_context_destroy(c->lws);
}

void ce_kube_client_free(ce_kube_client_t *c) {
  if (c == NULL)
    return;
  if (c->lws != NULL)
    lws_context_destroy(c->lws);
  for (size_t i = 0; i < c->n_held; i++)
    SSL_CTX_free(c->held[i]);
  free(c->held);
  free(c);
}

