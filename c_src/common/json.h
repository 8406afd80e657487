/*
 * jansson's allocation failures, made visible.
 *
 * jansson 2.14 does not always report running out of memory: most failures
 * return NULL without setting an error, some inside its lexer turn into a
 * syntax error ("invalid token"), and a failed append to its token buffer
 * is ignored, so the parse succeeds with a byte missing from a string (a
 * token, an id, a reason). native_test/control/test_frame_failalloc.c found
 * the last one. A parser that must not act on a silently altered frame
 * therefore asks this module whether jansson's allocator failed during the
 * call.
 *
 * A constructor installs the allocator (json_set_alloc_funcs) before
 * main() runs, that is before any thread or any jansson value exists, as
 * jansson requires. The flag is per thread.
 */
#ifndef CE_COMMON_JSON_H
#define CE_COMMON_JSON_H

#include <stdbool.h>

/* Clears this thread's "jansson ran out of memory" flag. */
void ce_json_oom_reset(void);

/* True when a jansson allocation failed in this thread since the last
 * ce_json_oom_reset(). */
bool ce_json_oom(void);

#endif
