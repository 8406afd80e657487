/*
 * The sidecar data plane (docs/proxy.md): one libuv loop that accepts the
 * workspace's redirected connections, terminates TLS with the session CA,
 * evaluates every HTTP/1.1 request against the policy (asking the control
 * channel for decide rules), forwards or refuses it, and reports each step
 * as an event.
 *
 * Ownership: ce_proxy_t owns the policy, the CA and its leaf cache, both
 * SSL_CTXs, the control channel and every connection. A connection
 * (conn.c) owns its two sockets, their TLS engines and its buffers, and is
 * freed from the close callback of the last of its handles.
 */
#ifndef CE_PROXY_PROXY_H
#define CE_PROXY_PROXY_H

#include <openssl/ssl.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "control/control.h"
#include "dns/hosts.h"
#include "dns/stub.h"
#include "policy/credential.h"
#include "policy/policy.h"
#include "proxy/bufpool.h"
#include "proxy/options.h"
#include "tls/ca.h"

/* Definitive decider answers cached per (decide rule, host). */
#define CE_DECISION_CACHE_SIZE 4096u
/* A cached reason is a decider's: the control channel's limit. */
#define CE_DECISION_REASON_MAX CE_CONTROL_MAX_REASON

typedef struct ce_conn ce_conn_t;

typedef struct {
  bool used;
  int32_t rule_index;
  bool allow;
  char host[CE_HOST_TEXT_MAX + 1];
  char reason[CE_DECISION_REASON_MAX + 1];
} ce_decision_entry_t;

struct ce_exchange_channel;

typedef struct ce_proxy {
  uv_loop_t *loop;
  const ce_proxy_options_t *opts;
  ce_policy_t *policy;
  ce_secrets_t *secrets;     /* the credentials' values (policy/credential.h), or NULL */
  ce_ca_t *ca;
  ce_leaf_cache_t *leaves;
  SSL_CTX *server_ctx;
  SSL_CTX *client_ctx;
  ce_control_t *control;
  /* Where the connections' events and questions go when not to control
   * (a unit test's recorder), with its context; NULL: the control channel. */
  const struct ce_exchange_channel *channel;
  void *channel_ctx;
  ce_hosts_t *hosts;         /* --hosts, or NULL */
  ce_dns_stub_t *dns;        /* the proxy's own resolver (docs/dns.md) */
  struct ce_dns_server *dns_server; /* the workspace's resolver, or NULL */

  uv_tcp_t listeners[CE_PROXY_MAX_LISTEN];
  struct sockaddr_storage listen_addrs[CE_PROXY_MAX_LISTEN];
  size_t listener_count;
  uv_signal_t sigterm;
  uv_signal_t sigint;
  uv_signal_t sigpipe;
  uv_signal_t sigusr1;     /* writes the buffer statistics (stats.h) */

  ce_conn_t *conns;          /* intrusive list of live connections */
  size_t conn_count;
  uint64_t next_conn_id;
  uint64_t next_request_id;
  bool draining;

  ce_decision_entry_t *decisions;   /* CE_DECISION_CACHE_SIZE slots */
  size_t decision_count;

  /* Memory the connections share (docs/proxy.md "Memory"), allocated at
   * start: one buffer every socket read goes into (its bytes are fed to
   * TLS or copied into an input buffer within the read callback), one
   * scratch for each head the proxy writes (used and done within one call),
   * and the input buffers, taken when bytes arrive and given back when
   * empty, so that an idle connection holds none. */
  char *read_buf;          /* CE_CONN_READ_CHUNK bytes */
  char *head_buf;          /* CE_CONN_HEAD_OUT_MAX bytes */
  ce_bufpool_t inbufs;     /* CE_CONN_INPUT_MAX-byte buffers */
  /* The heap pages freed by idle connections that released their upstream
   * go back to the system (conn.c, docs/proxy.md "Idle connections"): a
   * one-shot timer, opened when a release happens and closed when it
   * fired, so that nothing of it stays open on a quiet loop. */
  uv_timer_t trim_timer;
  int trim_state;          /* 0: none, 1: armed, 2: closing */
  bool trim_again;         /* a release came while it was closing */

  /* Writes (conn.c, docs/proxy.md "Writes"): the sides with output
   * gathered this turn of the loop, written once each by a uv_check (after
   * the I/O callbacks) or a uv_prepare (before the loop waits), both set
   * up at the first write; and the buffers plaintext is gathered in. */
  struct side *flush_list;
  uv_prepare_t flush_prepare;
  uv_check_t flush_check;
  bool flush_handles;      /* both initialised */
  ce_bufpool_t recbufs;    /* CE_CONN_RECORD-byte buffers */
  char *wire_scratch;      /* CE_CONN_READ_CHUNK bytes, at the first direct write */
} ce_proxy_t;

/* conn.c: takes an accepted connection from a listener. */
void ce_conn_accept(ce_proxy_t *proxy, uv_stream_t *listener);

/* conn.c: takes a connected workspace socket whose dialled address (an
 * IPv4 or IPv6 address and port) the caller gives, instead of the
 * redirect's original destination: what a unit test drives a connection
 * through. fd is the connection's from then on; on failure it is closed.
 * CE_OK, CE_EINVAL (dialled is not IPv4/IPv6), CE_ENOMEM or CE_EIO. */
int ce_conn_adopt(ce_proxy_t *proxy, uv_os_sock_t fd, const struct sockaddr *dialled);

/* conn.c: asks every idle connection to close (drain); busy ones finish
 * their exchange first. */
void ce_conn_drain_all(ce_proxy_t *proxy);

/* conn.c: aborts every connection (the drain deadline); each busy request
 * ends with request_failed "proxy_shutdown". */
void ce_conn_abort_all(ce_proxy_t *proxy);

/* conn.c: closes the handles that write the gathered output and frees the
 * spare record buffers (at the loop's end, every connection gone). */
void ce_conn_writes_close(ce_proxy_t *proxy);

/* proxy.c: called by conn.c after a connection is freed. */
void ce_proxy_conn_gone(ce_proxy_t *proxy);

/* Decision cache (proxy.c). Returns true and fills allow/reason on a hit. */
bool ce_decision_cache_get(ce_proxy_t *proxy, int32_t rule_index, const char *host,
                           bool *allow, const char **reason);
void ce_decision_cache_put(ce_proxy_t *proxy, int32_t rule_index, const char *host,
                           bool allow, const char *reason);

#endif
