/*
 * `condukt-egress port`: the BEAM's port program. docs/port-protocol.md is
 * the normative text; this is its grammar, kept here so that the code
 * below can be read against it (as erlexec does).
 *
 * Framing: {packet, 4}. Each packet is a 4-byte big-endian length and one
 * term in the external format (version byte 131). At most 16 MiB
 * (CE_PORT_MAX_PACKET); a longer one is answered {error, too_big, Msg},
 * its bytes are read and dropped, and the program carries on. stdin EOF
 * means exit 0 now. stdout carries packets only; logs go to stderr.
 * Exit status: 0 after stdin EOF, 1 internal failure, 2 bad arguments.
 *
 * BEAM -> port
 *
 *   Request  = {call, Id, Op}             % answered by exactly one {reply, Id, _}
 *            | {ack, Chan, N}             % credit for N more frames; no reply
 *            | {post, Chan, Tag, Frame}   % control_send without a reply: nothing
 *                                         % when queued, else a send_failed
 *   Id       = non_neg_integer()          % < 2^64, echoed back
 *   Chan     = pos_integer()              % a channel number the port gave out
 *
 *   Op       = {version}
 *            | {token_new, Bytes}         % Bytes: 16..128
 *            | {ca_new, CaOpts}
 *            | {policy_write, Path, Json}
 *            | {control_attach, Address, Token, AttachOpts}
 *            | {control_send, Chan, Frame}
 *            | {control_detach, Chan}
 *            | {kube_open, KubeOpts}       % Kubernetes: docs/port-protocol.md,
 *            | {kube_close, Kube}          % "Kubernetes", and port/kube_ops.c
 *            | {kube_request, Kube, Req}
 *            | {kube_exec, Kube, ExecReq}
 *            | {kube_forward, Kube, FwdReq}
 *            | {kube_forward_close, FChan}
 *
 *   CaOpts     = #{common_name := binary(), days := 1..3650,
 *                  cert_path => binary(), key_path => binary()}
 *   Address    = {unix, Path} | {tcp, Host, PortNumber}
 *   Token      = binary()                 % lowercase hex
 *   AttachOpts = #{timeout => pos_integer(), window => pos_integer()}
 *   Path, Json = binary()
 *   Frame      = map()                    % a control-channel frame (JSON mapping)
 *
 * Port -> BEAM
 *
 *   Reply     = {reply, Id, ok | {ok, Value} | {error, {Code, Message}}}
 *   Code      = atom()                    % error.h's name in lower case, or badarg
 *   Message   = binary()
 *   Async     = {control, Chan, {frame, Frame}}
 *             | {control, Chan, {closed, Reason}}
 *             | {control, Chan, {send_failed, Tag, {Code, Message}}}
 *             | {kube_forward, FChan, {error, Message}}
 *   Malformed = {error, badterm | too_big | badarg, Message}
 *
 *   version        -> {ok, #{version => binary(), protocol => 1}}
 *   token_new      -> {ok, Hex}
 *   ca_new         -> {ok, #{cert_pem => binary(), key_pem => binary()}}
 *   policy_write   -> ok
 *   control_attach -> {ok, {Chan, Welcome}}
 *   control_send   -> ok
 *   control_detach -> ok
 *
 * JSON <-> term: see port/json_term.h.
 *
 * Everything runs on one libuv loop. Requests are handled in the order
 * they arrive; control_attach (after welcome), kube_request and kube_exec
 * answer later, while the loop serves everything else.
 */
#include "port/port.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/error.h"
#include "port/channel.h"
#include "port/etf.h"
#include "port/kube_ops.h"
#include "port/ops.h"
#include "port/request.h"

/* ---- stdout ------------------------------------------------------------------ */

/* One packet; packets written together are chained from the first, whose
 * request carries the write. */
typedef struct out_write {
  uv_write_t req;
  ei_x_buff x;
  unsigned char header[4];
  struct out_write *next;
} out_write_t;

static void free_chain(out_write_t *w) {
  while (w != NULL) {
    out_write_t *next = w->next;
    ei_x_free(&w->x);
    free(w);
    w = next;
  }
}

static void on_out_written(uv_write_t *req, int status) {
  ce_port_t *p = req->data;
  free_chain((out_write_t *)req);
  /* ECANCELED: the port is stopping and dropped what was queued. */
  if (status < 0 && status != UV_ECANCELED) {
    fprintf(stderr, "condukt-egress port: cannot write to stdout: %s\n", uv_strerror(status));
    ce__port_stop(p, CE_EXIT_FAIL);
  }
}

