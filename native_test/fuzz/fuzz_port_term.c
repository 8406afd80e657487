/* libFuzzer target for the port's reading of BEAM packets
 * (c_src/port/etf.c, request.c, json_term.c): the bytes of one {packet, 4}
 * body go through the same steps as in the port. Beyond "no crash, no
 * leak, no undefined behaviour", it checks the promises: a term the walk
 * accepts is never read past its end by erl_interface (ASan sees that),
 * a refusal names a reason, a term converted to JSON converts back to a
 * term that converts to the same JSON, and what control_send would write
 * for it (ce_jsonw_value) is jansson's dump of it, judged by
 * ce_control_frame_check() as the sidecar's parser judges that text. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ei.h>
#include <jansson.h>

#include "common/error.h"
#include "common/jsonw.h"
#include "control/control.h"
#include "port/etf.h"
#include "port/json_term.h"
#include "port/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_port_term: broken promise: %s\n", what);
    abort();
  }
}

/* What control_send writes for a converted frame: the text jansson's dump
 * would give, judged by ce_control_frame_check() as the sidecar's parser
 * judges that text. */
static void as_sent(const json_t *v) {
  char *dumped = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  check(dumped != NULL, "json_dumps");
  ce_jsonw_t w;
  ce_jsonw_init(&w, NULL, 0, CE_CONTROL_MAX_FRAME);
  ce_jsonw_value(&w, v);
  check(ce_jsonw_error(&w) == CE_OK, "the writer refuses a converted frame");
  check(w.len == strlen(dumped) && memcmp(w.buf, dumped, w.len) == 0,
        "the writer's text is not jansson's");
  ce_frame_t a, b;
  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));
  const char *why_a = NULL, *why_b = NULL;
  int ra = ce_control_frame_parse(w.buf, w.len, &a, &why_a);
  int rb = ce_control_frame_check(v, &b, &why_b);
  check(ra == rb, "the check and the sidecar's parser disagree");
  check(ra != CE_OK || memcmp(&a, &b, sizeof(a)) == 0, "the check gives another frame");
  check(ra == CE_OK || (why_a != NULL && why_b != NULL && strcmp(why_a, why_b) == 0),
        "the check gives another reason");
  ce_jsonw_free(&w);
  free(dumped);
}

/* JSON -> term -> JSON must be the identity. */
static void round_trip(const json_t *v) {
  ei_x_buff x;
  check(ei_x_new_with_version(&x) == 0, "ei_x_new");
  check(ce_json_to_term(v, &x, NULL, 0) == CE_OK, "JSON from a term does not convert back");
  check(ce_etf_check(x.buff, (size_t)x.index, NULL, 0) == CE_OK, "the port's own term refused");
  int i = 1;
  json_t *w = NULL;
  char err[256];
  check(ce_term_to_json(x.buff, &i, "frame", &w, err, sizeof(err)) == CE_OK,
        "a term the port wrote does not convert");
  check(json_equal(v, w), "round trip changed the value");
  json_decref(w);
  ei_x_free(&x);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) {
    ei_init();
    ready = 1;
  }
  /* The port keeps packets NUL-terminated in a buffer of exactly their
   * size plus one; the same here, so ASan catches a read past the end. */
  char *buf = malloc(size + 1);
  if (buf == NULL)
    return 0;
  memcpy(buf, data, size);
  buf[size] = '\0';

  char err[512];
  ce_port_request_t req;
  int rc = ce_port_request_parse(buf, size, &req, err, sizeof(err));
  check(rc == CE_OK || rc == CE_EPARSE || rc == CE_EINVAL, "request: unexpected code");
  if (rc != CE_OK)
    check(err[0] != '\0', "request: a refusal without a reason");

  if (ce_etf_check(buf, size, err, sizeof(err)) == CE_OK) {
    /* The whole term as a frame, as control_send converts it. */
    int i = 1;
    json_t *v = NULL;
    rc = ce_term_to_json(buf, &i, "frame", &v, err, sizeof(err));
    check(rc == CE_OK || rc == CE_EINVAL || rc == CE_ENOMEM, "convert: unexpected code");
    if (rc == CE_OK) {
      check((size_t)i == size, "convert: index not at the end");
      round_trip(v);
      as_sent(v);
      json_decref(v);
    } else {
      check(i == 1, "convert: index moved on failure");
      check(err[0] != '\0', "convert: a refusal without a reason");
    }
    /* Every reader on the top-level term must stay inside the buffer. */
    int j = 1, arity = 0;
    uint64_t u = 0;
    const char *b = NULL;
    size_t n = 0;
    char atom[CE_ETF_ATOM_MAX];
    (void)ce_etf_u64(buf, &j, &u);
    (void)ce_etf_binary(buf, &j, &b, &n);
    (void)ce_etf_atom(buf, &j, atom);
    (void)ce_etf_map(buf, &j, &arity);
    j = 1;
    ce_etf_skip(buf, &j);
    check((size_t)j == size, "skip: not at the end");
  }
  free(buf);
  return 0;
}
