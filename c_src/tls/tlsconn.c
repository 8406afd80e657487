/*
 * TLS over memory BIOs (see tlsconn.h, docs/tls.md).
 *
 * Two plain memory BIOs rather than a BIO pair: the read BIO holds the
 * ciphertext the proxy fed, the write BIO collects what OpenSSL wants
 * sent. Neither ever blocks, so OpenSSL's only "retry" answer is
 * SSL_ERROR_WANT_READ (the read BIO is empty), which becomes CE_EAGAIN;
 * the read BIO is told to report "retry" rather than end of file when
 * empty, since more bytes may come from the socket.
 *
 * Failures are classified from three sources, most specific first: the
 * verification result (our side refused the peer's certificate), a fatal
 * alert the peer sent (seen by the info callback, or as an SSL_R_*ALERT*
 * reason in the error queue, reasons SSL_AD_REASON_OFFSET + alert), and
 * finally OpenSSL's own reason string.
 */
#include "tls/tlsconn.h"

#include <limits.h>
#include <openssl/buffer.h>
#include <openssl/err.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

struct ce_tlsconn {
  SSL *ssl;
  BIO *rbio, *wbio;        /* owned by ssl */
  bool server;
  bool failed;
  bool rejected;
  int alert_in;            /* last fatal alert received, or -1 */
  bool alert_in_handshake; /* ... and whether it answered the handshake */
  bool got_data;           /* application data has been read */
  char error[CE_TLSCONN_ERROR_MAX];
};

static CRYPTO_ONCE conn_once = CRYPTO_ONCE_STATIC_INIT;
static int conn_index = -1;

