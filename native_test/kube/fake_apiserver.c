/* The tests' API server (fake_apiserver.h). */
#include "kube/fake_apiserver.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static char g_cert_pem[4096], g_other_pem[4096];
static EVP_PKEY *g_key;
static X509 *g_cert;

static X509 *self_signed(EVP_PKEY *key, const char *cn, const char *san) {
  X509 *x = X509_new();
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 86400);
  X509_set_pubkey(x, key);
  X509_NAME *name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, x, x, NULL, NULL, 0);
  X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, NID_subject_alt_name, san);
  X509_add_ext(x, ext, -1);
  X509_EXTENSION_free(ext);
  ext = X509V3_EXT_conf_nid(NULL, &v3, NID_basic_constraints, "critical,CA:TRUE");
  X509_add_ext(x, ext, -1);
  X509_EXTENSION_free(ext);
  cr_assert_gt(X509_sign(x, key, EVP_sha256()), 0);
  return x;
}

static void pem_of(X509 *x, char *out, size_t cap) {
  BIO *b = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(b, x);
  int n = BIO_read(b, out, (int)cap - 1);
  cr_assert_gt(n, 0);
  out[n] = '\0';
  BIO_free(b);
}

static void certs(void) {
  if (g_cert != NULL)
    return;
  g_key = EVP_EC_gen("P-256");
  cr_assert_not_null(g_key);
  g_cert = self_signed(g_key, "kube.test", "DNS:kube.test,IP:127.0.0.1,IP:::1");
  pem_of(g_cert, g_cert_pem, sizeof(g_cert_pem));
  EVP_PKEY *other = EVP_EC_gen("P-256");
  X509 *o = self_signed(other, "kube.test", "DNS:kube.test,IP:127.0.0.1,IP:::1");
  pem_of(o, g_other_pem, sizeof(g_other_pem));
  X509_free(o);
  EVP_PKEY_free(other);
}

const char *fa_cert_pem(void) {
  certs();
  return g_cert_pem;
}

const char *fa_other_pem(void) {
  certs();
  return g_other_pem;
}

static int sni_cb(SSL *ssl, int *al, void *arg) {
  fake_apiserver_t *fa = arg;
  const char *n = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
  snprintf(fa->sni, sizeof(fa->sni), "%s", n != NULL ? n : "");
  return SSL_TLSEXT_ERR_OK;
}

static bool read_full(SSL *ssl, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    int r = SSL_read(ssl, (char *)buf + got, (int)(n - got));
    if (r <= 0)
      return false;
    got += (size_t)r;
  }
  return true;
}

/* Reads the request head (and a content-length body) into fa->request. */
static bool read_request(fake_apiserver_t *fa, SSL *ssl) {
  fa->request_len = 0;
  fa->request[0] = '\0';
  char *end = NULL;
  while (end == NULL) {
    if (fa->request_len + 1 >= sizeof(fa->request))
      return false;
    int r = SSL_read(ssl, fa->request + fa->request_len, 1);
    if (r <= 0)
      return false;
    fa->request_len++;
    fa->request[fa->request_len] = '\0';
    end = strstr(fa->request, "\r\n\r\n");
  }
  const char *cl = strcasestr(fa->request, "\r\ncontent-length:");
  if (cl != NULL) {
    size_t n = strtoul(cl + 17, NULL, 10);
    if (fa->request_len + n + 1 > sizeof(fa->request))
      return false;
    if (!read_full(ssl, fa->request + fa->request_len, n))
      return false;
    fa->request_len += n;
    fa->request[fa->request_len] = '\0';
  }
  return true;
}

static void ws_send(SSL *ssl, unsigned char opcode, const void *data, size_t n) {
  unsigned char h[4];
  size_t hl = 2;
  h[0] = 0x80 | opcode;
  if (n < 126) {
    h[1] = (unsigned char)n;
  } else {
    h[1] = 126;
    h[2] = (unsigned char)(n >> 8);
    h[3] = (unsigned char)n;
    hl = 4;
  }
  SSL_write(ssl, h, (int)hl);
  if (n > 0)
    SSL_write(ssl, data, (int)n);
}

/* One masked client message; false at the end of the stream. */
static bool ws_recv(SSL *ssl, unsigned char *op, unsigned char *buf, size_t cap, size_t *n) {
  unsigned char h[2], mask[4];
  if (!read_full(ssl, h, 2))
    return false;
  uint64_t len = h[1] & 0x7f;
  if (len == 126) {
    unsigned char e[2];
    if (!read_full(ssl, e, 2))
      return false;
    len = (uint64_t)e[0] << 8 | e[1];
  } else if (len == 127) {
    unsigned char e[8];
    if (!read_full(ssl, e, 8))
      return false;
    len = 0;
    for (int i = 0; i < 8; i++)
      len = len << 8 | e[i];
  }
  if ((h[1] & 0x80) == 0 || len > cap || !read_full(ssl, mask, 4) || !read_full(ssl, buf, len))
    return false;
  for (uint64_t i = 0; i < len; i++)
    buf[i] ^= mask[i % 4];
  *op = h[0] & 0x0f;
  *n = len;
  return true;
}

