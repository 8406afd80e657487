/* Tests for c_src/control/handshake.c: the proofs against vectors computed
 * by another implementation (Python's hmac, native_test/vectors/), the
 * hex helpers, and the parser of the sidecar's handshake frames. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "common/error.h"
#include "control/handshake.h"

#define VECTOR_FILE CE_SOURCE_ROOT "/native_test/vectors/control_handshake.json"

static void unhex_member(json_t *v, const char *key, uint8_t *out, size_t n) {
  const char *s = json_string_value(json_object_get(v, key));
  cr_assert_not_null(s, "%s", key);
  cr_assert(ce_control_unhex(s, strlen(s), out, n), "%s: %s", key, s);
}

Test(handshake, proofs_match_the_shared_vectors) {
  json_error_t jerr;
  json_t *root = json_load_file(VECTOR_FILE, JSON_REJECT_DUPLICATES, &jerr);
  cr_assert_not_null(root, "%s: %s", VECTOR_FILE, jerr.text);
  json_t *vectors = json_object_get(root, "vectors");
  cr_assert_geq(json_array_size(vectors), 4);
  size_t i;
  json_t *v;
  json_array_foreach(vectors, i, v) {
    const char *tok_hex = json_string_value(json_object_get(v, "token"));
    size_t tok_len = strlen(tok_hex) / 2;
    uint8_t token[CE_CONTROL_TOKEN_MAX], np[32], ns[32], pp[32], sp[32], out[32];
    unhex_member(v, "token", token, tok_len);
    unhex_member(v, "peer_nonce", np, 32);
    unhex_member(v, "sidecar_nonce", ns, 32);
    unhex_member(v, "peer_proof", pp, 32);
    unhex_member(v, "sidecar_proof", sp, 32);
    const char *sid = json_string_value(json_object_get(v, "session_id"));

    cr_assert_eq(ce_control_proof(token, tok_len, CE_CONTROL_ROLE_PEER, sid, np, ns, out), CE_OK);
    cr_assert_arr_eq(out, pp, 32, "vector %zu: peer proof", i);
    cr_assert_eq(ce_control_proof(token, tok_len, CE_CONTROL_ROLE_SIDECAR, sid, np, ns, out),
                 CE_OK);
    cr_assert_arr_eq(out, sp, 32, "vector %zu: sidecar proof", i);

    cr_assert(ce_control_proof_ok(token, tok_len, CE_CONTROL_ROLE_PEER, sid, np, ns, pp));
    cr_assert(ce_control_proof_ok(token, tok_len, CE_CONTROL_ROLE_SIDECAR, sid, np, ns, sp));
    /* One role's proof is not the other's, nonces do not commute, and any
     * other token or session id fails. */
    cr_assert_not(ce_control_proof_ok(token, tok_len, CE_CONTROL_ROLE_SIDECAR, sid, np, ns, pp));
    cr_assert_not(ce_control_proof_ok(token, tok_len, CE_CONTROL_ROLE_PEER, sid, ns, np, pp));
    cr_assert_not(ce_control_proof_ok(token, tok_len - 1, CE_CONTROL_ROLE_PEER, sid, np, ns, pp));
    cr_assert_not(ce_control_proof_ok(token, tok_len, CE_CONTROL_ROLE_PEER, "other", np, ns, pp));
    pp[31] ^= 1;
    cr_assert_not(ce_control_proof_ok(token, tok_len, CE_CONTROL_ROLE_PEER, sid, np, ns, pp));

    /* The hello's ticket: over the peer's nonce alone. */
    uint8_t tk[32];
    unhex_member(v, "ticket", tk, 32);
    cr_assert_eq(ce_control_ticket(token, tok_len, sid, np, out), CE_OK);
    cr_assert_arr_eq(out, tk, 32, "vector %zu: ticket", i);
    cr_assert(ce_control_ticket_ok(token, tok_len, sid, np, tk));
    cr_assert_not(ce_control_ticket_ok(token, tok_len, sid, ns, tk));
    cr_assert_not(ce_control_ticket_ok(token, tok_len, "other", np, tk));
    cr_assert_not(ce_control_proof_ok(token, tok_len, CE_CONTROL_ROLE_PEER, sid, np, ns, tk));
  }
  json_decref(root);
}

Test(handshake, proof_refuses_bad_arguments) {
  uint8_t token[16] = {1}, n[32] = {0}, out[32];
  char long_sid[CE_CONTROL_SESSION_ID_MAX + 2];
  memset(long_sid, 'x', sizeof(long_sid) - 1);
  long_sid[sizeof(long_sid) - 1] = '\0';
  cr_assert_eq(ce_control_proof(token, 16, CE_CONTROL_ROLE_PEER, "", n, n, out), CE_EINVAL);
  cr_assert_eq(ce_control_proof(token, 16, CE_CONTROL_ROLE_PEER, NULL, n, n, out), CE_EINVAL);
  cr_assert_eq(ce_control_proof(token, 16, CE_CONTROL_ROLE_PEER, long_sid, n, n, out), CE_EINVAL);
  cr_assert_eq(ce_control_proof(NULL, 16, CE_CONTROL_ROLE_PEER, "s", n, n, out), CE_EINVAL);
  cr_assert_eq(ce_control_proof(token, 0, CE_CONTROL_ROLE_PEER, "s", n, n, out), CE_EINVAL);
  cr_assert_eq(ce_control_proof(token, 16, (ce_control_role_t)7, "s", n, n, out), CE_EINVAL);
  uint8_t zero[32] = {0};
  cr_assert_arr_eq(out, zero, 32, "a failed proof is zeroed");
  cr_assert_not(ce_control_proof_ok(token, 16, CE_CONTROL_ROLE_PEER, "", n, n, zero));
}

