/* libFuzzer target for the port's reading of control-channel lines
 * (c_src/port/json_line.c): a line from the sidecar becomes the term for
 * the BEAM in one pass. Beyond "no crash, no leak, no undefined
 * behaviour, no read past the line" (the line sits in a buffer of exactly
 * its size), it checks the promise that matters: the one-pass reader
 * accepts exactly the lines that jansson's strict parse (duplicates
 * refused) followed by ce_json_to_term() accepts, and writes the same
 * bytes for them; a refusal names a reason, and the term it writes is one
 * the port's own checker accepts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ei.h>
#include <jansson.h>

#include "common/error.h"
#include "port/etf.h"
#include "port/json_line.h"
#include "port/json_term.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_port_line: broken promise: %s\n", what);
    abort();
  }
}

/* The path the one-pass reader replaced: CE_OK with the term in x, or
 * not. */
static int reference(const char *buf, size_t size, ei_x_buff *x) {
  json_error_t jerr;
  json_t *v = json_loadb(buf, size, JSON_REJECT_DUPLICATES, &jerr);
  if (v == NULL)
    return CE_EPARSE;
  int rc = CE_EPARSE;
  if (json_is_object(v))
    rc = ce_json_to_term(v, x, NULL, 0);
  json_decref(v);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) {
    ei_init();
    ready = 1;
  }
  char *buf = malloc(size > 0 ? size : 1);
  if (buf == NULL)
    return 0;
  memcpy(buf, data, size);

  ei_x_buff got, want;
  check(ei_x_new_with_version(&got) == 0, "ei_x_new");
  check(ei_x_new_with_version(&want) == 0, "ei_x_new");
  char err[512];
  int rc = ce_json_line_to_term(buf, size, &got, err, sizeof(err));
  check(rc == CE_OK || rc == CE_EPARSE || rc == CE_EINVAL, "unexpected code");
  /* A NUL byte is never JSON (not whitespace, not allowed raw in a
   * string), but jansson 2.14 skips one that follows a number ("[1\0]"):
   * there the reference is not compared, and the line must be refused. */
  if (memchr(buf, '\0', size) != NULL) {
    check(rc != CE_OK, "a line with a NUL byte accepted");
  } else {
    int ref = reference(buf, size, &want);
    check((rc == CE_OK) == (ref == CE_OK), "accepts other lines than jansson and the mapping");
    if (rc == CE_OK)
      check(got.index == want.index && memcmp(got.buff, want.buff, (size_t)got.index) == 0,
            "another term than jansson and the mapping");
  }
  if (rc == CE_OK) {
    check(ce_etf_check(got.buff, (size_t)got.index, NULL, 0) == CE_OK,
          "a term the port's checker refuses");
  } else {
    check(err[0] != '\0', "a refusal without a reason");
  }
  ei_x_free(&got);
  ei_x_free(&want);
  free(buf);
  return 0;
}
