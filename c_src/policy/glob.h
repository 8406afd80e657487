/*
 * The host glob of docs/host-matching.md §3: '*' matches one or more
 * characters other than '.', '**' one or more characters of any kind, and
 * every other byte matches itself.
 */
#ifndef CE_POLICY_GLOB_H
#define CE_POLICY_GLOB_H

#include <stdbool.h>
#include <stddef.h>

/* Matches the whole of name[0..name_len) against pat[0..pat_len), both
 * normalised (lower-case ASCII, see host.h). Runs a dynamic programme over
 * (pattern, name) positions, O(pat_len * name_len) time, no recursion, no
 * allocation. A run of three or more '*' (which ce_pattern_normalize
 * refuses) is read greedily as "**" followed by '*' and so on.
 * Returns true on a match; false otherwise, and always false when either
 * length exceeds CE_HOST_NAME_MAX, which no normalised name does. */
bool ce_glob_match(const char *pat, size_t pat_len, const char *name,
                   size_t name_len);

#endif