Test(handshake, nonces_are_fresh) {
  uint8_t a[32], b[32];
  cr_assert_eq(ce_control_nonce(a), CE_OK);
  cr_assert_eq(ce_control_nonce(b), CE_OK);
  cr_assert_neq(memcmp(a, b, 32), 0);
}

Test(handshake, hex) {
  uint8_t in[3] = {0x00, 0xab, 0xff}, out[3];
  char text[7];
  ce_control_hex(in, 3, text);
  cr_assert_str_eq(text, "00abff");
  cr_assert(ce_control_unhex("00abff", 6, out, 3));
  cr_assert_arr_eq(out, in, 3);
  cr_assert_not(ce_control_unhex("00ABff", 6, out, 3), "uppercase");
  cr_assert_not(ce_control_unhex("00abf", 5, out, 3), "short");
  cr_assert_not(ce_control_unhex("00abff00", 8, out, 3), "long");
  cr_assert_not(ce_control_unhex("00abfg", 6, out, 3), "not hex");
  cr_assert_not(ce_control_unhex(NULL, 0, out, 0));
}

#define H64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static int parse(const char *s, ce_sframe_t *f, const char **why) {
  return ce_control_sframe_parse(s, strlen(s), f, why);
}

Test(handshake, sframe_accepts) {
  ce_sframe_t f;
  const char *why = "x";
  cr_assert_eq(parse("{\"type\":\"challenge\",\"version\":2,\"nonce\":\"" H64 "\",\"new\":[1]}", &f,
                     &why),
               CE_OK);
  cr_assert_null(why);
  cr_assert_eq(f.type, CE_SFRAME_CHALLENGE);
  cr_assert_eq(f.nonce[0], 0x01);
  cr_assert_eq(f.nonce[31], 0xef);

  cr_assert_eq(parse("{\"type\":\"welcome\",\"version\":2,\"session_id\":\"ws-1\",\"proof\":\"" H64
                     "\",\"dropped\":7}",
                     &f, &why),
               CE_OK);
  cr_assert_eq(f.type, CE_SFRAME_WELCOME);
  cr_assert_str_eq(f.session_id, "ws-1");
  cr_assert_eq(f.dropped, 7);
  cr_assert_eq(f.proof[1], 0x23);
}

Test(handshake, sframe_refuses) {
  static const struct {
    const char *line;
    int rc;
  } cases[] = {
      {"", CE_EPARSE},
      {"[]", CE_EPARSE},
      {"{\"type\":\"challenge\",\"type\":\"welcome\",\"version\":2}", CE_EPARSE},
      {"{\"version\":2,\"nonce\":\"" H64 "\"}", CE_EPARSE},
      {"{\"type\":1,\"version\":2,\"nonce\":\"" H64 "\"}", CE_EPARSE},
      {"{\"type\":\"hello\",\"version\":2,\"nonce\":\"" H64 "\"}", CE_EPARSE},
      {"{\"type\":\"challenge\",\"nonce\":\"" H64 "\"}", CE_EPARSE},
      {"{\"type\":\"challenge\",\"version\":\"2\",\"nonce\":\"" H64 "\"}", CE_EPARSE},
      {"{\"type\":\"challenge\",\"version\":1,\"nonce\":\"" H64 "\"}", CE_EVERSION},
      {"{\"type\":\"welcome\",\"version\":1,\"session_id\":\"s\",\"dropped\":0}", CE_EVERSION},
      {"{\"type\":\"challenge\",\"version\":2}", CE_EPARSE},
      {"{\"type\":\"challenge\",\"version\":2,\"nonce\":\"0123\"}", CE_EPARSE},
      {"{\"type\":\"challenge\",\"version\":2,\"nonce\":\"" H64 "00\"}", CE_EPARSE},
      {"{\"type\":\"welcome\",\"version\":2,\"session_id\":\"\",\"proof\":\"" H64
       "\",\"dropped\":0}",
       CE_EPARSE},
      {"{\"type\":\"welcome\",\"version\":2,\"proof\":\"" H64 "\",\"dropped\":0}", CE_EPARSE},
      {"{\"type\":\"welcome\",\"version\":2,\"session_id\":\"s\",\"dropped\":0}", CE_EPARSE},
      {"{\"type\":\"welcome\",\"version\":2,\"session_id\":\"s\",\"proof\":\"" H64 "\"}",
       CE_EPARSE},
      {"{\"type\":\"welcome\",\"version\":2,\"session_id\":\"s\",\"proof\":\"" H64
       "\",\"dropped\":-1}",
       CE_EPARSE},
      {"{\"type\":\"welcome\",\"version\":2,\"session_id\":7,\"proof\":\"" H64
       "\",\"dropped\":0}",
       CE_EPARSE},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ce_sframe_t f;
    memset(&f, 0x5a, sizeof(f));
    const char *why = NULL;
    cr_assert_eq(parse(cases[i].line, &f, &why), cases[i].rc, "case %zu: %s", i, cases[i].line);
    cr_assert_not_null(why, "case %zu has no reason", i);
    cr_assert_eq(((unsigned char *)&f)[0], 0x5a, "case %zu touched *out", i);
  }
  char *big = malloc(CE_CONTROL_MAX_FRAME + 2);
  cr_assert_not_null(big);
  memset(big, ' ', CE_CONTROL_MAX_FRAME + 1);
  ce_sframe_t f;
  cr_assert_eq(ce_control_sframe_parse(big, CE_CONTROL_MAX_FRAME + 1, &f, NULL), CE_ETOOBIG);
  free(big);
}
