/*
 * The Kubernetes client's TLS (internal.h): each handle's client context
 * and the server certificate check.
 *
 * Each handle's vhost gets its own SSL_CTX. Its trust store is replaced
 * by the handle's CA (only that CA is trusted, as kubectl does), the
 * client certificate is loaded there, TLS 1.2 is the minimum. The host
 * name is checked here (libwebsockets' check is skipped) so that an IP
 * literal is matched against IP SANs, and so that the name checked is
 * the server's name (or tls-server-name), never the address that
 * connect.c happened to reach it on. The SNI is set here too, for the
 * same reason.
 */
#include "kube/internal.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ssl_reason(char *dst, size_t cap) {
  unsigned long e = ERR_peek_last_error();
  if (e == 0)
    snprintf(dst, cap, "unknown reason");
  else
    ERR_error_string_n(e, dst, cap);
  ERR_clear_error();
}

static bool is_ip(const char *s) {
  unsigned char b[16];
  return inet_pton(AF_INET, s, b) == 1 || inet_pton(AF_INET6, s, b) == 1;
}

/* The SNI name of a context (tls-server-name, else the server's name, or
 * "" for none when that is an IP literal), freed with the context. */
static int g_sni_idx = -1;

static void sni_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                     void *argp) {
  free(ptr);
}

/* At the start of each handshake (before the ClientHello is built):
 * libwebsockets set the SNI from the Host header; ours wins, so that the
 * name sent is the one checked whatever address was dialled. */
static void sni_info_cb(const SSL *ssl, int where, int ret) {
  if ((where & SSL_CB_HANDSHAKE_START) == 0 || g_sni_idx < 0)
    return;
  const char *name = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), g_sni_idx);
  if (name == NULL)
    return;
  /* (The macro does not parenthesise its argument.) */
  char *sni = name[0] != '\0' ? (char *)name : NULL;
  SSL_set_tlsext_host_name((SSL *)ssl, sni);
}

/* A client TLS context of its own for k: only k's CA is trusted (the
 * system's roots when k names none), k's client certificate (cert/key,
 * or none), TLS 1.2 at least. */
