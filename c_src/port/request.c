/* The request envelope (request.h). */
#include "port/request.h"

#include <stdio.h>
#include <string.h>

#include "common/error.h"

#define EXPECTED "expected {call, Id, Op}, {ack, Chan, N} or {post, Chan, Tag, Frame}"

static int bad(char *err, size_t errlen, const char *msg) {
  if (err != NULL && errlen > 0)
    snprintf(err, errlen, "%s", msg);
  return CE_EINVAL;
}

int ce_port_request_parse(const char *buf, size_t len, ce_port_request_t *req,
                          char *err, size_t errlen) {
  memset(req, 0, sizeof(*req));
  int rc = ce_etf_check(buf, len, err, errlen);
  if (rc != CE_OK)
    return rc;
  int i = 1, arity = 0;
  char tag[CE_ETF_ATOM_MAX];
  if (!ce_etf_tuple(buf, &i, &arity) || (arity != 3 && arity != 4) ||
      !ce_etf_atom(buf, &i, tag))
    return bad(err, errlen, EXPECTED);

  if (strcmp(tag, "post") == 0 && arity == 4) {
    req->kind = CE_PORT_REQ_POST;
    if (!ce_etf_u64(buf, &i, &req->chan) || req->chan == 0)
      return bad(err, errlen, "post: Chan must be a positive integer");
    req->args = i; /* Tag: any term, echoed back on failure */
    ce_etf_skip(buf, &i);
    req->frame = i;
    return CE_OK;
  }
  if (arity != 3)
    return bad(err, errlen, EXPECTED);

  if (strcmp(tag, "ack") == 0) {
    req->kind = CE_PORT_REQ_ACK;
    if (!ce_etf_u64(buf, &i, &req->chan) || req->chan == 0)
      return bad(err, errlen, "ack: Chan must be a positive integer");
    if (!ce_etf_u64(buf, &i, &req->n) || req->n == 0)
      return bad(err, errlen, "ack: N must be a positive integer below 2^64");
    return CE_OK;
  }
  if (strcmp(tag, "call") != 0)
    return bad(err, errlen, EXPECTED);

  req->kind = CE_PORT_REQ_CALL;
  if (!ce_etf_u64(buf, &i, &req->id))
    return bad(err, errlen, "call: Id must be an integer from 0 to 2^64-1");
  req->has_id = true;
  int op_arity = 0;
  if (!ce_etf_tuple(buf, &i, &op_arity) || op_arity < 1)
    return bad(err, errlen, "call: Op must be a tuple {Name, Arg...}");
  if (!ce_etf_atom(buf, &i, req->op))
    return bad(err, errlen, "call: an operation's name must be an atom");
  req->argc = op_arity - 1;
  req->args = i;
  return CE_OK;
}
