/* A side's transport: plain TCP or TLS (proxy/transport.h). */
#include "proxy/transport.h"

#include <string.h>

#include "common/error.h"
#include "proxy/conn_internal.h"
#include "tls/tlsconn.h"

bool ce_transport_ready(const side_t *s) { return s->open && s->connected && (s->tls == NULL || s->handshaken); }

bool ce_transport_clean_end(const side_t *s) { return s->tls == NULL || s->close_notify; }

bool ce_transport_speaks_h2(const side_t *s) {
  size_t n = 0;
  const char *p = s->tls != NULL ? ce_tlsconn_alpn(s->tls, &n) : NULL;
  return p != NULL && n == 2 && memcmp(p, "h2", 2) == 0;
}

bool ce_transport_close_notify(side_t *s) {
  if (s->tls == NULL || !s->handshaken || !s->open)
    return false;
  ce_tlsconn_shutdown(s->tls);
  return true;
}

int ce_transport_received(side_t *s, const char *data, size_t len) {
  if (s->tls != NULL)
    return ce_tlsconn_feed(s->tls, (const uint8_t *)data, len);
  if (len > CE_CONN_INPUT_MAX - s->in_len)
    return CE_ETOOBIG;
  if (!conn__take_input(s))
    return CE_ENOMEM;
  memcpy(s->in + s->in_len, data, len);
  s->in_len += len;
  return CE_OK;
}

size_t ce_transport_read_room(const side_t *s, size_t chunk) {
  if (s->tls == NULL && CE_CONN_INPUT_MAX - s->in_len < chunk)
    return CE_CONN_INPUT_MAX - s->in_len;
  return chunk;
}

bool ce_transport_input_full(const side_t *s) { return s->tls != NULL && s->in_len >= CE_CONN_INPUT_MAX - 1; }

bool ce_transport_handshaking(const side_t *s) { return s->tls != NULL && !s->handshaken; }

int ce_transport_pump(side_t *s) {
  if (s->tls == NULL || !s->handshaken || s->eof)
    return CE_EAGAIN;
  if (s->in_len < CE_CONN_INPUT_MAX && !conn__take_input(s))
    return CE_ENOMEM;
  while (s->in_len < CE_CONN_INPUT_MAX && !s->eof) {
    size_t n = 0;
    int rc = ce_tlsconn_read(s->tls, (uint8_t *)s->in + s->in_len, CE_CONN_INPUT_MAX - s->in_len, &n);
    if (rc == CE_OK) {
      s->in_len += n;
      continue;
    }
    if (rc == CE_EAGAIN)
      break;
    if (rc == CE_ECLOSED) {
      s->eof = true;
      s->close_notify = true;
      break;
    }
    return CE_ETLS;
  }
  return CE_OK;
}

int ce_transport_send(side_t *s, const char *data, size_t len) {
  if (s->tls == NULL) {
    if (len == 0)
      return CE_OK;
    write_req_t *w = conn__wire_new(s, len);
    if (w == NULL)
      return CE_ECLOSED;
    memcpy(w->data, data, len);
    return conn__wire_send(s, w, len) ? CE_OK : CE_ECLOSED;
  }
  if (len > 0 && ce_tlsconn_write(s->tls, (const uint8_t *)data, len) != CE_OK)
    return CE_ETLS;
  size_t pending;
  while ((pending = ce_tlsconn_pending_out(s->tls)) > 0) {
    write_req_t *w = conn__wire_new(s, pending);
    if (w == NULL)
      return CE_ECLOSED;
    size_t n = ce_tlsconn_take_out(s->tls, (uint8_t *)w->data, pending);
    if (!conn__wire_send(s, w, n))
      return CE_ECLOSED;
  }
  return CE_OK;
}

const char *ce_transport_error(const side_t *s) { return s->tls != NULL ? ce_tlsconn_error(s->tls) : ""; }

bool ce_transport_peer_rejected_cert(const side_t *s) {
  return s->tls != NULL && ce_tlsconn_peer_rejected_cert(s->tls);
}

void ce_transport_rest(side_t *s) { ce_tlsconn_trim(s->tls); }

void ce_transport_reset(side_t *s) {
  ce_tlsconn_free(s->tls);
  s->tls = NULL;
  s->connected = false;
  s->handshaken = false;
  s->eof = false;
  s->close_notify = false;
  s->shut = SIDE_WRITING;
  s->close_after_flush = false;
  s->in_len = 0;
}
