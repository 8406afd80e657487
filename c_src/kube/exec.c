/*
 * pods/exec over WebSocket (ce_kube_exec, internal.h): the command's
 * URL, stdin sent in frames of CE_KUBE_STDIN_FRAME bytes on channel 0
 * (and closed with {255, 0} on v5.channel.k8s.io), stdout and stderr kept
 * up to max_output each, the Status of the error channel turned into an
 * exit code when the stream ends.
 */
#include "kube/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static void exec_keep(conn_t *cn, buf_t *b, uint64_t *dropped, const uint8_t *d, size_t n) {
  size_t room = 0;
  size_t total = cn->out.n + cn->errout.n;
  if (b->n < cn->max_output && total < CE_KUBE_EXEC_OUTPUT_TOTAL) {
    room = cn->max_output - b->n;
    if (room > CE_KUBE_EXEC_OUTPUT_TOTAL - total)
      room = CE_KUBE_EXEC_OUTPUT_TOTAL - total;
  }
  size_t keep = n < room ? n : room;
  if (keep > 0 && !ce__kube_buf_add(b, d, keep))
    keep = 0;
  *dropped += n - keep;
}

static int exec_rx(conn_t *cn, struct lws *wsi, const uint8_t *d, size_t n) {
  if (!cn->in_msg) {
    unsigned chan;
    const uint8_t *data;
    size_t dl;
    if (!ce_kube_frame_split(d, n, &chan, &data, &dl))
      return 0; /* an empty message: nothing */
    cn->cur_chan = chan;
    cn->in_msg = true;
    d = data;
    n = dl;
  }
  if (lws_is_final_fragment(wsi) && lws_remaining_packet_payload(wsi) == 0)
    cn->in_msg = false;
  switch (cn->cur_chan) {
  case CE_KUBE_CH_STDOUT:
    exec_keep(cn, &cn->out, &cn->out_dropped, d, n);
    break;
  case CE_KUBE_CH_STDERR:
    exec_keep(cn, &cn->errout, &cn->err_dropped, d, n);
    break;
  case CE_KUBE_CH_ERROR:
    if (cn->st.n + n > CE_KUBE_STATUS_MAX || !ce__kube_buf_add(&cn->st, d, n)) {
      ce__kube_conn_finish(cn, CE_EPROTO, "kube_exec: the status channel carried over %u bytes",
                           CE_KUBE_STATUS_MAX);
      return -1;
    }
    break;
  default:
    break;
  }
  return 0;
}

static int exec_write(conn_t *cn, struct lws *wsi) {
  if (cn->stdin_state != STDIN_SENDING)
    return 0;
  bool v5 = strcmp(cn->protocol, "v5.channel.k8s.io") == 0;
  if (cn->stdin_sent < cn->stdin_len) {
    size_t n = cn->stdin_len - cn->stdin_sent;
    if (n > CE_KUBE_STDIN_FRAME)
      n = CE_KUBE_STDIN_FRAME;
    unsigned char *b = malloc(LWS_PRE + 1 + n);
    if (b == NULL)
      return -1;
    b[LWS_PRE] = CE_KUBE_CH_STDIN;
    memcpy(b + LWS_PRE + 1, cn->stdin_data + cn->stdin_sent, n);
    int w = lws_write(wsi, b + LWS_PRE, n + 1, LWS_WRITE_BINARY);
    free(b);
    if (w < 0)
      return -1;
    cn->stdin_sent += n;
    lws_callback_on_writable(wsi);
    return 0;
  }
  if (v5) {
    unsigned char b[LWS_PRE + 2];
    b[LWS_PRE] = CE_KUBE_CH_CLOSE;
    b[LWS_PRE + 1] = CE_KUBE_CH_STDIN;
    if (lws_write(wsi, b + LWS_PRE, 2, LWS_WRITE_BINARY) < 0)
      return -1;
  }
  cn->stdin_state = STDIN_CLOSED;
  return 0;
}

