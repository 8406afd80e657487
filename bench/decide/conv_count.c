/* Instruction counts (callgrind) of the port's conversions, old path and
 * new, on the frames of one decide. Usage: conv MODE K */
#include <ei.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/jsonw.h"
#include "control/control.h"
#include "port/etf.h"
#include "port/json_line.h"
#include "port/json_term.h"

static const char LINE[] =
    "{\"type\":\"decision_request\",\"id\":\"5\",\"request\":{\"event\":\"decision_request\",\"at\":\"2026-11-22T05:09:39.123501Z\",\"id\":\"11\",\"connection_id\":\"4\",\"scheme\":\"https\",\"method\":\"POST\",\"host\":\"evil.com\",\"port\":443,\"path\":\"/upload\",\"query\":\"x=1\",\"http_version\":\"HTTP/1.1\",\"sni\":\"evil.com\",\"headers\":[[\"Host\",\"evil.com\"],[\"Authorization\",\"[redacted]\"]],\"status\":null,\"response_headers\":null,\"bytes_in\":0,\"bytes_out\":0,\"opened_at\":\"2026-11-22T05:09:39.123456Z\",\"responded_at\":null,\"closed_at\":null,\"matched_rule\":null,\"reason\":null},\"rule\":{\"index\":2,\"kind\":\"decide\"}}";

static void in_old(void) {
  json_error_t jerr;
  json_t *v = json_loadb(LINE, sizeof(LINE) - 1, JSON_REJECT_DUPLICATES, &jerr);
  ei_x_buff x;
  ei_x_new_with_version(&x);
  if (ce_json_to_term(v, &x, NULL, 0) != CE_OK) abort();
  json_decref(v);
  ei_x_free(&x);
}

static void in_new(void) {
  ei_x_buff x;
  ei_x_new_with_version(&x);
  if (ce_json_line_to_term(LINE, sizeof(LINE) - 1, &x, NULL, 0) != CE_OK) abort();
  ei_x_free(&x);
}

static ei_x_buff decision;

static void out_old(void) {
  int i = 1;
  json_t *v = NULL;
  if (ce_term_to_json(decision.buff, &i, "frame", &v, NULL, 0) != CE_OK) abort();
  char *text = json_dumps(v, JSON_COMPACT);
  json_decref(v);
  size_t n = strlen(text);
  ce_frame_t f;
  const char *why;
  if (ce_control_frame_parse(text, n, &f, &why) != CE_OK) abort();
  text[n] = '\n';
  char *w = malloc(64 + n + 1);
  memcpy(w + 64, text, n + 1);
  free(text);
  free(w);
}

static void out_new(void) {
  int i = 1;
  json_t *v = NULL;
  if (ce_term_to_json(decision.buff, &i, "frame", &v, NULL, 0) != CE_OK) abort();
  ce_frame_t f;
  const char *why;
  if (ce_control_frame_check(v, &f, &why) != CE_OK) abort();
  ce_jsonw_t w;
  ce_jsonw_init(&w, NULL, 0, CE_CONTROL_MAX_FRAME);
  ce_jsonw_value(&w, v);
  ce_jsonw_raw(&w, "\n", 1);
  json_decref(v);
  char *req = malloc(64);
  free(req);
  ce_jsonw_free(&w);
}

int main(int argc, char **argv) {
  ei_init();
  ei_x_new_with_version(&decision);
  ei_x_encode_map_header(&decision, 4);
  ei_x_encode_atom(&decision, "type"); ei_x_encode_binary(&decision, "decision", 8);
  ei_x_encode_atom(&decision, "id"); ei_x_encode_binary(&decision, "5", 1);
  ei_x_encode_atom(&decision, "decision"); ei_x_encode_binary(&decision, "allow", 5);
  ei_x_encode_atom(&decision, "cache"); ei_x_encode_atom(&decision, "false");
  int k = atoi(argv[2]);
  void (*f)(void) = strcmp(argv[1], "in_old") == 0 ? in_old : strcmp(argv[1], "in_new") == 0 ? in_new
                    : strcmp(argv[1], "out_old") == 0 ? out_old : out_new;
  for (int j = 0; j < k; j++) f();
  ei_x_free(&decision);
  return 0;
}
