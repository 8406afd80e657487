/*
 * Frames of the control channel, inside the control subsystem.
 *
 * The parser of peer frames is public (control.h, ce_control_frame_parse)
 * because the fuzz target and the tests call it. This header holds what
 * only control.c needs: encoded lines. An encoded line is shared by every
 * place it is queued (stdout, the peer's socket, the event buffer, a
 * pending ask), so it is reference-counted rather than copied; the last
 * holder frees it.
 */
#ifndef CE_CONTROL_FRAME_H
#define CE_CONTROL_FRAME_H

#include <jansson.h>
#include <stddef.h>

typedef struct {
  size_t refs;
  size_t len;   /* bytes in data, the final '\n' included */
  char data[];
} ce__line_t;

/*
 * Encodes obj as one compact JSON line ending in '\n' (jansson escapes
 * every control character inside strings, so the only raw newline is the
 * last byte) with one reference. Returns CE_OK, CE_EINVAL (obj is not an
 * object or an array), CE_ETOOBIG (the line would exceed CE_CONTROL_MAX_FRAME),
 * CE_ENOMEM. On failure *out is untouched.
 */
int ce__line_encode(const json_t *obj, ce__line_t **out);

/* Takes another reference; returns line for convenience. */
ce__line_t *ce__line_ref(ce__line_t *line);

/* Drops one reference, freeing the line with the last. NULL is ignored. */
void ce__line_unref(ce__line_t *line);

/*
 * Builds a new object whose first members are "type":type and, when
 * seq_key is not NULL, seq_key:seq_value (a JSON integer for "seq", a
 * decimal string for "id"), followed by every member of fields except
 * those two names. fields is borrowed; seq_value is consumed in every
 * case. Returns NULL when memory runs out or fields is not an object.
 */
json_t *ce__frame_envelope(const char *type, const char *seq_key,
                           json_t *seq_value, const json_t *fields);

#endif
