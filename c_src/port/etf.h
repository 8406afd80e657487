/*
 * Reading Erlang external-term-format (ETF) packets safely.
 *
 * erl_interface's ei_decode_* functions take a buffer but no length: they
 * trust the bytes to hold a whole, well-formed term. The port reads its
 * packets from the BEAM, which does write well-formed terms, but a bug, a
 * stray writer on the pipe or the fuzzer must not turn into a read past the
 * end of a buffer. So every packet is first walked by ce_etf_check(), which
 * knows the size of every tag of the format and proves that the term and
 * all its parts lie inside the packet; only then do the ei_decode_*
 * functions and the small readers below look at it.
 *
 * Indexes are ints, as in ei: a packet is at most CE_PORT_MAX_PACKET
 * (16 MiB), far below INT_MAX.
 */
#ifndef CE_PORT_ETF_H
#define CE_PORT_ETF_H

#include <ei.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Nesting of the whole packet (tuples, lists, maps). Requests nest a few
 * levels, frames at most 16 (the control channel's limit) inside them;
 * the bound keeps the recursive walk far from the stack's end. */
#define CE_ETF_MAX_DEPTH 64

/* The longest atom the readers below return: 255 characters of up to 4
 * UTF-8 bytes (MAXATOMLEN_UTF8 in ei.h), plus the NUL. */
#define CE_ETF_ATOM_MAX MAXATOMLEN_UTF8

/*
 * Checks that buf[0..len) is exactly one term in the external format:
 * the version byte 131, then a term whose every part lies inside the
 * buffer, nested at most CE_ETF_MAX_DEPTH deep, with nothing after it.
 * Compressed terms and distribution headers are refused (the BEAM's
 * {packet, 4} ports never send them). Returns CE_OK or CE_EPARSE with err
 * naming the problem and its byte offset. Pure; never reads outside buf.
 */
int ce_etf_check(const char *buf, size_t len, char *err, size_t errlen);

/* The readers below take a buffer already accepted by ce_etf_check() and
 * an index pointing at a term; on success they advance *index past it,
 * on failure (the term has another type or is out of range) they leave
 * *index untouched and return false. */

/* An atom, as NUL-terminated UTF-8 in name[CE_ETF_ATOM_MAX]. */
bool ce_etf_atom(const char *buf, int *index, char *name);

/* True when the term at index is the atom `name` (index is not moved). */
bool ce_etf_is_atom(const char *buf, int index, const char *name);

/* A binary (not a bitstring with a partial last byte): a pointer into buf
 * and its length. */
bool ce_etf_binary(const char *buf, int *index, const char **data, size_t *len);

/* An option map's key: an atom (Elixir's keyword style) or a binary
 * without NUL, copied NUL-terminated into name[cap]; false when it is
 * neither or does not fit. */
bool ce_etf_key(const char *buf, int *index, char *name, size_t cap);

/* A binary of 1 to max bytes without NUL, copied into a new
 * NUL-terminated string (paths and names are C strings from here on; the
 * caller frees it). NULL when the term is not such a binary, with *why
 * (when not NULL) saying which rule it broke. */
char *ce_etf_string(const char *buf, int *index, size_t max, const char **why);

/* The atom true or false. */
bool ce_etf_bool(const char *buf, int *index, bool *out);

/* An integer from 0 to UINT64_MAX. */
bool ce_etf_u64(const char *buf, int *index, uint64_t *out);

/* A tuple header; *arity receives the element count. */
bool ce_etf_tuple(const char *buf, int *index, int *arity);

/* A map header; *arity receives the number of key/value pairs. */
bool ce_etf_map(const char *buf, int *index, int *arity);

/* Skips any term. */
void ce_etf_skip(const char *buf, int *index);

/* Appends the lower-case error name of a CE_E* code ("inval", "nomem",
 * ...) as an atom: the Code of a reply's {error, {Code, Message}}. */
int ce_etf_encode_err_code(ei_x_buff *x, int err);

/* Appends a binary holding the NUL-terminated text s. */
int ce_etf_encode_text(ei_x_buff *x, const char *s);

#endif
