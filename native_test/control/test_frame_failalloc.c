/* Allocation-failure tests for c_src/control/frame.c: the peer-frame
 * parser, the line encoder and the envelope builder, and for the parser of
 * the sidecar's handshake frames (handshake.c), with each allocation
 * failing in turn. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "control/control.h"
#include "control/frame.h"
#include "control/handshake.h"
#include "support/failalloc.h"

/* Either parser, through one shape: parses text into out and returns the
 * code, with the frame's type in *type on success. */
typedef union {
  ce_frame_t peer;
  ce_sframe_t sidecar;
} any_frame_t;
typedef int (*parse_fn)(const char *text, any_frame_t *out, const char **why, int *type);

static int parse_peer(const char *text, any_frame_t *out, const char **why, int *type) {
  int rc = ce_control_frame_parse(text, strlen(text), &out->peer, why);
  *type = (int)out->peer.type;
  return rc;
}

static int parse_sidecar(const char *text, any_frame_t *out, const char **why, int *type) {
  int rc = ce_control_sframe_parse(text, strlen(text), &out->sidecar, why);
  *type = (int)out->sidecar.type;
  return rc;
}

static void failalloc_loop(parse_fn parse, size_t size, const char *text, int type) {
  size_t n;
  for (n = 0;; n++) {
    any_frame_t f;
    memset(&f, 0x5a, sizeof(f));
    const char *why = NULL;
    int got = 0;
    ce_failalloc_arm(n);
    int rc = parse(text, &f, &why, &got);
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, CE_OK, "%s", why);
      cr_assert_eq(got, type);
      break;
    }
    if (rc == CE_OK) {
      cr_assert_eq(got, type, "allocation %zu absorbed, wrong frame", n);
      continue;
    }
    /* Every failure is CE_ENOMEM, including those jansson hides
     * (common/json.h): before that fix, allocation 11 here gave a hello
     * whose token (then sent in the hello) had lost a byte. */
    cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s (%s)", n, ce_err_name(rc), why);
    cr_assert_str_eq(why, "out of memory");
    for (size_t i = 0; i < size; i++)
      cr_assert_eq(((unsigned char *)&f)[i], 0x5a, "allocation %zu: *out was touched", n);
  }
  cr_assert_gt(n, 2);
}

static void parse_loop(const char *text, ce_frame_type_t type) {
  failalloc_loop(parse_peer, sizeof(ce_frame_t), text, (int)type);
}

Test(frame_failalloc, parse_hello) {
  parse_loop("{\"type\":\"hello\",\"version\":2,\"session_id\":\"ws-7f3a\",\"nonce\":"
             "\"00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab\"}",
             CE_FRAME_HELLO);
}

Test(frame_failalloc, parse_decision) {
  parse_loop("{\"type\":\"decision\",\"id\":\"18446744073709551615\",\"decision\":\"deny\","
             "\"reason\":\"not on the list of hosts this workspace may reach\",\"cache\":false,"
             "\"future\":{\"a\":[1,2,3],\"b\":\"c\"}}",
             CE_FRAME_DECISION);
}

Test(frame_failalloc, line_encode) {
  json_t *obj = json_pack("{s:s s:I s:[s s] s:{s:b}}", "type", "decision_request", "seq",
                          (json_int_t)42, "list", "a", "b", "nested", "x", 1);
  cr_assert_not_null(obj);
  for (size_t n = 0;; n++) {
    ce__line_t *line = (ce__line_t *)0x1;
    ce_failalloc_arm(n);
    int rc = ce__line_encode(obj, &line);
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, CE_OK);
      cr_assert_eq(line->data[line->len - 1], '\n');
      ce__line_unref(line);
      break;
    }
    if (rc == CE_OK) {
      ce__line_unref(line);
      continue;
    }
    cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
    cr_assert_eq(line, (ce__line_t *)0x1, "*out written on failure");
  }
  json_decref(obj);
}

Test(frame_failalloc, encode_frame) {
  json_t *fields = json_pack("{s:s s:i s:s s:[i]}", "type", "ignored", "seq", 9, "host",
                             "api.example.com", "list", 1);
  cr_assert_not_null(fields);
  /* A frame beyond the inline buffer, so the writer's heap growth fails too. */
  char *pad = malloc(64 * 1024 + 1);
  cr_assert_not_null(pad);
  memset(pad, 'p', 64 * 1024);
  pad[64 * 1024] = '\0';
  json_object_set_new(fields, "pad", json_string(pad));
  free(pad);
  for (size_t n = 0;; n++) {
    ce__line_t *line = (ce__line_t *)0x1;
    ce_failalloc_arm(n);
    int rc = ce__line_encode_frame("event", "seq", 7, false, fields, &line);
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, CE_OK);
      json_t *back = json_loadb(line->data, line->len - 1, 0, NULL);
      cr_assert_not_null(back);
      cr_assert_eq(json_object_size(back), 5);
      json_decref(back);
      ce__line_unref(line);
      break;
    }
    cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
    cr_assert_eq(line, (ce__line_t *)0x1, "*out written on failure");
  }
  json_decref(fields);
}

/* The sidecar's handshake frames, as the port parses them
 * (c_src/control/handshake.c). */
static void sframe_loop(const char *text, ce_sframe_type_t type) {
  failalloc_loop(parse_sidecar, sizeof(ce_sframe_t), text, (int)type);
}

Test(frame_failalloc, parse_handshake_frames) {
  sframe_loop("{\"type\":\"challenge\",\"version\":2,\"nonce\":"
              "\"00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab\"}",
              CE_SFRAME_CHALLENGE);
  sframe_loop("{\"type\":\"welcome\",\"version\":2,\"session_id\":\"ws-7f3a\",\"dropped\":3,\"proof\":"
              "\"00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab00ff10ab\"}",
              CE_SFRAME_WELCOME);
}
