/*
 * A line of the control channel (one JSON object) to the Erlang term the
 * BEAM gets, in one pass: the text is read once and the term is written
 * as it is read, with no JSON value built in between.
 *
 * The term is the one docs/port-protocol.md ("JSON <-> term mapping")
 * describes, byte for byte what json_term.h's ce_json_to_term() writes
 * for the same text: objects become maps with binary keys in the order of
 * the text, arrays lists, strings binaries, integers integers, reals
 * floats, true/false/null the atoms true, false and nil.
 *
 * The text must be JSON as RFC 8259 defines it, and it is held to the
 * rules the control channel's own parser (control/frame.c) applies:
 *   - one object, with only whitespace (RFC 8259 §2) around it;
 *   - strings of valid UTF-8 (§8.1) without control characters (§7) and
 *     without \u0000 (the channel refuses NUL bytes); a \u escape of a
 *     surrogate only as a high-low pair (§7);
 *   - no member name twice in one object (§4 leaves it open: here it is
 *     refused, so that no reader can pick another member than the checker);
 *   - integers (no fraction, no exponent) within -2^63..2^63-1, reals
 *     within the range of a double (a smaller one becomes 0 or a
 *     subnormal, as strtod gives it);
 *   - nested at most CE_JSON_TERM_MAX_DEPTH deep (the root at depth 0).
 */
#ifndef CE_PORT_JSON_LINE_H
#define CE_PORT_JSON_LINE_H

#include <ei.h>
#include <stddef.h>

/*
 * Appends the term for the JSON object in s[0..n) to x. s need not be
 * NUL-terminated and is never read past n.
 *
 * Returns CE_OK; CE_EPARSE when the text is not JSON or breaks a rule
 * above (err says which, with the byte offset); CE_EINVAL when it is
 * JSON nested deeper than CE_JSON_TERM_MAX_DEPTH; CE_ETOOBIG when n is
 * over CE_CONTROL_MAX_FRAME (no line of the channel is); CE_ENOMEM
 * (err says so). On failure x
 * holds a partial term: the caller discards it.
 */
int ce_json_line_to_term(const char *s, size_t n, ei_x_buff *x, char *err, size_t errlen);

#endif
