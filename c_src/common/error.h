/*
 * One error vocabulary for condukt-egress.
 *
 * Every function that can fail returns 0 on success or one of the negative
 * CE_E* codes below; ce_strerror() turns a code into a sentence. The table
 * is an X-macro so the enum and the messages cannot drift apart (the same
 * idea as libuv's UV_ERRNO_MAP).
 */
#ifndef CE_COMMON_ERROR_H
#define CE_COMMON_ERROR_H

#define CE_ERRNO_MAP(XX)                                                    \
  XX(NOMEM, "out of memory")                                                \
  XX(INVAL, "invalid argument")                                             \
  XX(IO, "input/output error")                                              \
  XX(TOOBIG, "input larger than the limit")                                 \
  XX(PARSE, "malformed input")                                              \
  XX(VERSION, "unsupported version")                                        \
  XX(NOENT, "no such file")                                                 \
  XX(USAGE, "bad command line")                                             \
  XX(AGAIN, "more input is needed")                                         \
  XX(PROTO, "protocol violation")                                           \
  XX(NOTSUP, "not supported")                                               \
  XX(TIMEDOUT, "timed out")                                                 \
  XX(CLOSED, "connection closed")                                           \
  XX(PERM, "permission denied")                                             \
  XX(UNAVAIL, "not available")                                              \
  XX(TLS, "TLS failure")                                                    \
  XX(DENIED, "refused by policy")

typedef enum {
  CE_OK = 0,
#define XX(name, msg) CE_E##name,
  CE__ERR_FIRST_PLACEHOLDER = -1000,
  CE_ERRNO_MAP(XX)
#undef XX
} ce_err_t;

/* Returns a static, never-NULL message for a code from the table (or a
 * generic message for anything else, including 0). */
const char *ce_strerror(int err);

/* Returns the symbolic name ("CE_ENOMEM") of a code, or "CE_EUNKNOWN". */
const char *ce_err_name(int err);

#endif