/* Writes count chained packets, in order, with one request. */
static void write_chain(ce_port_t *p, out_write_t *head, unsigned count) {
  uv_buf_t bufs[2 * CE__PORT_BATCH_MAX];
  unsigned k = 0;
  for (out_write_t *w = head; w != NULL && k < 2 * count; w = w->next) {
    bufs[k++] = uv_buf_init((char *)w->header, 4);
    bufs[k++] = uv_buf_init(w->x.buff, (unsigned)w->x.index);
  }
  head->req.data = p;
  int rc = uv_write(&head->req, (uv_stream_t *)&p->out, bufs, k, on_out_written);
  if (rc != 0) {
    fprintf(stderr, "condukt-egress port: cannot write to stdout: %s\n", uv_strerror(rc));
    free_chain(head);
    ce__port_stop(p, CE_EXIT_FAIL);
  }
}

/* Writes what is held (dropped when the port is stopping). */
static void flush_held(ce_port_t *p) {
  out_write_t *head = p->held_head;
  unsigned count = p->held_count;
  p->held_head = p->held_tail = NULL;
  p->held_count = 0;
  if (head == NULL)
    return;
  if (p->stopping) {
    free_chain(head);
    return;
  }
  write_chain(p, head, count);
}

void ce__port_send(ce_port_t *p, ei_x_buff *x) {
  if (p->stopping || x->buff == NULL) {
    ei_x_free(x);
    return;
  }
  if ((size_t)x->index > CE_PORT_MAX_PACKET) {
    /* Nothing the port builds comes near this (frames are at most 1 MiB
     * of JSON); a packet the BEAM would refuse is dropped, loudly. */
    fprintf(stderr, "condukt-egress port: dropped a %d-byte packet over the limit\n",
            x->index);
    ei_x_free(x);
    return;
  }
  out_write_t *w = malloc(sizeof(*w));
  if (w == NULL) {
    ei_x_free(x);
    fprintf(stderr, "condukt-egress port: out of memory queueing a packet\n");
    ce__port_stop(p, CE_EXIT_FAIL);
    return;
  }
  w->x = *x;
  w->next = NULL;
  x->buff = NULL;
  x->index = 0;
  x->buffsz = 0;
  uint32_t n = (uint32_t)w->x.index;
  w->header[0] = (unsigned char)(n >> 24);
  w->header[1] = (unsigned char)(n >> 16);
  w->header[2] = (unsigned char)(n >> 8);
  w->header[3] = (unsigned char)n;
  if (p->hold == 0) {
    write_chain(p, w, 1);
    return;
  }
  if (p->held_tail != NULL)
    p->held_tail->next = w;
  else
    p->held_head = w;
  p->held_tail = w;
  if (++p->held_count == CE__PORT_BATCH_MAX)
    flush_held(p);
}

void ce__port_hold(ce_port_t *p) { p->hold++; }

void ce__port_release(ce_port_t *p) {
  if (p->hold > 0 && --p->hold == 0)
    flush_held(p);
}

int ce__port_reply_begin(ei_x_buff *x, uint64_t id) {
  if (ei_x_new_with_version(x) != 0)
    return -1;
  if (ei_x_encode_tuple_header(x, 3) != 0 || ei_x_encode_atom(x, "reply") != 0 ||
      ei_x_encode_ulonglong(x, (EI_ULONGLONG)id) != 0) {
    ei_x_free(x);
    return -1;
  }
  return 0;
}

static void out_of_memory(ce_port_t *p) {
  fprintf(stderr, "condukt-egress port: out of memory building a reply\n");
  ce__port_stop(p, CE_EXIT_FAIL);
}

void ce__port_reply_ok(ce_port_t *p, uint64_t id) {
  ei_x_buff x;
  if (ce__port_reply_begin(&x, id) != 0) {
    out_of_memory(p);
    return;
  }
  if (ei_x_encode_atom(&x, "ok") != 0) {
    ei_x_free(&x);
    out_of_memory(p);
    return;
  }
  ce__port_send(p, &x);
}

int ce__port_encode_code(ei_x_buff *x, int code) {
  if (code == CE__PORT_BADARG)
    return ei_x_encode_atom(x, "badarg");
  return ce_etf_encode_err_code(x, code);
}

