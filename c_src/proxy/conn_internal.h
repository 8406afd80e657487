/*
 * The connection record shared by conn.c and the HTTP/2 path (proxy/http2/,
 * docs/http2.md), and stats.c (which only reads it). Nothing else
 * includes this.
 */
#ifndef CE_PROXY_CONN_INTERNAL_H
#define CE_PROXY_CONN_INTERNAL_H

#include <netdb.h>
#include <stdbool.h>
#include <uv.h>

#include "control/control.h"
#include "dns/stub.h"
#include "http1/parser.h"
#include "policy/host.h"
#include "proxy/clienthello.h"
#include "proxy/conn.h"
#include "proxy/connector.h"
#include "proxy/event.h"
#include "proxy/exchange.h"
#include "tls/tlsconn.h"

typedef enum {
  ST_HELLO = 0,
  ST_HANDSHAKE,
  ST_HEAD,
  ST_DECIDING,
  ST_CONNECTING,
  ST_EXCHANGE,
  ST_TUNNEL,
  ST_CLOSING,
  ST_H2,
} conn_state_t;


/* What a connect of c->u is for: the current HTTP/1.1 request (or none:
 * the state says whether one runs), the pre-connect that learns the
 * upstream's ALPN before the workspace is answered (docs/http2.md §1), or
 * the HTTP/1.1 upstream of an h2 workspace's streams (ST_H2). */
typedef enum {
  CE_UP_FOR_REQUEST = 0,
  CE_UP_FOR_PRECONNECT,
  CE_UP_FOR_H2_STREAMS,
} ce_up_for_t;

/* The end of a side's write side: nothing more is written once a
 * shutdown is asked (TLS close_notify, then the TCP FIN after the queued
 * writes); it is done when uv_shutdown's callback ran (or it could not
 * be asked). */
typedef enum {
  SIDE_WRITING = 0,
  SIDE_SHUTTING,  /* uv_shutdown asked, its callback not yet run */
  SIDE_SHUT,      /* ...and it ran */
} side_shut_t;

/* How far the current exchange's response is. */
typedef enum {
  RESP_WAIT_HEAD = 0, /* no final response head yet (interim ones may have gone) */
  RESP_BODY,          /* the head went to the workspace; the body goes */
  RESP_DONE,          /* all of it went */
} resp_state_t;

/* How a response body is framed towards the workspace. */
typedef enum {
  RESP_OUT_AS_IS = 0,   /* as the upstream framed it (a length, or none) */
  RESP_OUT_CHUNKED,     /* re-encoded as chunks */
  RESP_OUT_CLOSE,       /* decoded, ended by the close (an HTTP/1.0 client) */
} resp_out_t;

typedef struct side {
  uv_tcp_t tcp;
  struct ce_conn *conn;
  const char *name;        /* "client" or "upstream", for traces */
  bool open;               /* tcp initialised and not yet closing */
  bool closing;            /* uv_close called, its callback not yet run */
  bool connected;
  bool reading;
  bool eof;                /* the peer finished sending */
  bool close_notify;       /* TLS: the peer's eof was a close_notify */
  bool peer_reset;         /* the peer's end was a read error (a reset), not a FIN */
  bool close_after_flush;
  side_shut_t shut;        /* how far the write side's end has gone */
  uv_shutdown_t shut_req;
  ce_tlsconn_t *tls;
  bool handshaken;
  uint32_t gen;            /* bumped when the handle closes; writes carry it */
  size_t queued;           /* bytes given to this side and not yet written
                              to its socket: pending, then what uv_write holds */
  char *in;                /* plaintext input: NULL while empty, else a
                              CE_CONN_INPUT_MAX-byte buffer of proxy->inbufs */
  size_t in_len;
  /* Output of this turn of the loop (docs/proxy.md, "Writes"): written
   * once per turn by conn.c's flush, not per call. */
  size_t pending;          /* plaintext given this turn, not yet handed to
                              uv_write (in rec, or sealed into TLS records) */
  char *rec;               /* plaintext gathered towards one full record:
                              NULL while empty, else a CE_CONN_RECORD-byte
                              buffer of proxy->recbufs */
  size_t rec_len;
  bool flush_listed;       /* on proxy->flush_list */
  struct side *flush_prev, *flush_next;
} side_t;

typedef struct {
  uv_write_t req;
  side_t *side;
  uint32_t gen;            /* side->gen when written: an older one is a past handle's */
  size_t len;
  char data[];
} write_req_t;

