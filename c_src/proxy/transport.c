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
  if (s->tls == NULL)
    return CE_EINVAL;
  return ce_tlsconn_feed(s->tls, (const uint8_t *)data, len);
}

void ce_transport_rest(side_t *s) { ce_tlsconn_trim(s->tls); }

void ce_transport_reset(side_t *s) {
  ce_tlsconn_free(s->tls);
  s->tls = NULL;
  s->connected = false;
  s->handshaken = false;
  s->eof = false;
  s->close_notify = false;
  s->shut = false;
  s->shut_done = false;
  s->close_after_flush = false;
  s->in_len = 0;
}
