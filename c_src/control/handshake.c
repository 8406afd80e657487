/*
 * The control channel's handshake (handshake.h): the proofs, the nonces,
 * and the parser of what the sidecar sends before the channel is open.
 */
#include "control/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <string.h>

#include "common/error.h"
#include "control/frame.h"

/* The context string: names the protocol and its version, so that a proof
 * made for this handshake means nothing anywhere else. */
static const char CONTEXT[] = "condukt-control/2";

static const char *role_name(ce_control_role_t role) {
  return role == CE_CONTROL_ROLE_PEER ? "peer" : role == CE_CONTROL_ROLE_SIDECAR ? "sidecar"
                                                                                  : "ticket";
}

int ce_control_proof(const uint8_t *token, size_t token_len, ce_control_role_t role,
                     const char *session_id, const uint8_t peer_nonce[CE_CONTROL_NONCE_LEN],
                     const uint8_t sidecar_nonce[CE_CONTROL_NONCE_LEN],
                     uint8_t out[CE_CONTROL_PROOF_LEN]) {
  memset(out, 0, CE_CONTROL_PROOF_LEN);
  size_t sid_len = session_id != NULL ? strlen(session_id) : 0;
  if (token == NULL || token_len == 0 || sid_len == 0 || sid_len > CE_CONTROL_SESSION_ID_MAX ||
      (role != CE_CONTROL_ROLE_PEER && role != CE_CONTROL_ROLE_SIDECAR &&
       role != CE_CONTROL_ROLE_TICKET))
    return CE_EINVAL;

  /* Every part has a fixed length or a length prefix, so no two different
   * inputs make the same message. */
  uint8_t msg[sizeof(CONTEXT) + 8 + 2 + CE_CONTROL_SESSION_ID_MAX + 2 * CE_CONTROL_NONCE_LEN];
  size_t n = 0;
  memcpy(msg, CONTEXT, sizeof(CONTEXT)); /* with its NUL */
  n += sizeof(CONTEXT);
  const char *r = role_name(role);
  memcpy(msg + n, r, strlen(r) + 1);
  n += strlen(r) + 1;
  msg[n++] = (uint8_t)(sid_len >> 8);
  msg[n++] = (uint8_t)(sid_len & 0xff);
  memcpy(msg + n, session_id, sid_len);
  n += sid_len;
  memcpy(msg + n, peer_nonce, CE_CONTROL_NONCE_LEN);
  n += CE_CONTROL_NONCE_LEN;
  memcpy(msg + n, sidecar_nonce, CE_CONTROL_NONCE_LEN);
  n += CE_CONTROL_NONCE_LEN;

  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), token, (int)token_len, msg, n, out, &mac_len) == NULL ||
      mac_len != CE_CONTROL_PROOF_LEN) {
    memset(out, 0, CE_CONTROL_PROOF_LEN);
    return CE_ENOMEM;
  }
  return CE_OK;
}

bool ce_control_proof_ok(const uint8_t *token, size_t token_len, ce_control_role_t role,
                         const char *session_id, const uint8_t peer_nonce[CE_CONTROL_NONCE_LEN],
                         const uint8_t sidecar_nonce[CE_CONTROL_NONCE_LEN],
                         const uint8_t given[CE_CONTROL_PROOF_LEN]) {
  uint8_t want[CE_CONTROL_PROOF_LEN];
  if (ce_control_proof(token, token_len, role, session_id, peer_nonce, sidecar_nonce, want) !=
      CE_OK)
    return false;
  bool ok = CRYPTO_memcmp(want, given, CE_CONTROL_PROOF_LEN) == 0;
  OPENSSL_cleanse(want, sizeof(want));
  return ok;
}

static const uint8_t NO_NONCE[CE_CONTROL_NONCE_LEN];

int ce_control_ticket(const uint8_t *token, size_t token_len, const char *session_id,
                      const uint8_t peer_nonce[CE_CONTROL_NONCE_LEN],
                      uint8_t out[CE_CONTROL_PROOF_LEN]) {
  return ce_control_proof(token, token_len, CE_CONTROL_ROLE_TICKET, session_id, peer_nonce,
                          NO_NONCE, out);
}

