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

static int seal(side_t *s);

int ce_transport_close_notify(side_t *s) {
  if (s->tls == NULL || !s->handshaken || !s->open)
    return CE_EAGAIN;
  /* The gathered plaintext goes before the close_notify. When it cannot
   * be sealed, the end of the answer is lost: the caller must not end the
   * connection as if it were whole. */
  int rc = seal(s);
  if (rc != CE_OK)
    return rc;
  ce_tlsconn_shutdown(s->tls);
  return CE_OK;
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

/* Hands len bytes of plaintext on: a TLS side seals them into its
 * engine (the records wait in its output until the flush), a plain side
 * writes them to the socket, where they stop being pending. */
static int emit(side_t *s, const char *data, size_t len) {
  if (s->tls != NULL)
    return ce_tlsconn_write(s->tls, (const uint8_t *)data, len) == CE_OK ? CE_OK : CE_ETLS;
  bool direct = s->queued < CE_CONN_HIGH_WATER && !s->close_after_flush;
  /* What the socket does not take is counted again, as bytes of a write
   * request, by conn__wire_send. */
  s->pending -= len;
  s->queued -= len;
  return conn__wire_write(s, data, len, direct) ? CE_OK : CE_ECLOSED;
}

/* Hands the gathered record on. It is emptied first: on a failure the
 * connection is gone, and a close that flushes meanwhile finds nothing. */
static int seal(side_t *s) {
  size_t n = s->rec_len;
  if (n == 0)
    return CE_OK;
  s->rec_len = 0;
  return emit(s, s->rec, n);
}

int ce_transport_seal(side_t *s) { return seal(s); }

int ce_transport_send(side_t *s, const char *data, size_t len) {
  s->queued += len;
  s->pending += len;
  while (len > 0) {
    if (s->rec_len == 0 && len >= CE_CONN_RECORD) {
      /* Whole records straight from the caller's bytes, no copy. */
      size_t n = s->tls != NULL ? len - len % CE_CONN_RECORD : len;
      int rc = emit(s, data, n);
      if (rc != CE_OK)
        return rc;
      data += n;
      len -= n;
      continue;
    }
    if (s->rec == NULL && !conn__take_record(s))
      return emit(s, data, len); /* nothing to gather in: as it comes */
    size_t take = CE_CONN_RECORD - s->rec_len < len ? CE_CONN_RECORD - s->rec_len : len;
    memcpy(s->rec + s->rec_len, data, take);
    s->rec_len += take;
    data += take;
    len -= take;
    if (s->rec_len == CE_CONN_RECORD) {
      int rc = seal(s);
      if (rc != CE_OK)
        return rc;
    }
  }
  return CE_OK;
}

bool ce_transport_has_output(const side_t *s) {
  return s->rec_len > 0 || (s->tls != NULL && ce_tlsconn_pending_out(s->tls) > 0);
}

int ce_transport_flush(side_t *s) {
  int rc = seal(s);
  if (s->tls != NULL && s->open) {
    /* Straight to the socket when no one waits for the completion (see
     * conn__wire_write), through the loop's scratch: one copy out of the
     * engine, none into a write request. */
    bool direct = s->queued < CE_CONN_HIGH_WATER && !s->close_after_flush;
    char *scratch = direct ? conn__wire_scratch(s) : NULL;
    /* The plaintext of the turn is counted from here on as the
     * ciphertext that carries it. */
    s->queued -= s->pending;
    s->pending = 0;
    size_t out;
    while (rc == CE_OK && (out = ce_tlsconn_pending_out(s->tls)) > 0) {
      if (scratch != NULL) {
        size_t n = ce_tlsconn_take_out(s->tls, (uint8_t *)scratch, out < CE_CONN_READ_CHUNK ? out : CE_CONN_READ_CHUNK);
        if (n == 0)
          break;
        if (!conn__wire_write(s, scratch, n, true)) {
          rc = CE_ECLOSED;
          break;
        }
        continue;
      }
      write_req_t *w = conn__wire_new(s, out);
      if (w == NULL) {
        rc = CE_ECLOSED;
        break;
      }
      size_t n = ce_tlsconn_take_out(s->tls, (uint8_t *)w->data, out);
      if (!conn__wire_send(s, w, n)) {
        rc = CE_ECLOSED;
        break;
      }
    }
  }
  /* The record buffer goes back on every way out (seal emptied it). */
  conn__release_record(s);
  return rc;
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
  s->peer_reset = false;
  s->close_notify = false;
  s->shut = SIDE_WRITING;
  s->close_after_flush = false;
  s->in_len = 0;
  s->rec_len = 0;
  conn__release_record(s);
  s->queued -= s->pending;
  s->pending = 0;
}
