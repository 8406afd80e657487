/*
 * The upstream session store (see sesscache.h, docs/proxy.md).
 *
 * A small array searched linearly: at most CE_TLS_SESSCACHE_MAX tickets,
 * one scan per new upstream connection and per ticket received, next to a
 * handshake that costs a hundred times more. OpenSSL calls new_session()
 * for every ticket the upstream sends after the handshake
 * (SSL_SESS_CACHE_CLIENT without its internal store); it decides whether
 * the session may be kept.
 */
#include "tls/sesscache.h"

#include <openssl/x509_vfy.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

#define HOST_MAX 254u /* 253 bytes and the NUL */

typedef struct {
  char host[HOST_MAX];
  uint16_t port;
  uint8_t alpn_len;
  unsigned char alpn[CE_TLS_SESSCACHE_ALPN_MAX];
} key_t_;

typedef struct {
  key_t_ key;
  SSL_SESSION *sess; /* NULL: free slot */
  uint64_t stamp;    /* when stored; the smallest goes first */
} entry_t;

typedef struct {
  size_t max;
  uint64_t clock;
  entry_t entries[];
} store_t;

static CRYPTO_ONCE once = CRYPTO_ONCE_STATIC_INIT;
static int ctx_index = -1;
static int ssl_index = -1;

static void store_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                       void *argp) {
  store_t *s = ptr;
  if (s == NULL)
    return;
  for (size_t i = 0; i < s->max; i++)
    SSL_SESSION_free(s->entries[i].sess);
  free(s);
}

static void key_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                     void *argp) {
  free(ptr);
}

/* An SSL_dup'd SSL would share the key pointer: give it none (it then
 * stores nothing), so the two never free the same key. */
static int key_dup(CRYPTO_EX_DATA *to, const CRYPTO_EX_DATA *from, void **from_d, int idx,
                   long argl, void *argp) {
  *from_d = NULL;
  return 1;
}

static void indexes_init(void) {
  ctx_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, store_free);
  ssl_index = SSL_get_ex_new_index(0, NULL, NULL, key_dup, key_free);
}

static bool indexes_get(void) {
  return CRYPTO_THREAD_run_once(&once, indexes_init) && ctx_index >= 0 && ssl_index >= 0;
}

static bool key_eq(const key_t_ *a, const key_t_ *b) {
  return a->port == b->port && a->alpn_len == b->alpn_len &&
         memcmp(a->alpn, b->alpn, a->alpn_len) == 0 && strcmp(a->host, b->host) == 0;
}

/* The newest ticket held for k (NULL: none); *count, when given, gets how
 * many k holds and *oldest its oldest. */
static entry_t *find(store_t *s, const key_t_ *k, size_t *count, entry_t **oldest) {
  entry_t *newest = NULL;
  size_t n = 0;
  for (size_t i = 0; i < s->max; i++) {
    entry_t *e = &s->entries[i];
    if (e->sess == NULL || !key_eq(&e->key, k))
      continue;
    n++;
    if (newest == NULL || e->stamp > newest->stamp)
      newest = e;
    if (oldest != NULL && (*oldest == NULL || e->stamp < (*oldest)->stamp))
      *oldest = e;
  }
  if (count != NULL)
    *count = n;
  return newest;
}

/* OpenSSL's new-session callback. The store keeps a copy: OpenSSL marks
 * the connection's own session not resumable when the connection is freed
 * without a close_notify sent (an idle upstream that the proxy just drops,
 * a workspace that went away), which says nothing about the ticket of a
 * verified handshake. Returns 0: the caller keeps its reference. */