static bool upgrade(fake_apiserver_t *fa, SSL *ssl, const char *protocol) {
  const char *key = strcasestr(fa->request, "\r\nsec-websocket-key:");
  if (key == NULL)
    return false;
  key += 20;
  while (*key == ' ')
    key++;
  char k[128];
  size_t kl = strcspn(key, "\r");
  snprintf(k, sizeof(k), "%.*s258EAFA5-E914-47DA-95CA-C5AB0DC85B11", (int)kl, key);
  unsigned char sha[SHA_DIGEST_LENGTH];
  SHA1((const unsigned char *)k, strlen(k), sha);
  unsigned char accept[64];
  EVP_EncodeBlock(accept, sha, sizeof(sha));
  char head[512];
  int hn = snprintf(head, sizeof(head),
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n"
                    "Sec-WebSocket-Protocol: %s\r\n\r\n",
                    accept, fa->protocol != NULL ? fa->protocol : protocol);
  return SSL_write(ssl, head, hn) == hn;
}

static void serve_forward(fake_apiserver_t *fa, SSL *ssl) {
  if (!upgrade(fa, ssl, "v4.channel.k8s.io"))
    return;
  unsigned char pre[3] = {0, (unsigned char)(fa->fwd_port & 0xff),
                          (unsigned char)(fa->fwd_port >> 8)};
  ws_send(ssl, 0x2, pre, 3);
  pre[0] = 1;
  ws_send(ssl, 0x2, pre, 3);
  if (fa->fwd_error != NULL) {
    char msg[512];
    msg[0] = 1;
    size_t n = strlen(fa->fwd_error);
    memcpy(msg + 1, fa->fwd_error, n);
    ws_send(ssl, 0x2, msg, n + 1);
  } else {
    unsigned char buf[4096], op;
    size_t n;
    while (ws_recv(ssl, &op, buf, sizeof(buf), &n)) {
      if (op != 0x2 || n < 2 || buf[0] != 0)
        continue;
      memcpy(fa->stdin_got, buf + 1, n - 1);
      fa->stdin_len = n - 1;
      char reply[4200];
      reply[0] = 0;
      memcpy(reply + 1, "pong:", 5);
      memcpy(reply + 6, buf + 1, n - 1);
      ws_send(ssl, 0x2, reply, n + 5);
      break;
    }
  }
  unsigned char bye[2] = {0x03, 0xe8};
  ws_send(ssl, 0x8, bye, sizeof(bye));
}

static void serve_exec(fake_apiserver_t *fa, SSL *ssl) {
  if (!upgrade(fa, ssl, "v5.channel.k8s.io"))
    return;
  if (fa->expect_stdin) {
    unsigned char buf[70000], op;
    size_t n;
    while (!fa->stdin_closed && ws_recv(ssl, &op, buf, sizeof(buf), &n)) {
      if (op != 0x2 || n == 0)
        continue;
      if (buf[0] == 0 && fa->stdin_len + n - 1 <= sizeof(fa->stdin_got)) {
        memcpy(fa->stdin_got + fa->stdin_len, buf + 1, n - 1);
        fa->stdin_len += n - 1;
      } else if (buf[0] == 255 && n == 2 && buf[1] == 0) {
        fa->stdin_closed = true;
      }
    }
  }
  for (size_t i = 0; i < fa->n_frames; i++)
    ws_send(ssl, 0x2, fa->frames[i], fa->frame_lens[i]);
  unsigned char bye[2] = {0x03, 0xe8};
  ws_send(ssl, 0x8, bye, sizeof(bye));
}

static void *serve(void *arg) {
  fake_apiserver_t *fa = arg;
  while (!fa->stop) {
    struct pollfd p = {.fd = fa->lfd, .events = POLLIN};
    if (poll(&p, 1, 50) <= 0)
      continue;
    int fd = accept(fa->lfd, NULL, NULL);
    if (fd < 0)
      continue;
    SSL *ssl = SSL_new(fa->ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) == 1) {
      fa->connections++;
      if (read_request(fa, ssl)) {
        if (fa->mode == FA_HTTP && fa->response != NULL)
          SSL_write(ssl, fa->response, (int)strlen(fa->response));
        else if (fa->mode == FA_EXEC)
          serve_exec(fa, ssl);
        else if (fa->mode == FA_FORWARD)
          serve_forward(fa, ssl);
      }
      SSL_shutdown(ssl);
    }
    SSL_free(ssl);
    close(fd);
    ERR_clear_error();
  }
  return NULL;
}

void fa_start(fake_apiserver_t *fa) {
  certs();
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  cr_assert_not_null(ctx);
  cr_assert_eq(SSL_CTX_use_certificate(ctx, g_cert), 1);
  cr_assert_eq(SSL_CTX_use_PrivateKey(ctx, g_key), 1);
  SSL_CTX_set_tlsext_servername_callback(ctx, sni_cb);
  SSL_CTX_set_tlsext_servername_arg(ctx, fa);
  fa->ctx = ctx;
  fa->lfd = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_geq(fa->lfd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(fa->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
  cr_assert_eq(listen(fa->lfd, 16), 0);
  socklen_t al = sizeof(a);
  getsockname(fa->lfd, (struct sockaddr *)&a, &al);
  fa->port = ntohs(a.sin_port);
  cr_assert_eq(pthread_create(&fa->thread, NULL, serve, fa), 0);
  fa->running = true;
}

void fa_stop(fake_apiserver_t *fa) {
  if (!fa->running)
    return;
  fa->running = false;
  fa->stop = true;
  pthread_join(fa->thread, NULL);
  close(fa->lfd);
  SSL_CTX_free(fa->ctx);
}