void ce__port_reply_error(ce_port_t *p, uint64_t id, int code, const char *fmt, ...) {
  char msg[CE_PORT_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  ei_x_buff x;
  if (ce__port_reply_begin(&x, id) != 0) {
    out_of_memory(p);
    return;
  }
  if (ei_x_encode_tuple_header(&x, 2) != 0 || ei_x_encode_atom(&x, "error") != 0 ||
      ei_x_encode_tuple_header(&x, 2) != 0 || ce__port_encode_code(&x, code) != 0 ||
      ce_etf_encode_text(&x, msg) != 0) {
    ei_x_free(&x);
    out_of_memory(p);
    return;
  }
  ce__port_send(p, &x);
}

/* {error, Kind, Message}: a packet that cannot be answered with a reply. */
static void send_malformed(ce_port_t *p, const char *kind, const char *msg) {
  ei_x_buff x;
  if (ei_x_new_with_version(&x) != 0) {
    out_of_memory(p);
    return;
  }
  if (ei_x_encode_tuple_header(&x, 3) != 0 || ei_x_encode_atom(&x, "error") != 0 ||
      ei_x_encode_atom(&x, kind) != 0 || ce_etf_encode_text(&x, msg) != 0) {
    ei_x_free(&x);
    out_of_memory(p);
    return;
  }
  ce__port_send(p, &x);
}

/* ---- stopping ------------------------------------------------------------- */

void ce__port_stop(ce_port_t *p, int exit_code) {
  if (p->stopping)
    return;
  p->stopping = true;
  p->exit_code = exit_code;
  flush_held(p); /* drops them: stdout closes below */
  ce__chan_close_all(p);
  ce__kube_stop(p);
  if (!uv_is_closing((uv_handle_t *)&p->in))
    uv_close((uv_handle_t *)&p->in, NULL);
  if (!uv_is_closing((uv_handle_t *)&p->out))
    uv_close((uv_handle_t *)&p->out, NULL);
}

/* ---- stdin ------------------------------------------------------------------ */

static void handle_packet(ce_port_t *p, const char *buf, size_t len) {
  ce_port_request_t req;
  char err[CE_PORT_MSG_MAX];
  int rc = ce_port_request_parse(buf, len, &req, err, sizeof(err));
  if (rc == CE_EPARSE) {
    send_malformed(p, "badterm", err);
    return;
  }
  if (rc != CE_OK) {
    if (req.has_id)
      ce__port_reply_error(p, req.id, CE__PORT_BADARG, "%s", err);
    else
      send_malformed(p, "badarg", err);
    return;
  }
  if (req.kind == CE_PORT_REQ_ACK) {
    ce__chan_ack(p, req.chan, req.n);
    return;
  }
  if (req.kind == CE_PORT_REQ_POST) {
    ce__port_post(p, buf, &req);
    return;
  }
  ce__port_call(p, buf, &req);
}

static void on_in_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  ce_port_t *p = h->data;
  /* One buffer serves every read: on_in_read consumes it before the next. */
  *buf = uv_buf_init(p->readbuf, sizeof(p->readbuf));
}

/* Feeds bytes from stdin to the {packet, 4} reader. */
static void feed(ce_port_t *p, const char *data, size_t n) {
  while (n > 0 && !p->stopping) {
    if (p->in_state == IN_HEADER) {
      size_t take = 4 - p->header_have;
      if (take > n)
        take = n;
      memcpy(p->header + p->header_have, data, take);
      p->header_have += take;
      data += take;
      n -= take;
      if (p->header_have < 4)
        continue;
      p->header_have = 0;
      uint32_t len = (uint32_t)p->header[0] << 24 | (uint32_t)p->header[1] << 16 |
                     (uint32_t)p->header[2] << 8 | p->header[3];
      if (len > CE_PORT_MAX_PACKET) {
        char msg[128];
        snprintf(msg, sizeof(msg), "a packet of %u bytes is over the limit of %u bytes",
                 len, CE_PORT_MAX_PACKET);
        send_malformed(p, "too_big", msg);
        p->skip_left = len;
        p->in_state = IN_SKIP;
        continue;
      }
      if (len == 0) {
        send_malformed(p, "badterm", "an empty packet");
        continue;
      }
      /* One byte more, kept NUL: no reader may run off the end of a
       * string it thinks is terminated. */
      p->body = malloc((size_t)len + 1);
      if (p->body == NULL) {
        fprintf(stderr, "condukt-egress port: out of memory for a %u-byte packet\n", len);
        ce__port_stop(p, CE_EXIT_FAIL);
        return;
      }
      p->body[len] = '\0';
      p->body_len = len;
      p->body_have = 0;
      p->in_state = IN_BODY;
    } else if (p->in_state == IN_BODY) {
      size_t take = p->body_len - p->body_have;
      if (take > n)
        take = n;
      memcpy(p->body + p->body_have, data, take);
      p->body_have += take;
      data += take;
      n -= take;
      if (p->body_have < p->body_len)
        continue;
      char *body = p->body;
      p->body = NULL;
      p->in_state = IN_HEADER;
      handle_packet(p, body, p->body_len);
      free(body);
    } else {
      size_t take = p->skip_left < n ? (size_t)p->skip_left : n;
      p->skip_left -= take;
      data += take;
      n -= take;
      if (p->skip_left == 0)
        p->in_state = IN_HEADER;
    }
  }
}

