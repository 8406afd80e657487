/*
 * Control channels (channel.h).
 *
 * States of a channel:
 *
 *   CONNECTING --connect ok, hello written--> CHALLENGE --challenge line,
 *        |                                       |         auth written--> WELCOME
 *        |                                       |                           |
 *        |                                       |          welcome line with the
 *        |                                       |          sidecar's proof and our
 *        |                                       |          session id --> OPEN
 *        |                                       |                           |
 *        +-- error / timeout / a wrong proof: ---+--------- (WELCOME) ---+   |
 *            {error, _} reply, forgotten                                     |
 *                                                   EOF, read or write error,
 *                                                   a bad or long line     v
 *                                               ENDED: socket closed; lines already
 *                                               read are delivered under credit, then
 *                                               {closed, Reason} and it is forgotten
 *
 * Lines are kept raw in one buffer of CE_CONTROL_MAX_FRAME bytes (the
 * control channel's line limit, newline included) and parsed only when
 * there is credit to deliver them, so a BEAM that stops acknowledging
 * costs at most that buffer: the socket is not read meanwhile, and the
 * sidecar keeps, counts and drops events on its side as documented.
 *
 * Every state change is logged to stderr when CONDUKT_PORT_DEBUG is set,
 * with the channel number.
 */
#include "port/channel.h"

#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/jsonw.h"
#include "control/control.h"
#include "control/handshake.h"
#include "control/listen.h"
#include "port/etf.h"
#include "port/json_line.h"
#include "port/json_term.h"

/* A channel's read buffer: one line of the control channel at most. */
#define CHAN_BUF CE_CONTROL_MAX_FRAME
#define REASON_MAX 256

typedef enum { CONNECTING, CHALLENGE, WELCOME, OPEN, ENDED } chan_state_t;

struct ce__chan {
  ce_port_t *port;
  ce__chan_t *next;
  uint64_t num;
  uint64_t attach_id;
  chan_state_t state;
  bool forgotten;          /* out of the list; handles closing */
  bool reading;
  bool sock_closing;
  int open_handles;        /* the memory goes with the last close callback */
  uint32_t window;
  uint64_t unacked;        /* frames delivered and not acknowledged */
  union {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } sock;
  uv_timer_t timer;
  uv_connect_t connect;
  char *in;                /* CHAN_BUF bytes */
  size_t in_start;
  size_t in_len;
  uint32_t timeout_ms;
  char shown[4 * CE_TEXT_QUOTE_MAX + 32];
  uint8_t token[CE_CONTROL_TOKEN_MAX];      /* until the welcome is checked, then wiped */
  size_t token_len;
  char session_id[CE_CONTROL_SESSION_ID_MAX + 1];
  uint8_t peer_nonce[CE_CONTROL_NONCE_LEN];
  uint8_t sidecar_nonce[CE_CONTROL_NONCE_LEN];
  char reason[REASON_MAX];                  /* why an OPEN channel ended */
};

/* One write to the sidecar: its bytes follow the request (handshake
 * lines, copied), or are a buffer the write owns (frames, written in
 * place by control_send). */
typedef struct {
  uv_write_t req;
  ce__chan_t *chan;
  char *owned;
  size_t len;
  char data[];
} chan_write_t;

static bool debug_on(void) {
  static int on = -1;
  if (on < 0)
    on = getenv("CONDUKT_PORT_DEBUG") != NULL;
  return on == 1;
}

