/*
 * The envelope of a BEAM -> port packet (docs/port-protocol.md):
 *
 *   {call, Id, Op}     Op = {Name, Arg...}
 *   {ack, Chan, N}
 *   {post, Chan, Tag, Frame}
 *
 * Parsing it is pure (no allocation survives, no state), so the fuzz
 * target can run it on any bytes.
 */
#ifndef CE_PORT_REQUEST_H
#define CE_PORT_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "port/etf.h"

typedef enum {
  CE_PORT_REQ_CALL = 1,
  CE_PORT_REQ_ACK,
  CE_PORT_REQ_POST,
} ce_port_req_kind_t;

typedef struct {
  ce_port_req_kind_t kind;
  bool has_id;                 /* a call whose Id could be read */
  uint64_t id;                 /* call: the transaction id */
  char op[CE_ETF_ATOM_MAX];    /* call: the operation's name */
  int argc;                    /* call: the arguments after the name */
  int args;                    /* call: index of the first argument; post: of Tag */
  int frame;                   /* post: index of Frame (not checked here) */
  uint64_t chan;               /* ack, post */
  uint64_t n;                  /* ack: the credit given, > 0 */
} ce_port_request_t;

/*
 * Parses the packet buf[0..len). Returns:
 *   CE_OK      *req is filled;
 *   CE_EPARSE  the bytes are not one well-formed term (answered with
 *              {error, badterm, Msg});
 *   CE_EINVAL  a term, but not a request of the grammar: when
 *              req->has_id is set it is answered with
 *              {reply, Id, {error, {badarg, Msg}}}, else with
 *              {error, badarg, Msg}.
 * err receives the message in every failure. req is written in every case
 * (has_id is meaningful on CE_EINVAL).
 */
int ce_port_request_parse(const char *buf, size_t len, ce_port_request_t *req,
                          char *err, size_t errlen);

#endif
