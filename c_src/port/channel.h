/*
 * Control channels of the port: the BEAM's side of the sidecar's control
 * channel (docs/control-channel.md), relayed as terms
 * (docs/port-protocol.md, "Control channels").
 *
 * A channel connects (Unix socket or loopback TCP), runs the handshake
 * (control/handshake.h: hello with a nonce, the sidecar's challenge, auth
 * with the port's proof, and a welcome whose proof and session id must
 * check out) under one timeout, then turns every line the sidecar sends
 * into {control, Chan, {frame, Map}}. At most `window`
 * frames are outstanding (not acknowledged with {ack, Chan, N}); at zero
 * credit the channel stops reading its socket, so the sidecar's own
 * buffering and loss counting take over instead of the port's memory.
 *
 * Ownership: channels are owned by the port's list. A channel leaves the
 * list when it is forgotten (detached, failed before welcome, closed
 * after its {closed, Reason} was sent, or the port stops); its memory is
 * freed by the close callback of its last libuv handle.
 */
#ifndef CE_PORT_CHANNEL_H
#define CE_PORT_CHANNEL_H

#include <jansson.h>
#include <stdint.h>

#include "common/text.h"
#include "control/control.h"
#include "port/port.h"

#define CE_PORT_ATTACH_TIMEOUT_DEFAULT 5000u  /* ms to connect and get welcome */
#define CE_PORT_ATTACH_TIMEOUT_MAX 3600000u   /* one hour */
#define CE_PORT_WINDOW_DEFAULT 256u           /* frames not yet acknowledged */
#define CE_PORT_WINDOW_MAX 65536u
/* Bytes queued towards one sidecar past which control_send is refused
 * (the sidecar is not reading; decisions are a few hundred bytes). */
#define CE_PORT_CHAN_WRITE_MAX (4u * 1024u * 1024u)

typedef struct {
  char listen[128];   /* the address in control/listen.h's grammar */
  char shown[4 * CE_TEXT_QUOTE_MAX + 32]; /* the address as messages name it */
  char token[257];    /* lowercase hex, checked by the caller */
  char session_id[CE_CONTROL_SESSION_ID_MAX + 1]; /* the session the sidecar must gate */
  uint32_t timeout_ms;
  uint32_t window;
} ce__attach_t;

/* control_attach: replies to id later, with {ok, {Chan, Welcome}} or an
 * error. */
void ce__chan_attach(ce_port_t *p, uint64_t id, const ce__attach_t *a);

/* Who hears how a frame's sending went: a call's reply ({reply, Id, ok}
 * or an error), or, for a post, nothing when the frame is queued and
 * {control, Chan, {send_failed, Tag, {Code, Message}}} when it is not
 * (tag: the Tag's bytes, a term in the external format). */
typedef struct {
  bool post;
  uint64_t id;
  const char *tag;
  size_t tag_len;
} ce__send_to_t;

/* control_send, post: takes frame (a JSON value); answers to at once. */
void ce__chan_send(ce_port_t *p, const ce__send_to_t *to, uint64_t chan, json_t *frame);

/* Answers to with an error (code: a CE_E* value or CE__PORT_BADARG). */
void ce__chan_send_error(ce_port_t *p, const ce__send_to_t *to, uint64_t chan, int code,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* control_detach: replies ok to id (also for a channel already gone). */
void ce__chan_detach(ce_port_t *p, uint64_t id, uint64_t chan);

/* {ack, Chan, N}: N more frames may be delivered. Unknown channels are
 * ignored: the ack may have crossed the channel's {closed, _}. */
void ce__chan_ack(ce_port_t *p, uint64_t chan, uint64_t n);

/* Forgets every channel without a message (the port is stopping). */
void ce__chan_close_all(ce_port_t *p);

#endif