static void conn_index_init(void) {
  conn_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

static int conn_index_get(void) {
  if (!CRYPTO_THREAD_run_once(&conn_once, conn_index_init))
    return -1;
  return conn_index;
}

/* True while an alert from the peer still judges the handshake. For the
 * client role that lasts until the first application data: a TLS 1.3
 * server checks the client's certificate (or its absence) only after the
 * client has sent its Finished and considers the handshake complete (RFC
 * 8446 §4.4.2.4), so its certificate_required alert arrives on the
 * client's first read. */
static bool answers_handshake(const ce_tlsconn_t *t) {
  return !SSL_is_init_finished(t->ssl) || (!t->server && !t->got_data);
}

static void info_cb(const SSL *ssl, int where, int ret) {
  if ((where & SSL_CB_READ_ALERT) != SSL_CB_READ_ALERT)
    return;
  /* ret is (level << 8) | description (RFC 8446 §6). Warning alerts
   * (close_notify, and user_canceled before it) end nothing by themselves. */
  if ((ret >> 8) != SSL3_AL_FATAL)
    return;
  ce_tlsconn_t *t = SSL_get_ex_data(ssl, conn_index_get());
  if (t == NULL)
    return;
  t->alert_in = ret & 0xff;
  t->alert_in_handshake = answers_handshake(t);
}

int ce_tlsconn_new(SSL *ssl, bool server, ce_tlsconn_t **out) {
  if (ssl == NULL || out == NULL) {
    SSL_free(ssl);
    return CE_EINVAL;
  }
  int idx = conn_index_get();
  ce_tlsconn_t *t = calloc(1, sizeof(*t));
  BIO *rbio = BIO_new(BIO_s_mem());
  BIO *wbio = BIO_new(BIO_s_mem());
  if (idx < 0 || t == NULL || rbio == NULL || wbio == NULL) {
    BIO_free(rbio);
    BIO_free(wbio);
    free(t);
    SSL_free(ssl);
    ERR_clear_error();
    return CE_ENOMEM;
  }
  /* -1: an empty read BIO means "no bytes yet", not end of stream. */
  BIO_set_mem_eof_return(rbio, -1);
  SSL_set_bio(ssl, rbio, wbio);
  if (SSL_set_ex_data(ssl, idx, t) != 1) {
    SSL_free(ssl); /* frees both BIOs */
    free(t);
    ERR_clear_error();
    return CE_ENOMEM;
  }
  SSL_set_info_callback(ssl, info_cb);
  if (server)
    SSL_set_accept_state(ssl);
  else
    SSL_set_connect_state(ssl);
  t->ssl = ssl;
  t->rbio = rbio;
  t->wbio = wbio;
  t->server = server;
  t->alert_in = -1;
  *out = t;
  return CE_OK;
}

void ce_tlsconn_free(ce_tlsconn_t *t) {
  if (t == NULL)
    return;
  SSL_free(t->ssl);
  free(t);
}

SSL *ce_tlsconn_ssl(ce_tlsconn_t *t) { return t->ssl; }

int ce_tlsconn_feed(ce_tlsconn_t *t, const uint8_t *in, size_t len) {
  if (len == 0)
    return CE_OK;
  if (in == NULL)
    return CE_EINVAL;
  while (len > 0) {
    int chunk = len > INT_MAX ? INT_MAX : (int)len;
    if (BIO_write(t->rbio, in, chunk) != chunk) {
      ERR_clear_error();
      return CE_ENOMEM;
    }
    in += chunk;
    len -= (size_t)chunk;
  }
  return CE_OK;
}

static bool is_rejection_alert(int alert) {
  switch (alert) {
  case SSL_AD_BAD_CERTIFICATE:
  case SSL_AD_UNSUPPORTED_CERTIFICATE:
  case SSL_AD_CERTIFICATE_REVOKED:
  case SSL_AD_CERTIFICATE_EXPIRED:
  case SSL_AD_CERTIFICATE_UNKNOWN:
  case SSL_AD_UNKNOWN_CA:
  case SSL_AD_ACCESS_DENIED:
  /* RFC 8446 §4.4.2.4: a TLS 1.3 server that wants a client certificate
   * and got none; only an upstream sends it to the proxy. */
  case SSL_AD_CERTIFICATE_REQUIRED:
    return true;
  default:
    return false;
  }
}

/* The alert names of the TLS registry (RFC 8446 §6, RFC 5246 §7.2, RFC
 * 7301 §3.2). OpenSSL 3.0's SSL_alert_desc_string_long() calls the TLS 1.3
 * additions, certificate_required among them, "unknown". */
static const char *alert_name(int alert) {
  switch (alert) {
  case 0: return "close_notify";
  case 10: return "unexpected_message";
  case 20: return "bad_record_mac";
  case 22: return "record_overflow";
  case 40: return "handshake_failure";
  case 42: return "bad_certificate";
  case 43: return "unsupported_certificate";
  case 44: return "certificate_revoked";
  case 45: return "certificate_expired";
  case 46: return "certificate_unknown";
  case 47: return "illegal_parameter";
  case 48: return "unknown_ca";
  case 49: return "access_denied";
  case 50: return "decode_error";
  case 51: return "decrypt_error";
  case 70: return "protocol_version";
  case 71: return "insufficient_security";
  case 80: return "internal_error";
  case 86: return "inappropriate_fallback";
  case 90: return "user_canceled";
  case 100: return "no_renegotiation";
  case 109: return "missing_extension";
  case 110: return "unsupported_extension";
  case 112: return "unrecognized_name";
  case 113: return "bad_certificate_status_response";
  case 115: return "unknown_psk_identity";
  case 116: return "certificate_required";
  case 120: return "no_application_protocol";
  default: return "unassigned";
  }
}

static void set_error(ce_tlsconn_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void set_error(ce_tlsconn_t *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->error, sizeof(t->error), fmt, ap);
  va_end(ap);
}

/* Records the failure of the SSL call that returned ssl_err, and empties
 * the error queue. Returns CE_ETLS. */
static int fail(ce_tlsconn_t *t, int ssl_err) {
  unsigned long e = ERR_peek_error();
  int reason = ERR_GET_LIB(e) == ERR_LIB_SSL ? ERR_GET_REASON(e) : 0;
  int alert = -1;
  bool alert_in_handshake = false;
  if (t->alert_in >= 0) {
    alert = t->alert_in;
    alert_in_handshake = t->alert_in_handshake;
  } else if (reason > SSL_AD_REASON_OFFSET &&
             reason < SSL_AD_REASON_OFFSET + 256) {
    alert = reason - SSL_AD_REASON_OFFSET;
    alert_in_handshake = answers_handshake(t);
  }

  if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
    long vr = SSL_get_verify_result(t->ssl);
    set_error(t, "certificate verify failed: %s",
              vr != X509_V_OK ? X509_verify_cert_error_string(vr)
                              : "no reason given");
  } else if (alert >= 0) {
    set_error(t, "the peer sent fatal alert %s (%d)", alert_name(alert), alert);
  } else if (ssl_err == SSL_ERROR_ZERO_RETURN) {
    set_error(t, "the peer closed the connection during the handshake");
  } else if (e != 0) {
    const char *why = ERR_reason_error_string(e);
    if (why != NULL)
      set_error(t, "TLS failure: %s", why);
    else
      set_error(t, "TLS failure: OpenSSL error %lu", e);
  } else {
    set_error(t, "TLS failure (SSL error %d)", ssl_err);
  }
  t->rejected = alert >= 0 && alert_in_handshake && is_rejection_alert(alert);
  t->failed = true;
  ERR_clear_error();
  return CE_ETLS;
}

