/*
 * The control channel's handshake (docs/control-channel.md, "Handshake"),
 * shared by both ends: the sidecar (control.c) and the BEAM's port program
 * (port/channel.c).
 *
 * Neither end ever sends the session token. Each sends a fresh random
 * nonce, and each proves that it holds the token with
 *
 *   HMAC-SHA256(token, "condukt-control/2" 0x00 ROLE 0x00
 *                      len(session_id) as 2 bytes, big-endian
 *                      session_id
 *                      peer_nonce (32 bytes) sidecar_nonce (32 bytes))
 *
 * where ROLE is "peer" or "sidecar". The role keeps one side's proof from
 * being reflected as the other's; both nonces make every proof good for
 * one connection only; the session id ties it to one session. The peer
 * proves first, and the sidecar proves only to a peer that has: a process
 * that connects to the sidecar learns nothing but a random nonce.
 *
 * The peer's hello may also carry a ticket: the same HMAC with ROLE
 * "ticket" and 32 zero bytes for the sidecar's nonce, which the peer does
 * not have yet. It proves nothing the auth frame does not prove later,
 * and a recorded one could be replayed; the sidecar uses it only to rank
 * connections in the handshake, so that a flood of connections cannot
 * push the peer's out (docs/control-channel.md, "Pre-authentication
 * slots"), and ranks each nonce's ticket once.
 */
#ifndef CE_CONTROL_HANDSHAKE_H
#define CE_CONTROL_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control/control.h"

typedef enum {
  CE_CONTROL_ROLE_PEER = 1,
  CE_CONTROL_ROLE_SIDECAR,
  CE_CONTROL_ROLE_TICKET
} ce_control_role_t;

/*
 * Computes the proof of `role` into out. session_id is NUL-terminated, 1 to
 * CE_CONTROL_SESSION_ID_MAX bytes. Returns CE_OK, CE_EINVAL (no token, an
 * empty or too long session id), CE_ENOMEM (OpenSSL failed). On failure
 * out is zeroed.
 */
int ce_control_proof(const uint8_t *token, size_t token_len, ce_control_role_t role,
                     const char *session_id, const uint8_t peer_nonce[CE_CONTROL_NONCE_LEN],
                     const uint8_t sidecar_nonce[CE_CONTROL_NONCE_LEN],
                     uint8_t out[CE_CONTROL_PROOF_LEN]);

/* Whether `given` is the proof of `role` (computed, then compared in
 * constant time). False on any failure. */
bool ce_control_proof_ok(const uint8_t *token, size_t token_len, ce_control_role_t role,
                         const char *session_id, const uint8_t peer_nonce[CE_CONTROL_NONCE_LEN],
                         const uint8_t sidecar_nonce[CE_CONTROL_NONCE_LEN],
                         const uint8_t given[CE_CONTROL_PROOF_LEN]);

/* The hello's ticket for peer_nonce, and its check (constant time).
 * Returns and fails as ce_control_proof / ce_control_proof_ok. */
int ce_control_ticket(const uint8_t *token, size_t token_len, const char *session_id,
                      const uint8_t peer_nonce[CE_CONTROL_NONCE_LEN],
                      uint8_t out[CE_CONTROL_PROOF_LEN]);
bool ce_control_ticket_ok(const uint8_t *token, size_t token_len, const char *session_id,
                          const uint8_t peer_nonce[CE_CONTROL_NONCE_LEN],
                          const uint8_t given[CE_CONTROL_PROOF_LEN]);

/* Fills out with random bytes from OpenSSL. Returns CE_OK or CE_EIO. */
int ce_control_nonce(uint8_t out[CE_CONTROL_NONCE_LEN]);

/* Lowercase hex of n bytes into out (2n + 1 bytes, NUL-terminated). */
void ce_control_hex(const uint8_t *in, size_t n, char *out);

/* Exactly 2n lowercase hex digits in s (len bytes) into out; false
 * otherwise (out is then unspecified). */
bool ce_control_unhex(const char *s, size_t len, uint8_t *out, size_t n);

/* What the sidecar sends during the handshake, as the peer parses it. */
typedef enum { CE_SFRAME_CHALLENGE = 1, CE_SFRAME_WELCOME } ce_sframe_type_t;

typedef struct {
  ce_sframe_type_t type;
  uint8_t nonce[CE_CONTROL_NONCE_LEN];     /* challenge */
  uint8_t proof[CE_CONTROL_PROOF_LEN];     /* welcome */
  char session_id[CE_CONTROL_SESSION_ID_MAX + 1]; /* welcome: NUL-terminated, non-empty */
  uint64_t dropped;                        /* welcome */
} ce_sframe_t;

/*
 * Parses a challenge or a welcome line (without its '\n'), strictly as
 * for the peer's frames (control.h): one JSON object, no duplicate member,
 * nesting at most 16, version CE_CONTROL_PROTOCOL_VERSION, nonce and proof
 * exactly 64 lowercase hex digits, session_id 1 to 256 bytes, dropped an
 * integer >= 0; unknown members ignored. Pure and safe on any bytes (the
 * fuzz target). Returns CE_OK, CE_EPARSE (*why names the problem),
 * CE_EVERSION (another protocol version), CE_ETOOBIG, CE_ENOMEM. On
 * failure *out is untouched.
 */
int ce_control_sframe_parse(const char *line, size_t len, ce_sframe_t *out, const char **why);

#endif
