/*
 * Punycode (RFC 3492) encoding of one label, the last step of turning a
 * Unicode label into its "xn--" ASCII form (docs/host-matching.md §1
 * step 7). Only the encoder is needed: the engine never decodes.
 */
#ifndef CE_POLICY_PUNYCODE_H
#define CE_POLICY_PUNYCODE_H

#include <stddef.h>
#include <stdint.h>

/* Encodes the code points in[0..n) with the RFC 3492 §6.3 algorithm and the
 * Punycode parameters of §5. Basic code points (below 0x80) are copied as
 * they are, so the caller lower-cases first; digits are written in lower
 * case. No NUL is written.
 * Returns 0 and sets *out_len, or:
 *   CE_ETOOBIG  the output would not fit in cap bytes;
 *   CE_EINVAL   a code point is above 0x10FFFF, or the §6.4 overflow
 *               checks fired (only possible for absurd inputs).
 * On failure the bytes of out are unspecified and *out_len is untouched. */
int ce_punycode_encode(const uint32_t *in, size_t n, char *out, size_t cap,
                       size_t *out_len);

#endif