SSL_CTX *ce__kube_tls_context(const ce_kube_t *k, const char *cert, size_t cert_len,
                            const char *key, size_t key_len, char *err, size_t errlen) {
  char why[200];
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == NULL) {
    ssl_reason(why, sizeof(why));
    snprintf(err, errlen, "cannot make a TLS context (%s)", why);
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  if (k->cfg.ca_pem != NULL) {
    X509_STORE *st = SSL_CTX_get_cert_store(ctx);
    BIO *bio = BIO_new_mem_buf(k->cfg.ca_pem, (int)k->cfg.ca_len);
    STACK_OF(X509_INFO) *infos = bio != NULL ? PEM_X509_INFO_read_bio(bio, NULL, NULL, NULL)
                                             : NULL;
    int added = 0;
    for (int i = 0; st != NULL && infos != NULL && i < sk_X509_INFO_num(infos); i++) {
      X509_INFO *in = sk_X509_INFO_value(infos, i);
      if (in->x509 != NULL && X509_STORE_add_cert(st, in->x509) == 1)
        added++;
    }
    sk_X509_INFO_pop_free(infos, X509_INFO_free);
    BIO_free(bio);
    ERR_clear_error();
    if (added == 0) {
      snprintf(err, errlen, "the certificate authority holds no PEM certificate");
      goto fail;
    }
  } else if (!k->cfg.insecure && SSL_CTX_set_default_verify_paths(ctx) != 1) {
    ssl_reason(why, sizeof(why));
    snprintf(err, errlen, "cannot load the system's certificate authorities (%s)", why);
    goto fail;
  }
  if (cert != NULL) {
    BIO *bio = BIO_new_mem_buf(cert, (int)cert_len);
    X509 *leaf = bio != NULL ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    if (leaf == NULL || SSL_CTX_use_certificate(ctx, leaf) != 1) {
      ssl_reason(why, sizeof(why));
      snprintf(err, errlen, "the client certificate is not usable PEM (%s)", why);
      X509_free(leaf);
      BIO_free(bio);
      goto fail;
    }
    X509_free(leaf);
    X509 *more;
    while ((more = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL)
      if (SSL_CTX_add0_chain_cert(ctx, more) != 1)
        X509_free(more);
    ERR_clear_error();
    BIO_free(bio);
    bio = BIO_new_mem_buf(key, (int)key_len);
    EVP_PKEY *pk = bio != NULL ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    if (pk == NULL || SSL_CTX_use_PrivateKey(ctx, pk) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      ssl_reason(why, sizeof(why));
      snprintf(err, errlen,
               "the client key is not usable PEM or does not match the certificate (%s)",
               why);
      EVP_PKEY_free(pk);
      goto fail;
    }
    EVP_PKEY_free(pk);
  }
  /* RFC 6066 §3: an IP literal is never a server name ("" sends none,
   * as Go's client does). */
  const char *sni_name = k->cfg.tls_server_name != NULL ? k->cfg.tls_server_name
                         : !is_ip(k->cfg.host)          ? k->cfg.host
                                                        : "";
  if (g_sni_idx < 0)
    g_sni_idx = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, sni_free);
  char *sni = strdup(sni_name);
  if (g_sni_idx < 0 || sni == NULL || SSL_CTX_set_ex_data(ctx, g_sni_idx, sni) != 1) {
    free(sni);
    snprintf(err, errlen, "out of memory for the TLS context");
    goto fail;
  }
  SSL_CTX_set_info_callback(ctx, sni_info_cb);
  return ctx;
fail:
  /* The whole context goes: nothing half-installed is ever used. */
  SSL_CTX_free(ctx);
  return NULL;
}

bool ce_kube_cert_names(X509 *cert, const char *name) {
  if (is_ip(name))
    return X509_check_ip_asc(cert, name, 0) == 1;
  /* As Go's crypto/tls: subjectAltName only (never the subject's CN), a
   * wildcard only as a whole left-most label. */
  return X509_check_host(cert, name, strlen(name),
                         X509_CHECK_FLAG_NEVER_CHECK_SUBJECT |
                             X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS,
                         NULL) == 1;
}

/* The server certificate check (preverify from OpenSSL, the name here).
 * 0 accepts, 1 refuses (libwebsockets' convention). */
int ce__kube_tls_verify(conn_t *cn, X509_STORE_CTX *xs, int preverify) {
  if (cn->k->cfg.insecure) {
    /* insecure-skip-tls-verify, as kubectl: neither the chain nor the
     * name is checked. */
    X509_STORE_CTX_set_error(xs, X509_V_OK);
    return 0;
  }
  if (!preverify) {
    int e = X509_STORE_CTX_get_error(xs);
    snprintf(cn->tls_err, sizeof(cn->tls_err), "the server certificate is not trusted: %s",
             X509_verify_cert_error_string(e));
    return 1;
  }
  if (X509_STORE_CTX_get_error_depth(xs) != 0)
    return 0;
  const ce_kube_config_t *cfg = &cn->k->cfg;
  const char *name = cfg->tls_server_name != NULL ? cfg->tls_server_name : cfg->host;
  X509 *cert = X509_STORE_CTX_get_current_cert(xs);
  if (cert == NULL || !ce_kube_cert_names(cert, name)) {
    char s[CE__KUBE_SHOWN_MAX];
    snprintf(cn->tls_err, sizeof(cn->tls_err),
             "the server certificate does not name \"%s\"", ce__kube_shown(s, name));
    X509_STORE_CTX_set_error(xs, X509_V_ERR_HOSTNAME_MISMATCH);
    return 1;
  }
  return 0;
}