/* Before and after each call on the data path: ERR_clear_error() resets
 * every slot of the thread's error queue, a visible cost per record
 * (bench/README.md); the queue is empty on the fast path, which
 * ERR_peek_error() tells cheaply. */
static void clear_errors(void) {
  if (ERR_peek_error() != 0)
    ERR_clear_error();
}

int ce_tlsconn_handshake(ce_tlsconn_t *t) {
  if (t->failed)
    return CE_ETLS;
  if (SSL_is_init_finished(t->ssl))
    return CE_OK;
  clear_errors();
  int r = SSL_do_handshake(t->ssl);
  if (r == 1) {
    clear_errors();
    return CE_OK;
  }
  int e = SSL_get_error(t->ssl, r);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    clear_errors();
    return CE_EAGAIN;
  }
  return fail(t, e);
}

int ce_tlsconn_read(ce_tlsconn_t *t, uint8_t *buf, size_t cap, size_t *n) {
  if (buf == NULL || n == NULL || cap == 0)
    return CE_EINVAL;
  if (t->failed)
    return CE_ETLS;
  clear_errors();
  size_t got = 0;
  int r = SSL_read_ex(t->ssl, buf, cap, &got);
  if (r == 1) {
    clear_errors();
    t->got_data = true;
    *n = got;
    return CE_OK;
  }
  int e = SSL_get_error(t->ssl, r);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    clear_errors();
    return CE_EAGAIN;
  }
  /* ZERO_RETURN after the handshake is the peer's close_notify, a clean
   * end (RFC 8446 §6.1); before it, fail() reports an aborted handshake. */
  if (e == SSL_ERROR_ZERO_RETURN && SSL_is_init_finished(t->ssl)) {
    clear_errors();
    return CE_ECLOSED;
  }
  return fail(t, e);
}

int ce_tlsconn_write(ce_tlsconn_t *t, const uint8_t *buf, size_t len) {
  if (t->failed)
    return CE_ETLS;
  if (len == 0)
    return CE_OK;
  if (buf == NULL || !SSL_is_init_finished(t->ssl))
    return CE_EINVAL;
  if ((SSL_get_shutdown(t->ssl) & SSL_SENT_SHUTDOWN) != 0)
    return CE_ECLOSED;
  clear_errors();
  size_t written = 0;
  /* Without SSL_MODE_ENABLE_PARTIAL_WRITE, SSL_write_ex succeeds only once
   * all of buf is encrypted; the memory BIO never pushes back. */
  int r = SSL_write_ex(t->ssl, buf, len, &written);
  if (r == 1 && written == len) {
    clear_errors();
    return CE_OK;
  }
  return fail(t, SSL_get_error(t->ssl, r));
}