struct ce_conn {
  ce_proxy_t *proxy;
  ce_conn_t *next;
  ce_conn_t *prev;
  uint64_t id;
  conn_state_t state;
  side_t c;                /* the workspace */
  side_t u;                /* the upstream */
  uv_timer_t timer;
  int handles;             /* open handles still to be closed */
  bool dead;               /* aborting: handles closing */
  bool processing;         /* conn_process is on the stack */
  bool again;
  bool lingering;          /* closing: client write side shut, its input discarded */
  bool head_started;       /* the header timeout runs for a head begun */
  bool release_due;        /* ST_HEAD, ST_H2: the timer runs to the idle release
                              (conn__await_request, h2_rest_arm in conn.c) */
  uint32_t idle_after_release; /* ST_H2: what is left of the idle timeout then (ms) */
  ce_clienthello_state_t hello_state;

  /* What the workspace dialled. */
  struct sockaddr_storage orig_dst;
  uint16_t port;
  bool tls;                /* the workspace speaks TLS */
  bool has_sni;
  char sni_raw[CE_CLIENTHELLO_MAX_SNI + 1];
  ce_host_t sni;           /* normalised SNI, or the destination IP when none */

  /* The upstream currently connected (or being connected). */
  char up_host[256];
  uint16_t up_port;
  ce_connector_t uk;       /* connects c->u (proxy/connector.h) */

  /* The current request (proxy/exchange.h). */
  ce_exchange_t x;
  char *up_head;           /* the request head as forwarded upstream */
  size_t up_head_len;
  char method[32];
  ce_h1_framing_t req_framing;
  ce_h1_body_t req_body;
  char *req_trailers;      /* a chunked request body's trailer section, kept to
                              forward (CE_H1_MAX_TRAILER_BYTES; until the
                              request ends; NULL when not kept) */
  bool req_keep_alive;
  bool req_upgrade;
  bool req_expect_continue; /* Expect: 100-continue: the body may never come */
  bool req_http11;         /* the client speaks HTTP/1.1 (else 1.0) */
  bool req_te_trailers;    /* TE: trailers (the client takes chunked trailers) */
  bool req_done;           /* the whole request went upstream (or was refused) */
  resp_state_t resp_state;
  bool resp_keep_alive;
  resp_out_t resp_out;     /* how the response body goes to the workspace */
  ce_h1_body_t resp_body;
  char *resp_trailers;     /* ... of a chunked response body going chunked to
                              the workspace */
  bool denied_discard;     /* reading and dropping a denied request's body */
  char abort_reason[160];  /* the first failure reported: the h2 streams' closing event on abort */

  /* HTTP/2 (docs/http2.md). */
  bool offers_h2;          /* the ClientHello offered h2 */
  ce_up_for_t up_for;      /* what a connect of c->u in progress is for */
  bool up_h2;              /* the upstream negotiated h2 */
  struct ce_h2conn *h2;    /* the sessions, in ST_H2 */
  bool h2_offer;           /* ... offering h2 too (after an h2 upstream's GOAWAY) */
  bool hard_deadline;      /* the timer runs to a fixed end: nothing re-arms it */
  struct ce_h1h2 *h1h2;    /* HTTP/1.1 path over an h2 upstream (http2/h1h2.c), with c->u */
  uint64_t h1h2_retried;   /* the request (id) sent again after its stream was refused */
};

/* conn.c, for the HTTP/2 path (proxy/http2/). */
void ce_conn_side_write(side_t *s, const char *data, size_t len);
/* What s gathered goes as a record of its own now (ce_transport_seal). */
void ce_conn_side_seal(side_t *s);
/* Closes a side's handle (closed: its close callback, which counts the
 * handle out); its queued writes no longer count. */
void ce_conn_side_close(side_t *s, uv_close_cb closed);
void ce_conn_report_failed(ce_conn_t *c, const char *reason);
void ce_conn_abort(ce_conn_t *c);
void ce_conn_close_after_flush(ce_conn_t *c);
/* The connection failed: it ends within CE_CONN_LINGER_MS (or the idle
 * timeout if shorter) whatever the workspace does; nothing re-arms the timer. */
void ce_conn_hard_deadline(ce_conn_t *c);
void ce_conn_upstream_reset(ce_conn_t *c);
void ce_conn_process(ce_conn_t *c);
/* The connector's counting ops for an upstream of the connection
 * (k->s->conn): handles and lookups in c->handles; alive until aborted. */