static int new_session(SSL *ssl, SSL_SESSION *sess) {
  if (!indexes_get())
    return 0;
  store_t *s = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), ctx_index);
  const key_t_ *k = SSL_get_ex_data(ssl, ssl_index);
  if (s == NULL || k == NULL)
    return 0;
  /* Only a TLS 1.3 session from a connection whose chain verified for the
   * name of the key (the SSL's verify parameters carry exactly that name;
   * see ce_tls_client_ssl_new). A resumed connection inherits the verified
   * result of the handshake that first made its session, for the same
   * key. */
  if (SSL_version(ssl) != TLS1_3_VERSION || SSL_SESSION_get_protocol_version(sess) != TLS1_3_VERSION ||
      (SSL_get_verify_mode(ssl) & SSL_VERIFY_PEER) == 0 ||
      SSL_get_verify_result(ssl) != X509_V_OK || SSL_get0_peer_certificate(ssl) == NULL ||
      !SSL_SESSION_is_resumable(sess))
    return 0;
  const unsigned char *ticket = NULL;
  size_t ticket_len = 0;
  SSL_SESSION_get0_ticket(sess, &ticket, &ticket_len);
  if (ticket_len > CE_TLS_SESSCACHE_TICKET_MAX)
    return 0;
  SSL_SESSION *copy = SSL_SESSION_dup(sess);
  if (copy == NULL)
    return 0; /* out of memory: the next connection does a full handshake */
  /* The key's oldest ticket when it holds its share, else a free slot,
   * else the least recently stored ticket of the store. */
  size_t held = 0;
  entry_t *e = NULL;
  find(s, k, &held, &e);
  if (held < CE_TLS_SESSCACHE_PER_KEY) {
    e = &s->entries[0];
    for (size_t i = 0; i < s->max; i++) {
      if (s->entries[i].sess == NULL) {
        e = &s->entries[i];
        break;
      }
      if (s->entries[i].stamp < e->stamp)
        e = &s->entries[i];
    }
  }
  SSL_SESSION_free(e->sess);
  e->key = *k;
  e->sess = copy;
  e->stamp = ++s->clock;
  return 0;
}

int ce__tls_sesscache_attach(SSL_CTX *ctx, size_t max) {
  if (ctx == NULL || max == 0 || max > CE_TLS_SESSCACHE_MAX)
    return CE_EINVAL;
  if (!indexes_get())
    return CE_ETLS;
  store_t *s = calloc(1, sizeof(*s) + max * sizeof(entry_t));
  if (s == NULL)
    return CE_ENOMEM;
  s->max = max;
  store_t *old = SSL_CTX_get_ex_data(ctx, ctx_index);
  if (SSL_CTX_set_ex_data(ctx, ctx_index, s) != 1) {
    free(s);
    return CE_ENOMEM;
  }
  store_free(NULL, old, NULL, 0, 0, NULL); /* a second call replaces the store */
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
  SSL_CTX_sess_set_new_cb(ctx, new_session);
  return CE_OK;
}

int ce__tls_sesscache_prepare(SSL *ssl, const char *host, uint16_t port,
                              const unsigned char *alpn, size_t alpn_len) {
  if (port == 0 || !indexes_get())
    return CE_OK;
  store_t *s = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), ctx_index);
  size_t hlen = strlen(host);
  if (s == NULL || hlen >= HOST_MAX || alpn_len > CE_TLS_SESSCACHE_ALPN_MAX)
    return CE_OK; /* not cacheable: a full handshake, nothing stored */
  key_t_ *k = calloc(1, sizeof(*k));
  if (k == NULL)
    return CE_ENOMEM;
  memcpy(k->host, host, hlen + 1);
  k->port = port;
  k->alpn_len = (uint8_t)alpn_len;
  if (alpn_len > 0)
    memcpy(k->alpn, alpn, alpn_len);
  if (SSL_set_ex_data(ssl, ssl_index, k) != 1) {
    free(k);
    return CE_ENOMEM;
  }
  entry_t *e = find(s, k, NULL, NULL);
  if (e != NULL) {
    SSL_SESSION *sess = e->sess;
    e->sess = NULL; /* offered once */
    int ok = SSL_SESSION_is_resumable(sess) ? SSL_set_session(ssl, sess) : 1;
    SSL_SESSION_free(sess);
    if (ok != 1)
      return CE_ENOMEM;
  }
  return CE_OK;
}

size_t ce_tls_sesscache_count(SSL_CTX *ctx) {
  if (ctx == NULL || !indexes_get())
    return 0;
  store_t *s = SSL_CTX_get_ex_data(ctx, ctx_index);
  size_t n = 0;
  for (size_t i = 0; s != NULL && i < s->max; i++)
    n += s->entries[i].sess != NULL;
  return n;
}
