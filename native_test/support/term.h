/*
 * Test support: Erlang terms written as text, so that a port test reads
 * like the protocol it checks.
 *
 * ce_test_term() encodes a small subset of Erlang syntax: atoms (bare or
 * 'quoted'), integers (-2^63 .. 2^64-1), floats (with a '.'), binaries
 * <<"text">> (escapes \" \\ \n \xNN) or <<1,2,3>>, "strings" (lists of
 * bytes), tuples {..}, proper lists [..] and maps #{K => V, ..}.
 *
 * ce_test_term_str() prints a term back in the same syntax (binaries of
 * printable text as <<"..">>, others as <<1,2>>, maps in wire order, any
 * other type as #Other), so replies can be compared as strings.
 *
 * Both fail the calling test on a mistake in the text.
 */
#ifndef CE_TEST_SUPPORT_TERM_H
#define CE_TEST_SUPPORT_TERM_H

#include <ei.h>
#include <stddef.h>

/* Encodes text as a term with the version byte into x (a new buffer the
 * caller frees with ei_x_free). */
void ce_test_term(ei_x_buff *x, const char *text);

/* Prints the term in buf[0..len) (with its version byte) into a new string
 * the caller frees. */
char *ce_test_term_str(const char *buf, size_t len);

#endif