bool ce_control_ticket_ok(const uint8_t *token, size_t token_len, const char *session_id,
                          const uint8_t peer_nonce[CE_CONTROL_NONCE_LEN],
                          const uint8_t given[CE_CONTROL_PROOF_LEN]) {
  return ce_control_proof_ok(token, token_len, CE_CONTROL_ROLE_TICKET, session_id, peer_nonce,
                             NO_NONCE, given);
}

int ce_control_nonce(uint8_t out[CE_CONTROL_NONCE_LEN]) {
  return RAND_bytes(out, (int)CE_CONTROL_NONCE_LEN) == 1 ? CE_OK : CE_EIO;
}

void ce_control_hex(const uint8_t *in, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[in[i] >> 4];
    out[2 * i + 1] = digits[in[i] & 0x0f];
  }
  out[2 * n] = '\0';
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1; /* uppercase too: one spelling per value */
}

bool ce_control_unhex(const char *s, size_t len, uint8_t *out, size_t n) {
  if (s == NULL || len != 2 * n)
    return false;
  for (size_t i = 0; i < n; i++) {
    int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return false;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return true;
}

/* ---- the sidecar's handshake frames, as the peer reads them ---------------- */

static int refuse(const char **why, const char *msg) {
  if (why != NULL)
    *why = msg;
  return CE_EPARSE;
}

static int parse_welcome(json_t *root, ce_sframe_t *f, const char **why) {
  json_t *sid = json_object_get(root, "session_id");
  if (!json_is_string(sid))
    return refuse(why, "welcome: \"session_id\" must be a string");
  size_t n = json_string_length(sid);
  if (n == 0 || n > CE_CONTROL_SESSION_ID_MAX)
    return refuse(why, "welcome: \"session_id\" must be 1 to 256 bytes");
  if (!ce__frame_hex(root, "proof", f->proof, CE_CONTROL_PROOF_LEN))
    return refuse(why, "welcome: \"proof\" must be 64 lowercase hex digits");
  json_t *dropped = json_object_get(root, "dropped");
  if (!json_is_integer(dropped) || json_integer_value(dropped) < 0)
    return refuse(why, "welcome: \"dropped\" must be an integer >= 0");
  memcpy(f->session_id, json_string_value(sid), n);
  f->session_id[n] = '\0';
  f->dropped = (uint64_t)json_integer_value(dropped);
  f->type = CE_SFRAME_WELCOME;
  return CE_OK;
}

int ce_control_sframe_parse(const char *line, size_t len, ce_sframe_t *out, const char **why) {
  json_t *root = NULL;
  int rc = ce__frame_load(line, len, &root, why);
  if (rc != CE_OK)
    return rc;

  ce_sframe_t f;
  memset(&f, 0, sizeof(f));
  const char *t = json_string_value(json_object_get(root, "type"));
  json_t *version = json_object_get(root, "version");
  bool is_challenge = t != NULL && strcmp(t, "challenge") == 0;
  if (t == NULL) {
    rc = refuse(why, "missing or mistyped \"type\"");
  } else if (!is_challenge && strcmp(t, "welcome") != 0) {
    rc = refuse(why, "neither a challenge nor a welcome");
  } else if (!json_is_integer(version)) {
    rc = refuse(why, "missing or mistyped \"version\"");
  } else if (json_integer_value(version) != CE_CONTROL_PROTOCOL_VERSION) {
    if (why != NULL)
      *why = "unsupported version";
    rc = CE_EVERSION;
  } else if (is_challenge) {
    rc = ce__frame_hex(root, "nonce", f.nonce, CE_CONTROL_NONCE_LEN)
             ? CE_OK
             : refuse(why, "challenge: \"nonce\" must be 64 lowercase hex digits");
    f.type = CE_SFRAME_CHALLENGE;
  } else {
    rc = parse_welcome(root, &f, why);
  }
  json_decref(root);
  if (rc == CE_OK)
    *out = f;
  return rc;
}