static void on_in_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  ce_port_t *p = s->data;
  if (nread > 0) {
    feed(p, buf->base, (size_t)nread);
    return;
  }
  if (nread == UV_EOF) {
    /* The BEAM closed the port (or died): exit now (muontrap's rule). */
    ce__port_stop(p, CE_EXIT_OK);
    return;
  }
  if (nread < 0) {
    fprintf(stderr, "condukt-egress port: cannot read stdin: %s\n", uv_strerror((int)nread));
    ce__port_stop(p, CE_EXIT_FAIL);
  }
}

/* ---- the command ------------------------------------------------------------ */

static bool is_stream(uv_file fd) {
  uv_handle_type t = uv_guess_handle(fd);
  return t == UV_NAMED_PIPE || t == UV_TCP || t == UV_TTY;
}

static int open_pipe(uv_loop_t *loop, uv_pipe_t *pipe, uv_file fd, ce_port_t *p) {
  int rc = uv_pipe_init(loop, pipe, 0);
  if (rc != 0)
    return rc;
  pipe->data = p;
  rc = uv_pipe_open(pipe, fd);
  if (rc != 0)
    uv_close((uv_handle_t *)pipe, NULL);
  return rc;
}

int ce_cmd_port(int argc, char **argv) {
  if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf("usage: condukt-egress port\n\n"
           "  the BEAM's port program: Erlang terms in {packet, 4} on stdin and\n"
           "  stdout (docs/port-protocol.md); not for interactive use\n");
    return CE_EXIT_OK;
  }
  if (argc > 1) {
    fprintf(stderr, "condukt-egress: port: unexpected argument (port takes none)\n");
    return CE_EXIT_USAGE;
  }
  /* A file or /dev/null cannot be polled; the BEAM always gives pipes. */
  if (!is_stream(0) || !is_stream(1)) {
    fprintf(stderr, "condukt-egress: port: stdin and stdout must be pipes "
                    "(the program is started by the BEAM with Port.open)\n");
    return CE_EXIT_USAGE;
  }
  /* A sidecar or a BEAM that goes away must not kill the program. */
  signal(SIGPIPE, SIG_IGN);
  if (ei_init() != 0) {
    fprintf(stderr, "condukt-egress: port: erl_interface failed to start\n");
    return CE_EXIT_FAIL;
  }

  ce_port_t *p = calloc(1, sizeof(*p));
  uv_loop_t loop;
  int code = CE_EXIT_FAIL;
  if (p == NULL) {
    fprintf(stderr, "condukt-egress: port: out of memory\n");
    return CE_EXIT_FAIL;
  }
  if (uv_loop_init(&loop) != 0) {
    fprintf(stderr, "condukt-egress: port: cannot create the event loop\n");
    goto fail_loop;
  }
  p->loop = &loop;
  p->next_chan = 1;
  p->in_state = IN_HEADER;
  int rc = open_pipe(&loop, &p->in, 0, p);
  if (rc != 0) {
    fprintf(stderr, "condukt-egress: port: stdin: %s\n", uv_strerror(rc));
    goto fail_in;
  }
  rc = open_pipe(&loop, &p->out, 1, p);
  if (rc != 0) {
    fprintf(stderr, "condukt-egress: port: stdout: %s\n", uv_strerror(rc));
    goto fail_out;
  }
  rc = uv_read_start((uv_stream_t *)&p->in, on_in_alloc, on_in_read);
  if (rc != 0) {
    fprintf(stderr, "condukt-egress: port: stdin: %s\n", uv_strerror(rc));
    ce__port_stop(p, CE_EXIT_FAIL);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  code = p->exit_code;
  free(p->body);
  ce__kube_free(p);
  goto done;

fail_out:
  uv_close((uv_handle_t *)&p->in, NULL);
fail_in:
done:
  /* Every handle is closed by now (or was closed above); this turn runs
   * their close callbacks so the loop can be closed. */
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) != 0)
    fprintf(stderr, "condukt-egress: port: handles left open at exit\n");
fail_loop:
  free(p);
  return code;
}
