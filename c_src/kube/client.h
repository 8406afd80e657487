/*
 * The Kubernetes API client of the port (docs/port-protocol.md,
 * "Kubernetes"): REST requests, pods/exec and pods/portforward over
 * WebSocket, all on the caller's libuv loop through libwebsockets'
 * foreign-loop integration, with OpenSSL for TLS.
 *
 * One ce_kube_client_t per loop holds the libwebsockets context (made at
 * the first open). Each handle (ce_kube_t) owns a libwebsockets vhost:
 * its TLS client context carries the handle's CA and client certificate.
 * Handles and forward listeners are numbered by the client from 1, never
 * reused.
 *
 * Completion callbacks run exactly once, usually from the loop; an
 * operation that fails before anything is sent (a token file that cannot
 * be read, an exec plugin that cannot be started) completes from inside
 * the call that started it, which then returns CE_OK. Their arguments
 * live only for the call. Closing a handle, or destroying the client,
 * completes its operations with CE_ECLOSED.
 */
#ifndef CE_KUBE_CLIENT_H
#define CE_KUBE_CLIENT_H

#include <jansson.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "kube/config.h"

/* A response body past this is CE_ETOOBIG (the port's packet limit is
 * 16 MiB, the reply's own terms come on top; a body decoded from JSON
 * may still make a reply over it: toobig too). */
#define CE_KUBE_BODY_MAX (15u * 1024u * 1024u)
#define CE_KUBE_REQUEST_TIMEOUT_DEFAULT 30000u
#define CE_KUBE_EXEC_TIMEOUT_DEFAULT 60000u
#define CE_KUBE_TIMEOUT_MAX 3600000u
#define CE_KUBE_EXEC_OUTPUT_DEFAULT (8u * 1024u * 1024u)
/* stdout and stderr kept together (a reply is at most 16 MiB). */
#define CE_KUBE_EXEC_OUTPUT_TOTAL (15u * 1024u * 1024u)
/* stdin is sent in frames of this many bytes. */
#define CE_KUBE_STDIN_FRAME (64u * 1024u)
/* A status channel message past this is a protocol error. */
#define CE_KUBE_STATUS_MAX (64u * 1024u)
/* Bytes queued towards one side of a tunnel before the other is paused. */
#define CE_KUBE_FWD_QUEUE_MAX (1024u * 1024u)
/* Tunnels (accepted connections) of one forward listener at a time. */
#define CE_KUBE_FWD_TUNNELS_MAX 16u
/* An exec credential plugin: its output and its time. */
#define CE_KUBE_PLUGIN_OUTPUT_MAX (1024u * 1024u)
#define CE_KUBE_PLUGIN_TIMEOUT_MS 60000u
/* After the plugin exited, the time its pipes get to reach EOF. */
#define CE_KUBE_PLUGIN_GRACE_MS 1000u
#define CE_KUBE_MSG_MAX 480
/* One address of the server gets this long to accept the connection and
 * start TLS before the next address is tried. */
#define CE_KUBE_CONNECT_ATTEMPT_MS 5000u

typedef struct ce_kube_client ce_kube_client_t;
typedef struct ce_kube ce_kube_t;

ce_kube_client_t *ce_kube_client_new(uv_loop_t *loop);
/* Closes every handle and listener (their operations complete with
 * CE_ECLOSED) and starts closing libwebsockets' libuv handles; the loop
 * must then run until it ends, and ce_kube_client_free() be called. */
void ce_kube_client_destroy(ce_kube_client_t *c);
/* Finishes libwebsockets' teardown once the loop has ended. */
void ce_kube_client_free(ce_kube_client_t *c);

/* Opens a handle on cfg (taken in every case). Nothing is sent. */
int ce_kube_open(ce_kube_client_t *c, ce_kube_config_t *cfg, ce_kube_t **out, char *err,
                 size_t errlen);
ce_kube_t *ce_kube_find(ce_kube_client_t *c, uint64_t id);
uint64_t ce_kube_id(const ce_kube_t *k);
const ce_kube_config_t *ce_kube_config(const ce_kube_t *k);
/* Completes outstanding operations with CE_ECLOSED and closes the
 * handle's forward listeners. */
void ce_kube_close(ce_kube_t *k);

typedef struct {
  const char *method;        /* GET POST PUT PATCH DELETE */
  const char *path;          /* starts with '/', query included */
  const char *body;          /* NULL: none */
  size_t body_len;
  const char *content_type;  /* with a body */
  uint32_t timeout_ms;
} ce_kube_http_req_t;

typedef struct {
  int err;                   /* CE_OK: an HTTP answer */
  const char *msg;
  int status;
  const char *content_type;  /* "" when absent */
  const char *body;
  size_t body_len;
} ce_kube_http_res_t;

typedef void (*ce_kube_http_cb)(void *arg, const ce_kube_http_res_t *res);

int ce_kube_request(ce_kube_t *k, const ce_kube_http_req_t *req, ce_kube_http_cb cb,
                    void *arg, char *err, size_t errlen);

typedef struct {
  const char *ns, *pod, *container;
  const char *const *argv;
  size_t argc;
  bool has_stdin;
  const char *stdin_data;
  size_t stdin_len;
  uint32_t timeout_ms;
  size_t max_output;
} ce_kube_exec_req_t;

typedef struct {
  int err;                   /* CE_OK: the stream ran */
  const char *msg;
  bool has_exit;
  int exit_code;
  const json_t *status;      /* NULL: none arrived */
  const char *out, *errout;
  size_t out_len, err_len;
  uint64_t out_dropped, err_dropped;
  const char *protocol;
} ce_kube_exec_res_t;

typedef void (*ce_kube_exec_cb)(void *arg, const ce_kube_exec_res_t *res);

int ce_kube_exec(ce_kube_t *k, const ce_kube_exec_req_t *req, ce_kube_exec_cb cb, void *arg,
                 char *err, size_t errlen);

typedef struct {
  const char *ns, *pod;
  uint16_t port;
  const char *listen;        /* control/listen.h's grammar: loopback only */
} ce_kube_fwd_req_t;

/* An error of one tunnelled connection (the listener stays). */
typedef void (*ce_kube_fwd_err_cb)(void *arg, uint64_t fchan, const char *msg);

/* Binds and listens now. *bound_port: the TCP port bound. */
int ce_kube_forward(ce_kube_t *k, const ce_kube_fwd_req_t *req, ce_kube_fwd_err_cb cb,
                    void *arg, uint64_t *fchan, uint16_t *bound_port, char *err,
                    size_t errlen);
/* Whether a server certificate names name (an IP literal against its IP
 * addresses; a DNS name against its DNS subjectAltNames only, a wildcard
 * only as a whole left-most label). */
bool ce_kube_cert_names(X509 *cert, const char *name);

/* Closes a listener and its tunnels; false when there was none. */
bool ce_kube_forward_close(ce_kube_client_t *c, uint64_t fchan);

#endif
