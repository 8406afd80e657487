/*
 * The operations of {call, Id, Op} (docs/port-protocol.md): argument
 * decoding and the synchronous operations (version, token_new, ca_new,
 * policy_write); the control-channel operations are handed to channel.c
 * once their arguments are decoded.
 */
#ifndef CE_PORT_OPS_H
#define CE_PORT_OPS_H

#include "port/port.h"
#include "port/request.h"

/* Token sizes in bytes, as the control channel accepts them. */
#define CE_PORT_TOKEN_MIN 16u
#define CE_PORT_TOKEN_MAX 128u
/* Longest path accepted by ca_new and policy_write (PATH_MAX, with room
 * for policy_write's ".tmp"). */
#define CE_PORT_PATH_MAX 4000u

/* Runs the call in req (parsed from the checked packet buf) and sends its
 * reply, now or (control_attach) later. Never fails: every problem is a
 * reply. */
void ce__port_call(ce_port_t *p, const char *buf, const ce_port_request_t *req);

/* Runs {post, Chan, Tag, Frame} (req parsed from the checked packet buf):
 * control_send's work, answered only when it fails, with
 * {control, Chan, {send_failed, Tag, {Code, Message}}}. */
void ce__port_post(ce_port_t *p, const char *buf, const ce_port_request_t *req);

#endif