void ce_conn_connector_hold(ce_connector_t *k);
void ce_conn_connector_release(ce_connector_t *k);
bool ce_conn_connector_alive(ce_connector_t *k);
/* What the connection's requests know of it (proxy/exchange.h). */
void ce_conn_exchange_conn(const ce_conn_t *c, ce_exchange_conn_t *out);
/* Moves the bytes a side's transport holds (decrypted TLS) into its
 * input buffer. */
void ce_conn_pump_input(side_t *s);
/* Gives an empty input buffer back to the proxy's pool (docs/proxy.md
 * "Memory"); a side with bytes keeps it. */
void ce_conn_release_input(side_t *s);
/* A handle (or lookup) of the HTTP/2 path counted in c->handles is done: may
 * free the connection, so the caller touches nothing after. */
void ce_conn_release(ce_conn_t *c);
/* The connection's timer fires within ms at the latest (ST_H2: a stream's
 * wait for its body preview; ce_h2conn_timeout then asks those streams). */
void ce_conn_wake_in(ce_conn_t *c, uint32_t ms);
/* Bytes moved: the idle timer starts again. */
void ce_conn_touch(ce_conn_t *c);
/* ST_H2 without an h2 upstream: (re)connects the SNI host for HTTP/1.1
 * (resolve, private-address rule, marked socket, verified TLS offering
 * http/1.1, or h2 and http/1.1 with offer_h2: after an h2 upstream's
 * GOAWAY, docs/http2.md §6) under the connect timeout; ends in
 * ce_h2conn_upstream_done (which reads the ALPN that was picked). */
void ce_conn_h2_connect(ce_conn_t *c, bool offer_h2);

/* The current HTTP/1.1 exchange failed on the upstream's side: 502 in
 * words when no response head went out, else the connection ends. */
void ce_conn_failed_mid_response(ce_conn_t *c, const char *reason);
/* The current HTTP/1.1 exchange's response is complete. */
void ce_conn_finish_exchange(ce_conn_t *c);
/* The h2 upstream refused the current exchange's stream before it
 * processed any of it (a GOAWAY, docs/http2.md §6): the upstream goes and
 * the request is sent again over a new connection, made like the first. */
void ce_conn_retry_exchange(ce_conn_t *c);

/* http2/h1h2.c: an HTTP/1.1 workspace over an h2 upstream (docs/http2.md §6). */
struct ce_h1h2;
/* Opens the stream for the current request (c->up_head), creating the
 * session on c->u first. CE_OK, CE_ENOMEM or CE_EINVAL (the head cannot
 * be expressed in h2). */
int ce_h1h2_begin(ce_conn_t *c);
/* ST_EXCHANGE: moves the request body, the upstream's frames and the
 * response; ends the exchange (ce_conn_finish_exchange or
 * ce_conn_failed_mid_response). */
void ce_h1h2_process(ce_conn_t *c);
/* Between exchanges: the upstream's frames (SETTINGS, PING, GOAWAY); an
 * upstream that ended goes. */
void ce_h1h2_idle(ce_conn_t *c);
/* May the session take another request? */
bool ce_h1h2_usable(ce_conn_t *c);
/* The upstream is about to be closed between exchanges: its GOAWAY
 * (NO_ERROR) goes first (RFC 9113 §9.1). */
void ce_h1h2_goaway(ce_conn_t *c);
void ce_h1h2_free(struct ce_h1h2 *h);

/* proxy/http2/: the HTTP/2 path. */
struct ce_h2conn;
int ce_h2conn_start(ce_conn_t *c);
void ce_h2conn_process(ce_conn_t *c);
void ce_h2conn_timeout(ce_conn_t *c);
void ce_h2conn_drain(ce_conn_t *c);
void ce_h2conn_abort(ce_conn_t *c, const char *reason);
void ce_h2conn_free(struct ce_h2conn *h);
/* What an h2 connection holds beyond c->c and c->u (stats.c): bytes
 * queued towards its own upstream connections (*queued), its streams'
 * data buffers and request heads (*streams), how many of its own
 * upstream connections are open (*upstreams) and their TLS buffers' room
 * (*tls). */
void ce_h2conn_held(const struct ce_h2conn *h, size_t *queued, size_t *streams, size_t *upstreams, size_t *tls);
/* --idle-release-ms on an h2 workspace connection (docs/proxy.md "Idle
 * connections"): true when it rests (no stream of any kind, no connect
 * under way, no failure or drain) and holds something to release (an
 * upstream connection, the streams' scratch head, or TLS buffers' room
 * with the workspace). */
