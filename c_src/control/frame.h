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
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control/control.h"

/*
 * The first steps of every parser of control frames, either direction:
 * refuses a line longer than CE_CONTROL_MAX_FRAME (CE_ETOOBIG), nested
 * deeper than 16, not valid UTF-8 JSON, with a duplicate member or not an
 * object (CE_EPARSE, *why says which), and reports CE_ENOMEM when jansson
 * ran out of memory, even where it would hide it. On CE_OK *root is the
 * object (the caller decrefs it); on failure *root is untouched.
 */
int ce__frame_load(const char *line, size_t len, json_t **root, const char **why);

/* Member `key` of obj as exactly n bytes written as 2n lowercase hex
 * digits, into out; false for anything else. */
bool ce__frame_hex(json_t *obj, const char *key, uint8_t *out, size_t n);

typedef struct {
  size_t refs;
  size_t len;   /* bytes in data, the final '\n' included */
  char data[];
} ce__line_t;

/*
 * Encodes obj as one compact JSON line ending in '\n' (common/jsonw.h
 * escapes every control character inside strings, so the only raw newline
 * is the last byte) with one reference, in one pass. Returns CE_OK,
 * CE_EINVAL (obj is not an object or an array, or nests deeper than
 * CE_JSONW_MAX_DEPTH), CE_ETOOBIG (the line would exceed
 * CE_CONTROL_MAX_FRAME), CE_ENOMEM. On failure *out is untouched.
 */
int ce__line_encode(const json_t *obj, ce__line_t **out);

/*
 * Encodes a frame without building it as an object: the text
 * {"type":TYPE,KEY:NUM, ...every member of fields but "type" and KEY} and
 * '\n', NUM written as a JSON integer or, with num_as_string, as a decimal
 * string ("seq":7 for events, "id":"7" for decision requests). fields is
 * borrowed. Returns as ce__line_encode (CE_EINVAL when fields is not an
 * object).
 */
int ce__line_encode_frame(const char *type, const char *key, uint64_t num, bool num_as_string,
                          const json_t *fields, ce__line_t **out);

/*
 * The same envelope, {"type":TYPE,KEY:NUM, then whatever write(w, arg)
 * appends (members, each written as ,"name":value), then "}" and '\n'.
 * write may fail the text with ce_jsonw_fail(). Returns CE_OK, the
 * writer's error (CE_EINVAL for text that is not valid UTF-8 or a failure
 * write chose), CE_ETOOBIG (longer than CE_CONTROL_MAX_FRAME), CE_ENOMEM.
 * On failure *out is untouched.
 */
int ce__line_encode_frame_with(const char *type, const char *key, uint64_t num,
                               bool num_as_string, ce_control_write_fn write, const void *arg,
                               ce__line_t **out);

/* A ce_control_write_fn for a jansson object: arg is a ce__json_fields_t;
 * writes every member of obj but "type" and key, and fails the text with
 * CE_EINVAL when obj is not an object. */
typedef struct {
  const json_t *obj;
  const char *key;
} ce__json_fields_t;
void ce__line_write_json_fields(ce_jsonw_t *w, const void *arg);

/* Takes another reference; returns line for convenience. */
ce__line_t *ce__line_ref(ce__line_t *line);

/* Drops one reference, freeing the line with the last. NULL is ignored. */
void ce__line_unref(ce__line_t *line);

#endif
