/*
 * One REST exchange of the Kubernetes client (ce_kube_request,
 * internal.h): the request's headers and body, the answer's status,
 * content type and body (at most CE_KUBE_BODY_MAX), one exchange per
 * connection.
 */
#include "kube/internal.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

int ce__kube_add_auth_header(conn_t *cn, struct lws *wsi, unsigned char **p, unsigned char *end) {
  if (cn->bearer == NULL)
    return 0;
  size_t tl = strlen(cn->bearer) + 8;
  char *v = malloc(tl);
  if (v == NULL)
    return -1;
  snprintf(v, tl, "Bearer %s", cn->bearer);
  int r = lws_add_http_header_by_name(wsi, (const unsigned char *)"authorization:",
                                      (const unsigned char *)v, (int)strlen(v), p, end);
  OPENSSL_clear_free(v, tl);
  return r != 0 ? -1 : 0;
}

/* The header libwebsockets adds to a request it does not pipeline. */
#define CONN_CLOSE "connection: close\r\n"

int ce__kube_http_cb(conn_t *cn, struct lws *wsi, enum lws_callback_reasons reason, void *in,
                   size_t len) {
  switch (reason) {
  case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
    unsigned char **p = (unsigned char **)in, *end = *p + len;
    char clen[32];
    /* libwebsockets has just written "connection: close" (after the
     * request line and the Host header, so the bytes are there). On that
     * header Go's server answers a request it refuses early (a 403 from
     * the authorization filter) without reading the body, closes, and the
     * body still arriving makes the kernel reset the connection: libuv
     * reports the reset as an error and libwebsockets drops the answer
     * unread. Without it the server reads and discards the body first;
     * the connection is still ours to close after the one exchange. */
    if (memcmp(*p - (sizeof(CONN_CLOSE) - 1), CONN_CLOSE, sizeof(CONN_CLOSE) - 1) == 0)
      *p -= sizeof(CONN_CLOSE) - 1;
    if (ce__kube_add_auth_header(cn, wsi, p, end) != 0)
      return -1;
    if (lws_add_http_header_by_name(wsi, (const unsigned char *)"accept:",
                                    (const unsigned char *)"application/json, */*", 21, p,
                                    end) != 0 ||
        lws_add_http_header_by_name(wsi, (const unsigned char *)"user-agent:",
                                    (const unsigned char *)"condukt", 7, p, end) != 0)
      return -1;
    if (cn->body != NULL) {
      snprintf(clen, sizeof(clen), "%zu", cn->body_len);
      if (lws_add_http_header_by_name(wsi, (const unsigned char *)"content-type:",
                                      (const unsigned char *)cn->ctype,
                                      (int)strlen(cn->ctype), p, end) != 0 ||
          lws_add_http_header_by_name(wsi, (const unsigned char *)"content-length:",
                                      (const unsigned char *)clen, (int)strlen(clen), p,
                                      end) != 0)
        return -1;
      lws_client_http_body_pending(wsi, 1);
      lws_callback_on_writable(wsi);
    }
    return 0;
  }
  case LWS_CALLBACK_CLIENT_HTTP_WRITEABLE: {
    if (cn->body == NULL || cn->body_sent >= cn->body_len)
      return 0;
    size_t n = cn->body_len - cn->body_sent;
    if (n > 16384)
      n = 16384;
    unsigned char *b = malloc(LWS_PRE + n);
    if (b == NULL)
      return -1;
    memcpy(b + LWS_PRE, cn->body + cn->body_sent, n);
    bool last = cn->body_sent + n == cn->body_len;
    int w = lws_write(wsi, b + LWS_PRE, n, last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP);
    free(b);
    if (w < 0)
      return -1;
    cn->body_sent += n;
    if (last)
      lws_client_http_body_pending(wsi, 0);
    else
      lws_callback_on_writable(wsi);
    return 0;
  }
  case LWS_CALLBACK_ESTABLISHED_CLIENT_HTTP:
    cn->status = (int)lws_http_client_http_response(wsi);
    if (lws_hdr_copy(wsi, cn->resp_ctype, sizeof(cn->resp_ctype),
                     WSI_TOKEN_HTTP_CONTENT_TYPE) < 0)
      cn->resp_ctype[0] = '\0';
    if (cn->status == 401 && cn->k->cfg.auth == CE_KUBE_AUTH_EXEC && cn->try == TRY_FIRST)
      cn->try = TRY_FIRST_401;
    return 0;
  case LWS_CALLBACK_RECEIVE_CLIENT_HTTP: {
    char b[LWS_PRE + 4096];
    char *px = b + LWS_PRE;
    int l = (int)sizeof(b) - LWS_PRE;
    if (lws_http_client_read(wsi, &px, &l) < 0)
      return -1;
    return 0;
  }
  case LWS_CALLBACK_RECEIVE_CLIENT_HTTP_READ:
    if (cn->finished)
      return -1;
    if (cn->resp.n + len > CE_KUBE_BODY_MAX) {
      ce__kube_conn_finish(cn, CE_ETOOBIG, "kube_request: the response body is over %u bytes",
                           CE_KUBE_BODY_MAX);
      return -1;
    }
    if (!ce__kube_buf_add(&cn->resp, in, len)) {
      ce__kube_conn_finish(cn, CE_ENOMEM, "kube_request: out of memory for the response");
      return -1;
    }
    return 0;
  case LWS_CALLBACK_COMPLETED_CLIENT_HTTP:
    if (cn->try == TRY_FIRST_401) {
      ce__kube_retry_after_401(cn);
      return -1;
    }
    ce__kube_conn_finish(cn, CE_OK, NULL);
    return -1; /* one exchange per connection */
  case LWS_CALLBACK_CLOSED_CLIENT_HTTP:
    if (cn->try == TRY_FIRST_401 && !cn->finished)
      ce__kube_retry_after_401(cn);
    else if (cn->status != 0)
      ce__kube_conn_finish(cn, CE_EPROTO, "kube_request: the connection closed before the response "
                                 "ended");
    else
      ce__kube_conn_connect_error(cn, "the connection closed before a response");
    ce__kube_conn_lws_gone(cn);
    return 0;
  default:
    return 0;
  }
}