static void trace(const ce__chan_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void trace(const ce__chan_t *c, const char *fmt, ...) {
  if (!debug_on())
    return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "condukt-egress port: chan %llu: ", (unsigned long long)c->num);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* Before OPEN: the attach has not been answered yet. */
static bool handshaking(const ce__chan_t *c) {
  return c->state == CONNECTING || c->state == CHALLENGE || c->state == WELCOME;
}

static ce__chan_t *find(ce_port_t *p, uint64_t num) {
  for (ce__chan_t *c = p->chans; c != NULL; c = c->next)
    if (c->num == num)
      return c;
  return NULL;
}

/* ---- teardown ------------------------------------------------------------------ */

static void on_handle_closed(uv_handle_t *h) {
  ce__chan_t *c = h->data;
  if (--c->open_handles > 0)
    return;
  free(c->in);
  free(c);
}

static void close_sock(ce__chan_t *c) {
  if (c->sock_closing)
    return;
  c->sock_closing = true;
  c->reading = false;
  uv_close(&c->sock.handle, on_handle_closed);
}

/* Takes the channel out of the list and closes its handles; the memory
 * goes when the last close callback has run, after libuv has cancelled
 * the pending connect and writes (their callbacks see UV_ECANCELED). */
static void forget(ce__chan_t *c) {
  if (c->forgotten)
    return;
  trace(c, "forgotten");
  c->forgotten = true;
  OPENSSL_cleanse(c->token, sizeof(c->token));
  ce__chan_t **pp = &c->port->chans;
  while (*pp != NULL && *pp != c)
    pp = &(*pp)->next;
  if (*pp == c)
    *pp = c->next;
  close_sock(c);
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

/* Fails an attach that has not been answered yet. */
static void fail_attach(ce__chan_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail_attach(ce__chan_t *c, int code, const char *fmt, ...) {
  char msg[CE_PORT_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  trace(c, "attach failed: %s", msg);
  /* No "control_attach:" prefix: the message names the address and reads
   * on its own ("the control channel closed before welcome ..."). */
  ce__port_reply_error(c->port, c->attach_id, code, "%s", msg);
  forget(c);
}

static void send_closed(ce__chan_t *c) {
  ei_x_buff x;
  trace(c, "closed: %s", c->reason);
  if (ei_x_new_with_version(&x) == 0 && ei_x_encode_tuple_header(&x, 3) == 0 &&
      ei_x_encode_atom(&x, "control") == 0 &&
      ei_x_encode_ulonglong(&x, (EI_ULONGLONG)c->num) == 0 &&
      ei_x_encode_tuple_header(&x, 2) == 0 && ei_x_encode_atom(&x, "closed") == 0 &&
      ce_etf_encode_text(&x, c->reason) == 0) {
    ce__port_send(c->port, &x);
  } else {
    ei_x_free(&x);
    fprintf(stderr, "condukt-egress port: out of memory reporting a closed channel\n");
    ce__port_stop(c->port, 1);
  }
}

static void pump(ce__chan_t *c);

/* The connection is over (EOF, an error, a violation). Before welcome
 * that fails the attach; after, the socket is closed, what was read is
 * still delivered, and then {closed, Reason}. `discard` drops lines not
 * yet delivered (after a violation nothing that follows can be trusted). */
static void end(ce__chan_t *c, bool discard, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void end(ce__chan_t *c, bool discard, const char *fmt, ...) {
  char why[REASON_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof(why), fmt, ap);
  va_end(ap);
  if (c->forgotten)
    return;
  if (handshaking(c)) {
    fail_attach(c, CE_ECLOSED, "%s", why);
    return;
  }
  if (c->state == OPEN) {
    trace(c, "ended: %s", why);
    c->state = ENDED;
    snprintf(c->reason, sizeof(c->reason), "%s", why);
    close_sock(c);
  }
  if (discard)
    c->in_len = 0;
  pump(c);
}

/* ---- writing ---------------------------------------------------------------------- */

static void on_written(uv_write_t *req, int status) {
  chan_write_t *w = (chan_write_t *)req;
  ce__chan_t *c = w->chan;
  free(w->owned);
  free(w);
  if (status < 0 && status != UV_ECANCELED)
    end(c, false, "cannot write to the sidecar: %s", uv_strerror(status));
}

/* Queues len bytes (a line with its '\n'): a copy of data, or, with
 * owned, data itself, which the write then frees (also when it cannot be
 * queued). Returns 0 or a libuv error. */
static int chan_write_buf(ce__chan_t *c, char *data, size_t len, bool owned) {
  chan_write_t *w = malloc(sizeof(*w) + (owned ? 0 : len));
  if (w == NULL) {
    if (owned)
      free(data);
    return UV_ENOMEM;
  }
  w->chan = c;
  w->len = len;
  w->owned = owned ? data : NULL;
  if (!owned)
    memcpy(w->data, data, len);
  uv_buf_t b = uv_buf_init(owned ? data : w->data, (unsigned)len);
  int rc = uv_write(&w->req, &c->sock.stream, &b, 1, on_written);
  if (rc != 0) {
    free(w->owned);
    free(w);
  }
  return rc;
}

static int chan_write(ce__chan_t *c, const char *data, size_t len) {
  return chan_write_buf(c, (char *)data, len, false);
}

/* ---- reading -------------------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  ce__chan_t *c = h->data;
  /* Lines already handled are dropped here, once per read, rather than
   * after each line, so that many small lines cost one move. */
  if (c->in_start > 0) {
    memmove(c->in, c->in + c->in_start, c->in_len);
    c->in_start = 0;
  }
  *buf = uv_buf_init(c->in + c->in_len, (unsigned)(CHAN_BUF - c->in_len));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  ce__chan_t *c = s->data;
  if (nread > 0) {
    c->in_len += (size_t)nread;
    pump(c);
  } else if (nread == UV_EOF) {
    end(c, false, c->state == OPEN
                      ? "the sidecar closed the control channel"
                      : "the control channel closed during the handshake (a wrong token or "
                        "session id, another protocol version, or not a condukt sidecar)");
  } else if (nread < 0) {
    end(c, false, "cannot read from the sidecar: %s", uv_strerror((int)nread));
  }
}

static void set_reading(ce__chan_t *c, bool on) {
  if (c->sock_closing || on == c->reading)
    return;
  if (on) {
    int rc = uv_read_start(&c->sock.stream, on_alloc, on_read);
    if (rc != 0) {
      end(c, false, "cannot read from the sidecar: %s", uv_strerror(rc));
      return;
    }
  } else {
    uv_read_stop(&c->sock.stream);
  }
  c->reading = on;
  trace(c, "reading %s", on ? "on" : "off (no credit)");
}

/* Parses a line as a JSON object. */
static json_t *parse_line(const char *line, size_t n, char *why, size_t cap) {
  json_error_t jerr;
  json_t *v = json_loadb(line, n, JSON_REJECT_DUPLICATES, &jerr);
  if (v == NULL) {
    snprintf(why, cap, "not JSON (%s)", jerr.text);
    return NULL;
  }
  if (!json_is_object(v)) {
    json_decref(v);
    snprintf(why, cap, "not a JSON object");
    return NULL;
  }
  return v;
}

/* Parses a handshake line of the sidecar; on failure fails the attach
 * and returns false. */
static bool handshake_line(ce__chan_t *c, const char *line, size_t n, ce_sframe_type_t want,
                           ce_sframe_t *f) {
  const char *why = NULL;
  int rc = ce_control_sframe_parse(line, n, f, &why);
  const char *name = want == CE_SFRAME_CHALLENGE ? "challenge" : "welcome";
  if (rc == CE_EVERSION) {
    fail_attach(c, CE_EVERSION,
                "%s speaks another version of the control channel than %d (the sidecar "
                "image and this library must be of the same release)",
                c->shown, CE_CONTROL_PROTOCOL_VERSION);
    return false;
  }
  if (rc != CE_OK) {
    fail_attach(c, rc == CE_ENOMEM ? CE_ENOMEM : CE_EPROTO, "the %s from %s is malformed: %s",
                name, c->shown, why != NULL ? why : ce_strerror(rc));
    return false;
  }
  if (f->type != want) {
    fail_attach(c, CE_EPROTO, "%s sent a %s where a %s was due", c->shown,
                f->type == CE_SFRAME_CHALLENGE ? "challenge" : "welcome", name);
    return false;
  }
  return true;
}

/* challenge: answers with our proof (auth), then waits for the welcome. */
static void on_challenge_line(ce__chan_t *c, const char *line, size_t n) {
  ce_sframe_t f;
  if (!handshake_line(c, line, n, CE_SFRAME_CHALLENGE, &f))
    return;
  memcpy(c->sidecar_nonce, f.nonce, sizeof(c->sidecar_nonce));
  uint8_t proof[CE_CONTROL_PROOF_LEN];
  if (ce_control_proof(c->token, c->token_len, CE_CONTROL_ROLE_PEER, c->session_id,
                       c->peer_nonce, c->sidecar_nonce, proof) != CE_OK) {
    fail_attach(c, CE_ENOMEM, "cannot compute the proof for %s", c->shown);
    return;
  }
  char text[64 + 2 * CE_CONTROL_PROOF_LEN];
  int len = snprintf(text, sizeof(text), "{\"type\":\"auth\",\"proof\":\"");
  ce_control_hex(proof, sizeof(proof), text + len);
  len += 2 * (int)CE_CONTROL_PROOF_LEN;
  len += snprintf(text + len, sizeof(text) - (size_t)len, "\"}\n");
  int rc = chan_write(c, text, (size_t)len);
  if (rc != 0) {
    fail_attach(c, CE_EIO, "cannot write auth to %s: %s", c->shown, uv_strerror(rc));
    return;
  }
  trace(c, "challenge answered");
  c->state = WELCOME;
}

/* welcome: checks the sidecar's proof and session id, then answers the
 * attach with {ok, {Chan, Welcome}} (the welcome without its proof). A
 * sidecar that fails either check is refused with CE_EPERM: whatever
 * listens there does not hold this session's token. */
static void on_welcome_line(ce__chan_t *c, const char *line, size_t n) {
  ce_sframe_t f;
  if (!handshake_line(c, line, n, CE_SFRAME_WELCOME, &f))
    return;
  if (strcmp(f.session_id, c->session_id) != 0) {
    char shown_sid[4 * CE_TEXT_QUOTE_MAX + 8];
    ce_text_sanitize(shown_sid, sizeof(shown_sid), f.session_id, strlen(f.session_id), 1);
    fail_attach(c, CE_EPERM, "the sidecar at %s gates session \"%s\", not this one", c->shown,
                shown_sid);
    return;
  }
  if (!ce_control_proof_ok(c->token, c->token_len, CE_CONTROL_ROLE_SIDECAR, c->session_id,
                           c->peer_nonce, c->sidecar_nonce, f.proof)) {
    fail_attach(c, CE_EPERM,
                "whatever listens at %s did not prove the session token (a wrong token, or "
                "another process on the sidecar's port)",
                c->shown);
    return;
  }
  OPENSSL_cleanse(c->token, sizeof(c->token));
  char why[200];
  json_t *v = parse_line(line, n, why, sizeof(why)); /* parsed once already: cannot fail but OOM */
  if (v == NULL) {
    fail_attach(c, CE_ENOMEM, "out of memory reading the welcome from %s", c->shown);
    return;
  }
  json_object_del(v, "proof");
  ei_x_buff x;
  char err[CE_PORT_MSG_MAX] = "";
  int rc = ce__port_reply_begin(&x, c->attach_id) == 0 ? CE_OK : CE_ENOMEM;
  if (rc == CE_OK && (ei_x_encode_tuple_header(&x, 2) != 0 || ei_x_encode_atom(&x, "ok") != 0 ||
                      ei_x_encode_tuple_header(&x, 2) != 0 ||
                      ei_x_encode_ulonglong(&x, (EI_ULONGLONG)c->num) != 0))
    rc = CE_ENOMEM;
  if (rc == CE_OK)
    rc = ce_json_to_term(v, &x, err, sizeof(err));
  json_decref(v);
  if (rc != CE_OK) {
    if (x.buff != NULL)
      ei_x_free(&x);
    fail_attach(c, rc, "the welcome from %s cannot be converted: %s", c->shown,
                err[0] != '\0' ? err : ce_strerror(rc));
    return;
  }
  uv_timer_stop(&c->timer);
  c->state = OPEN;
  trace(c, "open (window %u)", c->window);
  ce__port_send(c->port, &x);
}

/* Any later line: {control, Chan, {frame, Map}}, the map written as the
 * line is read (json_line.h). Returns false when the line ended the
 * channel. */
static bool on_frame_line(ce__chan_t *c, const char *line, size_t n) {
  ei_x_buff x;
  char err[CE_PORT_MSG_MAX] = "";
  int rc = ei_x_new_with_version(&x) == 0 ? CE_OK : CE_ENOMEM;
  if (rc == CE_OK &&
      (ei_x_encode_tuple_header(&x, 3) != 0 || ei_x_encode_atom(&x, "control") != 0 ||
       ei_x_encode_ulonglong(&x, (EI_ULONGLONG)c->num) != 0 ||
       ei_x_encode_tuple_header(&x, 2) != 0 || ei_x_encode_atom(&x, "frame") != 0))
    rc = CE_ENOMEM;
  if (rc == CE_OK)
    rc = ce_json_line_to_term(line, n, &x, err, sizeof(err));
  if (rc != CE_OK) {
    if (x.buff != NULL)
      ei_x_free(&x);
    if (rc == CE_EPARSE)
      end(c, true, "the sidecar sent a malformed frame: %s", err);
    else
      end(c, true, "the sidecar sent a frame the port cannot relay: %s",
          err[0] != '\0' ? err : ce_strerror(rc));
    return false;
  }
  c->unacked++;
  ce__port_send(c->port, &x);
  return true;
}

/* Handles the complete lines in the buffer as far as credit allows, then
 * decides whether to read more: the heart of the credit window. */
static void pump_lines(ce__chan_t *c) {
  while (!c->forgotten && !c->port->stopping) {
    if (!handshaking(c) && c->unacked >= c->window)
      break;
    char *start = c->in + c->in_start;
    char *nl = memchr(start, '\n', c->in_len);
    if (nl == NULL)
      break;
    size_t n = (size_t)(nl - start);
    c->in_start += n + 1;
    c->in_len -= n + 1;
    if (c->state == CHALLENGE) {
      on_challenge_line(c, start, n);
    } else if (c->state == WELCOME) {
      on_welcome_line(c, start, n);
    } else if (!on_frame_line(c, start, n)) {
      return;
    }
  }
  if (c->forgotten || c->port->stopping)
    return;
  bool has_line = memchr(c->in + c->in_start, '\n', c->in_len) != NULL;
  if (c->state == ENDED) {
    if (!has_line) {
      /* A partial last line is not a frame; it goes with the channel. */
      send_closed(c);
      forget(c);
    }
    return;
  }
  if (!has_line && c->in_start == 0 && c->in_len == CHAN_BUF) {
    end(c, true, "the sidecar sent a line longer than %u bytes", CE_CONTROL_MAX_FRAME);
    return;
  }
  /* At zero credit the socket is not read at all: what the sidecar sends
   * meanwhile waits in its own buffers, where it is counted if dropped. */
  bool credit = handshaking(c) || c->unacked < c->window;
  set_reading(c, !has_line && credit && c->state != CONNECTING);
}

/* The frames of one pump go to the BEAM in one write: a decision request
 * that arrives with the event before it wakes the BEAM once. */
static void pump(ce__chan_t *c) {
  ce_port_t *p = c->port;
  ce__port_hold(p);
  pump_lines(c);
  ce__port_release(p);
}

/* ---- attach ------------------------------------------------------------------------------- */

static void on_timeout(uv_timer_t *t) {
  ce__chan_t *c = t->data;
  if (handshaking(c))
    fail_attach(c, CE_ETIMEDOUT, "no welcome from %s within %u ms", c->shown,
                c->timeout_ms);
}

static void on_connected(uv_connect_t *req, int status) {
  ce__chan_t *c = req->data;
  if (status == UV_ECANCELED || c->forgotten)
    return;
  if (status < 0) {
    fail_attach(c, CE_EUNAVAIL, "cannot connect to %s: %s", c->shown, uv_strerror(status));
    return;
  }
  trace(c, "connected to %s", c->shown);
  c->state = CHALLENGE;
  /* The hello carries a fresh nonce and the session we want, never the
   * token: whatever listens here learns nothing it can use. */
  if (ce_control_nonce(c->peer_nonce) != CE_OK) {
    fail_attach(c, CE_EIO, "no random bytes for a nonce");
    return;
  }
  char nonce_hex[2 * CE_CONTROL_NONCE_LEN + 1];
  ce_control_hex(c->peer_nonce, sizeof(c->peer_nonce), nonce_hex);
  /* The ticket ranks this connection above a workspace's flood while the
   * handshake runs (control/handshake.h). */
  uint8_t ticket[CE_CONTROL_PROOF_LEN];
  char ticket_hex[2 * CE_CONTROL_PROOF_LEN + 1];
  if (ce_control_ticket(c->token, c->token_len, c->session_id, c->peer_nonce, ticket) != CE_OK) {
    fail_attach(c, CE_ENOMEM, "cannot compute the hello's ticket");
    return;
  }
  ce_control_hex(ticket, sizeof(ticket), ticket_hex);
  json_t *hello = json_pack("{s:s, s:i, s:s, s:s, s:s}", "type", "hello", "version",
                            CE_CONTROL_PROTOCOL_VERSION, "session_id", c->session_id, "nonce",
                            nonce_hex, "ticket", ticket_hex);
  char *text = hello != NULL ? json_dumps(hello, JSON_COMPACT) : NULL;
  json_decref(hello);
  if (text == NULL) {
    fail_attach(c, CE_ENOMEM, "out of memory writing hello");
    return;
  }
  size_t n = strlen(text);
  text[n] = '\n'; /* replaces the NUL: the line is sent by length */
  int rc = chan_write(c, text, n + 1);
  free(text);
  if (rc != 0) {
    fail_attach(c, CE_EIO, "cannot write hello to %s: %s", c->shown, uv_strerror(rc));
    return;
  }
  pump(c);
}

void ce__chan_attach(ce_port_t *p, uint64_t id, const ce__attach_t *a) {
  ce__listen_addr_t addr;
  /* ops.c checked the address already; parsed again for the sockaddr. */
  if (ce__listen_parse(a->listen, &addr, NULL, 0) != CE_OK) {
    ce__port_reply_error(p, id, CE_EINVAL, "control_attach: bad address %s", a->shown);
    return;
  }
  ce__chan_t *c = calloc(1, sizeof(*c));
  char *in = malloc(CHAN_BUF);
  if (c == NULL || in == NULL) {
    free(c);
    free(in);
    ce__port_reply_error(p, id, CE_ENOMEM, "control_attach: out of memory");
    return;
  }
  c->port = p;
  c->in = in;
  c->num = p->next_chan++;
  c->attach_id = id;
  c->state = CONNECTING;
  c->window = a->window;
  c->timeout_ms = a->timeout_ms;
  snprintf(c->shown, sizeof(c->shown), "%s", a->shown);
  c->token_len = strlen(a->token) / 2;
  snprintf(c->session_id, sizeof(c->session_id), "%s", a->session_id);
  if (!ce_control_unhex(a->token, 2 * c->token_len, c->token, c->token_len)) {
    /* ops.c checked it already. */
    ce__port_reply_error(p, id, CE_EINVAL, "control_attach: bad token");
    free(in);
    free(c);
    return;
  }

  int rc = addr.is_unix ? uv_pipe_init(p->loop, &c->sock.pipe, 0)
                        : uv_tcp_init(p->loop, &c->sock.tcp);
  if (rc != 0)
    goto fail_sock;
  /* Frames are small and a decision is urgent: no Nagle delay behind an
   * earlier frame the sidecar has not acknowledged yet (libuv applies it
   * to the socket it makes for the connect). */
  if (!addr.is_unix)
    uv_tcp_nodelay(&c->sock.tcp, 1);
  c->sock.handle.data = c;
  c->open_handles++;
  rc = uv_timer_init(p->loop, &c->timer);
  if (rc != 0)
    goto fail_timer;
  c->timer.data = c;
  c->open_handles++;
  c->connect.data = c;
  /* In the list before anything can call back, so forget() finds it. */
  c->next = p->chans;
  p->chans = c;
  trace(c, "attaching to %s", c->shown);
  uv_timer_start(&c->timer, on_timeout, a->timeout_ms, 0);
  if (addr.is_unix) {
    uv_pipe_connect(&c->connect, &c->sock.pipe, addr.path, on_connected);
  } else {
    rc = uv_tcp_connect(&c->connect, &c->sock.tcp, (const struct sockaddr *)&addr.ss,
                        on_connected);
    if (rc != 0)
      fail_attach(c, CE_EUNAVAIL, "cannot connect to %s: %s", c->shown, uv_strerror(rc));
  }
  return;

fail_timer:
  /* The socket handle is on the loop: its close callback frees c. */
  OPENSSL_cleanse(c->token, sizeof(c->token));
  ce__port_reply_error(p, id, CE_EIO, "control_attach: %s", uv_strerror(rc));
  close_sock(c);
  return;
fail_sock:
  OPENSSL_cleanse(c->token, sizeof(c->token));
  ce__port_reply_error(p, id, CE_EIO, "control_attach: %s", uv_strerror(rc));
  free(in);
  free(c);
}

/* ---- send, detach, ack, close_all ------------------------------------------------------------- */

void ce__chan_send_error(ce_port_t *p, const ce__send_to_t *to, uint64_t chan, int code,
                         const char *fmt, ...) {
  char msg[CE_PORT_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (!to->post) {
    ce__port_reply_error(p, to->id, code, "%s", msg);
    return;
  }
  /* The Tag's bytes were checked with the packet (ce_etf_check) and are
   * copied as they are: the poster finds its own term again. */
  ei_x_buff x;
  if (ei_x_new_with_version(&x) == 0 && ei_x_encode_tuple_header(&x, 3) == 0 &&
      ei_x_encode_atom(&x, "control") == 0 && ei_x_encode_ulonglong(&x, (EI_ULONGLONG)chan) == 0 &&
      ei_x_encode_tuple_header(&x, 3) == 0 && ei_x_encode_atom(&x, "send_failed") == 0 &&
      ei_x_append_buf(&x, to->tag, (int)to->tag_len) == 0 &&
      ei_x_encode_tuple_header(&x, 2) == 0 && ce__port_encode_code(&x, code) == 0 &&
      ce_etf_encode_text(&x, msg) == 0) {
    ce__port_send(p, &x);
  } else {
    if (x.buff != NULL)
      ei_x_free(&x);
    fprintf(stderr, "condukt-egress port: out of memory reporting a failed post\n");
    ce__port_stop(p, 1);
  }
}

void ce__chan_send(ce_port_t *p, const ce__send_to_t *to, uint64_t chan, json_t *frame) {
  ce__chan_t *c = find(p, chan);
  if (c == NULL || c->state != OPEN) {
    json_decref(frame);
    ce__chan_send_error(p, to, chan, CE_ECLOSED, "control_send: channel %llu is not open",
                         (unsigned long long)chan);
    return;
  }
  /* The sidecar's own rules judge the frame first: a frame it would
   * refuse closes the channel there (a protocol violation), while here
   * it is only this call's error. Handshake frames are valid for the
   * parser but a violation once authenticated. What only the text could
   * get wrong (duplicate members, UTF-8, NUL bytes) the conversion from
   * the term ruled out already; the size is the writer's bound. */
  ce_frame_t parsed;
  const char *why = NULL;
  if (ce_control_frame_check(frame, &parsed, &why) != CE_OK ||
      parsed.type == CE_FRAME_HELLO || parsed.type == CE_FRAME_AUTH) {
    json_decref(frame);
    ce__chan_send_error(p, to, chan, CE_EINVAL, "control_send: frame: %s",
                         why != NULL ? why : "the handshake is control_attach's alone");
    return;
  }
  if (uv_stream_get_write_queue_size(&c->sock.stream) > CE_PORT_CHAN_WRITE_MAX) {
    json_decref(frame);
    ce__chan_send_error(p, to, chan, CE_EUNAVAIL,
                         "control_send: the sidecar is not reading (over %u bytes queued)",
                         CE_PORT_CHAN_WRITE_MAX);
    return;
  }
  /* The line is written once, into the buffer the socket write takes. */
  ce_jsonw_t w;
  ce_jsonw_init(&w, NULL, 0, CE_CONTROL_MAX_FRAME);
  ce_jsonw_value(&w, frame);
  ce_jsonw_raw(&w, "\n", 1);
  json_decref(frame);
  int err = ce_jsonw_error(&w);
  if (err != CE_OK) {
    ce_jsonw_free(&w);
    if (err == CE_ETOOBIG)
      ce__chan_send_error(p, to, chan, CE_ETOOBIG,
                           "control_send: the frame is over the control channel's limit of %u "
                           "bytes of JSON",
                           CE_CONTROL_MAX_FRAME);
    else
      ce__chan_send_error(p, to, chan, err, "control_send: cannot write the frame: %s",
                           ce_strerror(err));
    return;
  }
  int rc = chan_write_buf(c, w.buf, w.len, true);
  if (rc != 0) {
    ce__chan_send_error(p, to, chan, rc == UV_ENOMEM ? CE_ENOMEM : CE_ECLOSED,
                         "control_send: cannot write to the sidecar: %s", uv_strerror(rc));
    end(c, false, "cannot write to the sidecar: %s", uv_strerror(rc));
    return;
  }
  if (!to->post)
    ce__port_reply_ok(p, to->id);
}

void ce__chan_detach(ce_port_t *p, uint64_t id, uint64_t chan) {
  ce__chan_t *c = find(p, chan);
  if (c != NULL)
    forget(c);
  ce__port_reply_ok(p, id);
}

void ce__chan_ack(ce_port_t *p, uint64_t chan, uint64_t n) {
  ce__chan_t *c = find(p, chan);
  if (c == NULL)
    return;
  /* Acknowledging more than was delivered grants nothing extra: the
   * window bounds frames in flight, not a balance to save up. */
  c->unacked = n >= c->unacked ? 0 : c->unacked - n;
  trace(c, "ack %llu, %llu unacknowledged", (unsigned long long)n,
        (unsigned long long)c->unacked);
  pump(c);
}

void ce__chan_close_all(ce_port_t *p) {
  while (p->chans != NULL)
    forget(p->chans);
}
