/*
 * The TLS part of a proxied connection, measured alone (bench/PROFILE.md,
 * "Memory per idle TLS connection"): `make bench-tls` builds and runs it.
 *
 * It makes N pairs with the proxy's own code: a server ce_tlsconn with a
 * leaf from the cache (the workspace side) and a client ce_tlsconn towards
 * it (the upstream side), over memory BIOs, in one process. Each pair
 * completes its handshake and moves 300 bytes up and 1,100 down, and all
 * pairs are held. It prints the heap the pairs hold (glibc's mallinfo2),
 * their BIO room (ce_tlsconn_held) and the CPU time of each side's
 * handshake.
 *
 *   bench_tls_pairs [N] [resume]
 *
 * "resume" lets the server side issue TLS 1.3 tickets (as most origins do)
 * and connects each client towards example.com:443 through the upstream
 * context's session store, as the proxy does: each resumes with the ticket
 * the previous one received. Only the server side (the origin) is changed
 * for this; the client side is what the proxy runs with.
 */
#include <malloc.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "tls/ca.h"
#include "tls/context.h"
#include "tls/tlsconn.h"

static const unsigned char H2[] = "\x02h2";

typedef struct {
  ce_tlsconn_t *c, *s;
} pair_t;

static double cpu_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* Moves everything `from` has to send into `to`. */
static void shuttle(ce_tlsconn_t *from, ce_tlsconn_t *to) {
  uint8_t buf[16384];
  size_t n;
  while ((n = ce_tlsconn_take_out(from, buf, sizeof(buf))) > 0)
    (void)ce_tlsconn_feed(to, buf, n);
}

/* Sends len bytes (at most 64 KiB) one way; the reader's output goes back. */
static int transfer(ce_tlsconn_t *from, ce_tlsconn_t *to, size_t len) {
  static uint8_t data[65536], got[65536];
  if (len > sizeof(data) || ce_tlsconn_write(from, data, len) != CE_OK)
    return -1;
  shuttle(from, to);
  size_t have = 0, n = 0;
  while (have < len && ce_tlsconn_read(to, got, sizeof(got), &n) == CE_OK)
    have += n;
  shuttle(to, from);
  return have == len ? 0 : -1;
}

/* Drives both handshakes, adding each side's CPU time to its total. */
static int handshake(pair_t *p, double *client_us, double *server_us) {
  int rc = CE_EAGAIN, rs = CE_EAGAIN;
  for (int round = 0; round < 20 && (rc == CE_EAGAIN || rs == CE_EAGAIN); round++) {
    double t0 = cpu_us();
    if (rc == CE_EAGAIN)
      rc = ce_tlsconn_handshake(p->c);
    double t1 = cpu_us();
    shuttle(p->c, p->s);
    if (rs == CE_EAGAIN)
      rs = ce_tlsconn_handshake(p->s);
    double t2 = cpu_us();
    shuttle(p->s, p->c);
    *client_us += t1 - t0;
    *server_us += t2 - t1;
  }
  return rc == CE_OK && rs == CE_OK ? 0 : -1;
}

static int pair_new(SSL_CTX *sctx, SSL_CTX *cctx, X509 *cert, EVP_PKEY *key,
                    uint16_t port, pair_t *p) {
  SSL *s = NULL, *c = NULL;
  if (ce_tls_server_ssl_new(sctx, cert, key, H2, sizeof(H2) - 1, &s) != CE_OK)
    return -1;
  if (ce_tls_client_ssl_new_at(cctx, "example.com", port, H2, sizeof(H2) - 1, &c) != CE_OK) {
    SSL_free(s);
    return -1;
  }
  if (ce_tlsconn_new(c, false, &p->c) != CE_OK) {
    SSL_free(s);
    return -1;
  }
  if (ce_tlsconn_new(s, true, &p->s) != CE_OK) {
    ce_tlsconn_free(p->c);
    return -1;
  }
  return 0;
}