void ce_tlsconn_shutdown(ce_tlsconn_t *t) {
  if (t->failed || !SSL_is_init_finished(t->ssl) ||
      (SSL_get_shutdown(t->ssl) & SSL_SENT_SHUTDOWN) != 0)
    return;
  clear_errors();
  /* Returns 0 (our close_notify queued, the peer's not yet seen); the
   * proxy does not wait for the peer's, as RFC 8446 §6.1 allows. */
  (void)SSL_shutdown(t->ssl);
  clear_errors();
}

size_t ce_tlsconn_pending_out(ce_tlsconn_t *t) {
  return BIO_ctrl_pending(t->wbio);
}

size_t ce_tlsconn_take_out(ce_tlsconn_t *t, uint8_t *buf, size_t cap) {
  if (buf == NULL || cap == 0)
    return 0;
  int want = cap > INT_MAX ? INT_MAX : (int)cap;
  int got = BIO_read(t->wbio, buf, want);
  return got > 0 ? (size_t)got : 0;
}

/* The room of an empty memory BIO, 0 when it holds bytes. */
static size_t bio_room(BIO *b);

static size_t empty_bio_room(BIO *b) {
  if (BIO_ctrl_pending(b) != 0)
    return 0;
  return bio_room(b);
}

/* The room of a memory BIO, filled or not. */
static size_t bio_room(BIO *b) {
  BUF_MEM *bm = NULL;
  BIO_get_mem_ptr(b, &bm);
  return bm != NULL ? bm->max : 0;
}

size_t ce_tlsconn_held(const ce_tlsconn_t *t) {
  if (t == NULL)
    return 0;
  return bio_room(t->rbio) + bio_room(t->wbio);
}

size_t ce_tlsconn_releasable(const ce_tlsconn_t *t) {
  if (t == NULL)
    return 0;
  return empty_bio_room(t->rbio) + empty_bio_room(t->wbio);
}

/* Swaps each empty BIO with more than `keep` bytes of room for a fresh
 * one; a failed allocation keeps the old BIO. */
static void trim_above(ce_tlsconn_t *t, size_t keep) {
  if (t == NULL)
    return;
  if (empty_bio_room(t->rbio) > keep) {
    BIO *nb = BIO_new(BIO_s_mem());
    if (nb != NULL) {
      BIO_set_mem_eof_return(nb, -1);
      SSL_set0_rbio(t->ssl, nb); /* frees the old one */
      t->rbio = nb;
    }
  }
  if (empty_bio_room(t->wbio) > keep) {
    BIO *nb = BIO_new(BIO_s_mem());
    if (nb != NULL) {
      SSL_set0_wbio(t->ssl, nb);
      t->wbio = nb;
    }
  }
  clear_errors();
}

void ce_tlsconn_trim(ce_tlsconn_t *t) { trim_above(t, CE_TLSCONN_BIO_KEEP); }

void ce_tlsconn_release(ce_tlsconn_t *t) { trim_above(t, 0); }

const char *ce_tlsconn_error(const ce_tlsconn_t *t) { return t->error; }

bool ce_tlsconn_peer_rejected_cert(const ce_tlsconn_t *t) { return t->rejected; }

const char *ce_tlsconn_alpn(ce_tlsconn_t *t, size_t *len) {
  const unsigned char *p = NULL;
  unsigned int n = 0;
  SSL_get0_alpn_selected(t->ssl, &p, &n);
  if (len != NULL)
    *len = n;
  return n > 0 ? (const char *)p : NULL;
}
