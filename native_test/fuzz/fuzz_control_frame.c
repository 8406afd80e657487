/* libFuzzer target for ce_control_frame_parse(), the first code that reads
 * bytes from an unauthenticated peer (c_src/control/frame.c). Beyond
 * "no crash, no leak, no undefined behaviour", it checks the parser's
 * promises: a refusal leaves *out untouched and names a reason, and an
 * accepted frame (a credential's value included) holds NUL-terminated
 * strings within their limits and parses again to the same frame when
 * re-encoded. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/error.h"
#include "control/control.h"
#include "control/handshake.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_control_frame: broken promise: %s\n", what);
    abort();
  }
}

/* Encodes an accepted frame back into its wire form. */
static json_t *reencode(const ce_frame_t *f) {
  char id[24], hex[2 * CE_CONTROL_PROOF_LEN + 1];
  switch (f->type) {
  case CE_FRAME_HELLO:
    ce_control_hex(f->nonce, sizeof(f->nonce), hex);
    return json_pack("{s:s, s:i, s:s, s:s}", "type", "hello", "version", f->version,
                     "session_id", f->session_id, "nonce", hex);
  case CE_FRAME_AUTH:
    ce_control_hex(f->proof, sizeof(f->proof), hex);
    return json_pack("{s:s, s:s}", "type", "auth", "proof", hex);
  case CE_FRAME_DECISION:
    snprintf(id, sizeof(id), "%llu", (unsigned long long)f->id);
    return json_pack("{s:s, s:s, s:s, s:s, s:b}", "type", "decision", "id", id, "decision",
                     f->allow ? "allow" : "deny", "reason", f->reason, "cache",
                     f->cacheable);
  case CE_FRAME_CREDENTIAL:
    return json_pack("{s:s, s:s, s:s%}", "type", "credential", "name", f->secret_name, "value", f->secret_value,
                     f->secret_value_len);
  case CE_FRAME_PING:
  default:
    return json_pack("{s:s}", "type", "ping");
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ce_frame_t f;
  memset(&f, 0xa5, sizeof(f));
  const char *why = NULL;
  int rc = ce_control_frame_parse((const char *)data, size, &f, &why);
  if (rc != CE_OK) {
    check(rc == CE_EPARSE || rc == CE_ETOOBIG, "unexpected error code");
    check(why != NULL, "a refusal without a reason");
    for (size_t i = 0; i < sizeof(f); i++)
      check(((unsigned char *)&f)[i] == 0xa5, "*out touched on failure");
    return 0;
  }
  check(why == NULL, "a reason on success");
  check(f.type == CE_FRAME_HELLO || f.type == CE_FRAME_AUTH || f.type == CE_FRAME_DECISION ||
            f.type == CE_FRAME_PING || f.type == CE_FRAME_CREDENTIAL,
        "unknown frame type");
  if (f.type == CE_FRAME_CREDENTIAL) {
    check(memchr(f.secret_name, '\0', sizeof(f.secret_name)) != NULL && strlen(f.secret_name) > 0,
          "secret name not terminated or empty");
    check(f.secret_value_len > 0 && f.secret_value_len <= CE_CONTROL_SECRET_VALUE_MAX &&
              f.secret_value[f.secret_value_len] == '\0',
          "secret value length");
  }
  if (f.type == CE_FRAME_HELLO) {
    check(memchr(f.session_id, '\0', sizeof(f.session_id)) != NULL, "session_id not terminated");
    check(strlen(f.session_id) > 0, "empty session_id");
    check(f.version == CE_CONTROL_PROTOCOL_VERSION, "version");
  }
  if (f.type == CE_FRAME_DECISION)
    check(memchr(f.reason, '\0', sizeof(f.reason)) != NULL, "reason not terminated");

  json_t *again = reencode(&f);
  check(again != NULL, "re-encoding failed");
  char *text = json_dumps(again, JSON_COMPACT);
  json_decref(again);
  check(text != NULL, "dump failed");
  ce_frame_t g;
  memset(&g, 0, sizeof(g));
  check(ce_control_frame_parse(text, strlen(text), &g, NULL) == CE_OK, "re-encoded frame refused");
  free(text);
  check(g.type == f.type, "round trip: type");
  if (f.type == CE_FRAME_HELLO)
    check(strcmp(g.session_id, f.session_id) == 0 && memcmp(g.nonce, f.nonce, sizeof(f.nonce)) == 0,
          "round trip: hello");
  if (f.type == CE_FRAME_AUTH)
    check(memcmp(g.proof, f.proof, sizeof(f.proof)) == 0, "round trip: auth");
  if (f.type == CE_FRAME_DECISION)
    check(g.id == f.id && g.allow == f.allow && g.cacheable == f.cacheable &&
              strcmp(g.reason, f.reason) == 0,
          "round trip: decision");
  if (f.type == CE_FRAME_CREDENTIAL)
    check(strcmp(g.secret_name, f.secret_name) == 0 && g.secret_value_len == f.secret_value_len &&
              memcmp(g.secret_value, f.secret_value, f.secret_value_len) == 0,
          "round trip: credential");
  return 0;
}
