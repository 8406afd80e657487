/*
 * JSON values (jansson) to Erlang terms and back, per the mapping table of
 * docs/port-protocol.md ("JSON <-> term mapping"):
 *
 *   JSON           term the port sends      term the port accepts
 *   object         map, binary keys         map, binary or atom keys
 *   array          list                     proper list
 *   string         binary                   UTF-8 binary without NUL bytes,
 *                                           or an atom other than the three below
 *   integer        integer                  integer, -2^63 .. 2^63-1
 *   real           float                    finite float
 *   true / false   true / false             true / false
 *   null           nil                      nil or null
 *
 * Frames of the control channel cross the port in both directions this
 * way. Anything else in a term (a tuple, a pid, an improper list, a
 * bitstring, a map key that is neither binary nor atom) is refused with a
 * message naming where it sits, as in "frame.request.headers[2]: a tuple
 * is not JSON", so the Elixir caller can find its mistake.
 */
#ifndef CE_PORT_JSON_TERM_H
#define CE_PORT_JSON_TERM_H

#include <ei.h>
#include <jansson.h>
#include <stddef.h>

/* Nesting accepted in either direction. The control channel refuses
 * frames deeper than 16 (docs/control-channel.md); twice that leaves room
 * for frames the sidecar builds while bounding the recursion. */
#define CE_JSON_TERM_MAX_DEPTH 32

/* The longest path named in a message; a longer one ends in "...". */
#define CE_JSON_TERM_PATH_MAX 200

/*
 * Converts the term at buf[*index] (a packet accepted by ce_etf_check())
 * into a new JSON value. root names the term in messages ("frame").
 * Returns CE_OK with *out set and *index past the term, CE_EINVAL (the
 * term has no JSON form; err names the path and the problem) or
 * CE_ENOMEM. On failure *out and *index are untouched.
 */
int ce_term_to_json(const char *buf, int *index, const char *root, json_t **out,
                    char *err, size_t errlen);

/*
 * Appends the term for v to x. Returns CE_OK, CE_EINVAL (nested deeper
 * than CE_JSON_TERM_MAX_DEPTH; err says so) or CE_ENOMEM. On failure x
 * holds a partial term: the caller discards it.
 */
int ce_json_to_term(const json_t *v, ei_x_buff *x, char *err, size_t errlen);

#endif
