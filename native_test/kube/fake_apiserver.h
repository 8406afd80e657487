/*
 * A tiny API server for the tests of the Kubernetes client
 * (c_src/kube/): TLS on 127.0.0.1 (a port the kernel chose) with a
 * self-signed certificate for "kube.test", served from a thread of its
 * own with blocking OpenSSL, one connection after the other. What it
 * does with each connection is its mode; it keeps what it was sent.
 */
#ifndef CE_TEST_KUBE_FAKE_APISERVER_H
#define CE_TEST_KUBE_FAKE_APISERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
  FA_HTTP,          /* reads a request (head and content-length body), sends `response` */
  FA_HANG_UP,       /* reads the request head, closes without a word */
  FA_EXEC,          /* a WebSocket upgrade to v5.channel.k8s.io, then `frames` (see below) */
  FA_FORWARD,       /* an upgrade to v4.channel.k8s.io, both channels' port prefix
                       (fwd_port), then fwd_error on the error channel, or one data
                       message echoed back as "pong:" + what came */
} fa_mode_t;

typedef struct {
  fa_mode_t mode;
  const char *response;   /* FA_HTTP: the whole answer, head and body */
  /* FA_EXEC: the server sends these messages (channel byte first), then
   * a close frame, after reading the client's stdin up to its v5 close
   * when expect_stdin is set. */
  const char *const *frames;
  const size_t *frame_lens;
  size_t n_frames;
  bool expect_stdin;
  const char *protocol;   /* FA_EXEC, FA_FORWARD: the subprotocol agreed */
  uint16_t fwd_port;      /* FA_FORWARD: the port its prefixes name */
  const char *fwd_error;  /* FA_FORWARD: what the error channel says, or NULL */

  /* Filled in by the server. */
  int port;
  unsigned connections;   /* TLS handshakes completed */
  char request[16384];    /* the last request head and body, NUL-terminated */
  size_t request_len;
  char sni[256];          /* the server name the client sent, "" when none */
  char stdin_got[65536];  /* FA_EXEC: stdin payload received; FA_FORWARD: the data */
  size_t stdin_len;
  bool stdin_closed;      /* FA_EXEC: the v5 close of channel 0 came */

  /* Private. */
  int lfd;
  pthread_t thread;
  void *ctx;
  bool stop, running;
} fake_apiserver_t;

/* Makes the certificate, listens, starts the thread. */
void fa_start(fake_apiserver_t *fa);
/* Stops the thread and closes everything (again: nothing). The record
 * must outlive the thread: a test keeps it static, and its teardown
 * stops it whatever happened. */
void fa_stop(fake_apiserver_t *fa);
/* The server's certificate as PEM (a static buffer), to be the CA. */
const char *fa_cert_pem(void);
/* Another self-signed certificate's PEM: a CA that did not sign it. */
const char *fa_other_pem(void);

#endif