int ce__kube_exec_cb(conn_t *cn, struct lws *wsi, enum lws_callback_reasons reason, void *in,
                   size_t len) {
  switch (reason) {
  case LWS_CALLBACK_CLIENT_FILTER_PRE_ESTABLISH:
    /* The response headers are still there: the chosen subprotocol. */
    if (lws_hdr_copy(wsi, cn->protocol, sizeof(cn->protocol), WSI_TOKEN_PROTOCOL) < 0)
      cn->protocol[0] = '\0';
    /* Fail closed: the framing (stdin close, the status channel) depends
     * on the version, and a server that agreed none of ours speaks
     * something else (RFC 6455 §4.1: the client fails the connection). */
    if (strcmp(cn->protocol, "v5.channel.k8s.io") != 0 &&
        strcmp(cn->protocol, "v4.channel.k8s.io") != 0) {
      ce__kube_conn_finish(cn, CE_EPROTO,
                           "kube_exec: the API server agreed the subprotocol \"%s\", not "
                           "v5.channel.k8s.io or v4.channel.k8s.io",
                           cn->protocol);
      return -1;
    }
    return 0;
  case LWS_CALLBACK_CLIENT_ESTABLISHED:
    if (cn->stdin_state == STDIN_SENDING)
      lws_callback_on_writable(wsi);
    return 0;
  case LWS_CALLBACK_CLIENT_RECEIVE:
    if (cn->finished)
      return -1;
    return exec_rx(cn, wsi, in, len);
  case LWS_CALLBACK_CLIENT_WRITEABLE:
    if (cn->finished)
      return -1;
    return exec_write(cn, wsi);
  case LWS_CALLBACK_CLIENT_CLOSED:
    ce__kube_conn_finish(cn, CE_OK, NULL);
    ce__kube_conn_lws_gone(cn);
    return 0;
  default:
    return 0;
  }
}

int ce_kube_exec(ce_kube_t *k, const ce_kube_exec_req_t *req, ce_kube_exec_cb cb, void *arg,
                 char *err, size_t errlen) {
  size_t used = 0;
  char *u = ce__kube_pod_url(k, req->ns, req->pod, "/exec?container=", &used);
  if (u == NULL)
    return ce__kube_efmt(err, errlen, CE_ENOMEM, "kube_exec: out of memory");
  const size_t cap = CE__KUBE_URL_MAX;
  bool ok = ce__kube_url_escape(u, cap, &used, req->container);
  for (size_t i = 0; ok && i < req->argc; i++)
    ok = ce__kube_url_put(u, cap, &used, "&command=") &&
         ce__kube_url_escape(u, cap, &used, req->argv[i]);
  ok = ok && ce__kube_url_put(u, cap, &used, req->has_stdin ? "&stdin=true" : "") &&
       ce__kube_url_put(u, cap, &used, "&stdout=true&stderr=true");
  if (!ok) {
    free(u);
    return ce__kube_efmt(err, errlen, CE_ETOOBIG,
                         "kube_exec: the command makes a URL over %u bytes", CE__KUBE_URL_MAX);
  }
  conn_t *cn = ce__kube_conn_new(k, K_EXEC);
  if (cn == NULL) {
    free(u);
    return ce__kube_efmt(err, errlen, CE_ENOMEM, "kube_exec: out of memory");
  }
  cn->url = u;
  cn->ecb = cb;
  cn->earg = arg;
  cn->timeout_ms = req->timeout_ms;
  cn->max_output = req->max_output;
  cn->stdin_state = req->has_stdin ? STDIN_SENDING : STDIN_NONE;
  if (req->has_stdin) {
    cn->stdin_data = malloc(req->stdin_len + 1);
    if (cn->stdin_data == NULL) {
      ce__kube_conn_drop(cn);
      ce__kube_conn_lws_gone(cn);
      return ce__kube_efmt(err, errlen, CE_ENOMEM, "kube_exec: out of memory");
    }
    memcpy(cn->stdin_data, req->stdin_data, req->stdin_len);
    cn->stdin_len = req->stdin_len;
  }
  ce__kube_conn_start(cn);
  return CE_OK;
}