static void pair_free(pair_t *p) {
  ce_tlsconn_free(p->c);
  ce_tlsconn_free(p->s);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 200;
  bool resume = argc > 2 && strcmp(argv[2], "resume") == 0;
  if (n < 1 || n > 100000) {
    fprintf(stderr, "usage: bench_tls_pairs [N (1..100000)] [resume]\n");
    return 2;
  }
  const char *dir = getenv("BENCH_TLS_DIR");
  char cert_path[512], key_path[512], err[512];
  snprintf(cert_path, sizeof(cert_path), "%s/ca.pem", dir != NULL ? dir : ".");
  snprintf(key_path, sizeof(key_path), "%s/ca.key", dir != NULL ? dir : ".");

  ce_ca_t *ca = NULL;
  ce_leaf_cache_t *cache = NULL;
  SSL_CTX *sctx = NULL, *cctx = NULL;
  X509 *cert = NULL;
  EVP_PKEY *key = NULL;
  uint16_t port = resume ? 443 : 0; /* 0: the upstream session store is not used */
  pair_t *pairs = calloc((size_t)n, sizeof(*pairs));
  int status = 1;
  err[0] = '\0';
  if (pairs == NULL || ce_ca_load(cert_path, key_path, &ca, err, sizeof(err)) != CE_OK ||
      ce_leaf_cache_new(ca, 0, &cache) != CE_OK ||
      ce_tls_server_ctx_new(&sctx, err, sizeof(err)) != CE_OK ||
      ce_tls_client_ctx_new(CE_SOURCE_ROOT "/priv/ca-certificates/mozilla.pem", cert_path, &cctx,
                            err, sizeof(err)) != CE_OK ||
      ce_leaf_get(cache, "example.com", &cert, &key) != CE_OK) {
    fprintf(stderr, "bench_tls_pairs: set-up failed: %s\n", err);
    goto done;
  }
  if (resume) {
    /* An origin's side: stateless TLS 1.3 tickets. */
    SSL_CTX_clear_options(sctx, SSL_OP_NO_TICKET);
    (void)SSL_CTX_set_num_tickets(sctx, 1);
  }

  /* Warm-up (lazy initialisation in OpenSSL), and the first ticket. */
  double ignore_c = 0, ignore_s = 0;
  for (int i = 0; i < 2; i++) {
    pair_t w;
    if (pair_new(sctx, cctx, cert, key, port, &w) != 0 || handshake(&w, &ignore_c, &ignore_s) != 0 ||
        transfer(w.s, w.c, 10) != 0) {
      fprintf(stderr, "bench_tls_pairs: the warm-up handshake failed\n");
      goto done;
    }
    pair_free(&w);
  }

  struct mallinfo2 before = mallinfo2();
  double client_us = 0, server_us = 0;
  int reused = 0;
  for (int i = 0; i < n; i++) {
    if (pair_new(sctx, cctx, cert, key, port, &pairs[i]) != 0 ||
        handshake(&pairs[i], &client_us, &server_us) != 0 ||
        transfer(pairs[i].c, pairs[i].s, 300) != 0 || transfer(pairs[i].s, pairs[i].c, 1100) != 0) {
      fprintf(stderr, "bench_tls_pairs: pair %d failed: %s / %s\n", i,
              pairs[i].c != NULL ? ce_tlsconn_error(pairs[i].c) : "",
              pairs[i].s != NULL ? ce_tlsconn_error(pairs[i].s) : "");
      goto done;
    }
    SSL *c = ce_tlsconn_ssl(pairs[i].c);
    reused += SSL_session_reused(c);
  }
  struct mallinfo2 after = mallinfo2();
  size_t bio = 0;
  for (int i = 0; i < n; i++)
    bio += ce_tlsconn_held(pairs[i].c) + ce_tlsconn_held(pairs[i].s);
  printf("pairs %d%s: heap %.1f KiB per pair (BIO room %.1f KiB); handshake CPU per pair: "
         "client (upstream side) %.0f us, server (workspace side) %.0f us; resumed %d\n",
         n, resume ? ", resuming" : "", (double)(after.uordblks - before.uordblks) / n / 1024,
         (double)bio / n / 1024, client_us / n, server_us / n, reused);
  status = 0;
done:
  for (int i = 0; pairs != NULL && i < n; i++)
    if (pairs[i].c != NULL || pairs[i].s != NULL)
      pair_free(&pairs[i]);
  free(pairs);
  X509_free(cert);
  EVP_PKEY_free(key);
  SSL_CTX_free(cctx);
  SSL_CTX_free(sctx);
  ce_leaf_cache_free(cache);
  ce_ca_free(ca);
  return status;
}