static char *join_url(const ce_kube_t *k, const char *path) {
  size_t n = strlen(k->cfg.path_prefix) + strlen(path) + 1;
  char *u = malloc(n);
  if (u != NULL)
    snprintf(u, n, "%s%s", k->cfg.path_prefix, path);
  return u;
}

int ce_kube_request(ce_kube_t *k, const ce_kube_http_req_t *req, ce_kube_http_cb cb,
                    void *arg, char *err, size_t errlen) {
  if (strlen(req->path) + strlen(k->cfg.path_prefix) > CE__KUBE_URL_MAX)
    return ce__kube_efmt(err, errlen, CE_ETOOBIG, "kube_request: the path is over %u bytes",
                         CE__KUBE_URL_MAX);
  conn_t *cn = ce__kube_conn_new(k, K_HTTP);
  if (cn == NULL)
    return ce__kube_efmt(err, errlen, CE_ENOMEM, "kube_request: out of memory");
  snprintf(cn->method, sizeof(cn->method), "%s", req->method);
  cn->hcb = cb;
  cn->harg = arg;
  cn->timeout_ms = req->timeout_ms;
  cn->url = join_url(k, req->path);
  bool oom = cn->url == NULL;
  if (req->body != NULL) {
    cn->body = malloc(req->body_len + 1);
    cn->ctype = strdup(req->content_type != NULL ? req->content_type : "application/json");
    oom = oom || cn->body == NULL || cn->ctype == NULL;
    if (cn->body != NULL)
      memcpy(cn->body, req->body, req->body_len);
    cn->body_len = req->body_len;
  }
  if (oom) {
    ce__kube_conn_drop(cn);
    ce__kube_conn_lws_gone(cn);
    return ce__kube_efmt(err, errlen, CE_ENOMEM, "kube_request: out of memory");
  }
  ce__kube_conn_start(cn);
  return CE_OK;
}