bool ce_h2conn_releasable(const ce_conn_t *c);
/* At rest, every upstream connection goes (an h2 one after its GOAWAY,
 * a TLS one after its close_notify); the workspace's connection stays.
 * True when one went. */
bool ce_h2conn_release_idle(ce_conn_t *c);
/* Reading on the pool's own upstream connections (from update_reading). */
void ce_h2conn_update_reading(ce_conn_t *c);
/* conn_abort: closes the pool's own handles and cancels its lookups. */
void ce_h2conn_close_handles(ce_conn_t *c);
/* The HTTP/1.1 upstream asked by ce_conn_h2_connect is ready (status 0) or
 * could not be had (status 502, 504 or 403 and reason). */
void ce_h2conn_upstream_done(ce_conn_t *c, int status, const char *reason);


/* Between conn.c (the connection: sockets, timers, states; conn__) and
 * h1exchange.c (one HTTP/1.1 request on it; h1__). Internal to the two. */
void conn__set_state(ce_conn_t *c, conn_state_t s);
void conn__begin_connection_record(ce_conn_t *c);
void conn__end_request(ce_conn_t *c);
void conn__report_failed(ce_conn_t *c, const char *reason);
void conn__consume(side_t *s, size_t n);
void conn__upstream_reset(ce_conn_t *c);
void conn__abort(ce_conn_t *c);
void conn__close_after_flush(ce_conn_t *c);
void conn__arm(ce_conn_t *c, uint32_t ms);
/* Waits for the next request (ST_HEAD) under the idle timeout; after
 * --idle-release-ms of it the connection gives back its upstream
 * connection and its TLS buffers (docs/proxy.md, "Idle connections"). */
void conn__await_request(ce_conn_t *c);
void conn__side_write(side_t *s, const char *data, size_t len);

/* The socket under a side's transport (proxy/transport.h). conn__wire_new
 * gives a write request with room for n bytes (NULL: out of memory, the
 * connection is failed and aborted); conn__wire_send writes its first n
 * bytes and owns it from then on (false: the write failed, the connection
 * is failed and aborted). conn__take_input gives the side its input buffer
 * (false: none to be had). */
write_req_t *conn__wire_new(side_t *s, size_t n);
bool conn__wire_send(side_t *s, write_req_t *w, size_t n);
/* Writes n bytes of data to the side's socket: with direct, first straight
 * from data (uv_try_write: no request, no copy, no completion callback),
 * then what the socket did not take through a write request (a copy). A
 * caller passes direct only when no one waits for this write's completion:
 * the side's queued bytes were under CE_CONN_HIGH_WATER (nothing paused on
 * them) and it is not to close after the flush. False as conn__wire_send. */
bool conn__wire_write(side_t *s, const char *data, size_t n, bool direct);
/* The loop's scratch for ciphertext on its way to a direct write
 * (CE_CONN_READ_CHUNK bytes; NULL when it cannot be had). */
char *conn__wire_scratch(side_t *s);
bool conn__take_input(side_t *s);
/* The side's record buffer (s->rec) from the proxy's pool; false when
 * none can be had (the caller writes without gathering). conn__release_record
 * gives an empty one back (rec_len 0). */
bool conn__take_record(side_t *s);
void conn__release_record(side_t *s);
/* Writes what the side gathered this turn now (before a shutdown, a close,
 * or a rest point) instead of at the turn's end. */
void conn__side_flush(side_t *s);
/* A write to s failed (TLS could not seal it): request_failed, abort. */
void conn__write_failed(side_t *s);
void conn__side_printf(side_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void conn__connect_upstream(ce_conn_t *c);
void conn__process(ce_conn_t *c);
void h1__answer(ce_conn_t *c, int status, const char *body, bool keep);
extern const ce_exchange_ops_t h1__ops;
void h1__process_head(ce_conn_t *c);
void h1__start_exchange(ce_conn_t *c);
void h1__pump_request_body(ce_conn_t *c);
void h1__discard_request_body(ce_conn_t *c);
void h1__finish_exchange(ce_conn_t *c);
void h1__drop_stray_upstream(ce_conn_t *c);
void h1__upstream_failed_mid_response(ce_conn_t *c, const char *reason);
void h1__pump_response(ce_conn_t *c);
void h1__pump_tunnel(ce_conn_t *c);

#endif
