/* libFuzzer target for ce_control_sframe_parse(), the BEAM's port program
 * reading the handshake frames (challenge, welcome) of whatever listens on
 * the sidecar's control address, which may be any process in the pod
 * (c_src/control/handshake.c). Beyond "no crash, no leak, no undefined
 * behaviour", it checks the parser's promises: a refusal leaves *out
 * untouched and names a reason, and an accepted frame holds a non-empty
 * NUL-terminated session id and parses again to the same frame when
 * re-encoded. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/error.h"
#include "control/handshake.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_control_handshake: broken promise: %s\n", what);
    abort();
  }
}

static json_t *reencode(const ce_sframe_t *f) {
  char hex[2 * CE_CONTROL_PROOF_LEN + 1];
  if (f->type == CE_SFRAME_CHALLENGE) {
    ce_control_hex(f->nonce, sizeof(f->nonce), hex);
    return json_pack("{s:s, s:i, s:s}", "type", "challenge", "version",
                     CE_CONTROL_PROTOCOL_VERSION, "nonce", hex);
  }
  ce_control_hex(f->proof, sizeof(f->proof), hex);
  return json_pack("{s:s, s:i, s:s, s:s, s:I}", "type", "welcome", "version",
                   CE_CONTROL_PROTOCOL_VERSION, "session_id", f->session_id, "proof", hex,
                   "dropped", (json_int_t)f->dropped);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ce_sframe_t f;
  memset(&f, 0xa5, sizeof(f));
  const char *why = NULL;
  int rc = ce_control_sframe_parse((const char *)data, size, &f, &why);
  if (rc != CE_OK) {
    check(rc == CE_EPARSE || rc == CE_ETOOBIG || rc == CE_EVERSION, "unexpected error code");
    check(why != NULL, "a refusal without a reason");
    for (size_t i = 0; i < sizeof(f); i++)
      check(((unsigned char *)&f)[i] == 0xa5, "*out touched on failure");
    return 0;
  }
  check(why == NULL, "a reason on success");
  check(f.type == CE_SFRAME_CHALLENGE || f.type == CE_SFRAME_WELCOME, "unknown frame type");
  if (f.type == CE_SFRAME_WELCOME) {
    check(memchr(f.session_id, '\0', sizeof(f.session_id)) != NULL, "session_id not terminated");
    check(strlen(f.session_id) > 0, "empty session_id");
  }

  json_t *again = reencode(&f);
  check(again != NULL, "re-encoding failed");
  char *text = json_dumps(again, JSON_COMPACT);
  json_decref(again);
  check(text != NULL, "dump failed");
  ce_sframe_t g;
  memset(&g, 0, sizeof(g));
  check(ce_control_sframe_parse(text, strlen(text), &g, NULL) == CE_OK, "re-encoded frame refused");
  free(text);
  check(g.type == f.type, "round trip: type");
  if (f.type == CE_SFRAME_CHALLENGE)
    check(memcmp(g.nonce, f.nonce, sizeof(f.nonce)) == 0, "round trip: nonce");
  else
    check(memcmp(g.proof, f.proof, sizeof(f.proof)) == 0 &&
              strcmp(g.session_id, f.session_id) == 0 && g.dropped == f.dropped,
          "round trip: welcome");
  return 0;
}
