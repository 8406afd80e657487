/* Allocation-failure tests for c_src/proxy/event.c: filling a request
 * record and writing its event line, with each allocation failing in turn.
 * The record is cleared after every attempt, so LSan at exit proves that a
 * half-filled record frees what it holds. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "control/frame.h"
#include "proxy/event.h"
#include "support/failalloc.h"

static void field(ce_h1_head_t *h, const char *name, const char *value) {
  ce_h1_field_t *f = &h->fields[h->field_count++];
  f->name = name;
  f->name_len = strlen(name);
  f->value = value;
  f->value_len = strlen(value);
}

static void heads(ce_h1_head_t *req, ce_h1_head_t *resp) {
  static const char target[] = "/v1/items?limit=5";
  memset(req, 0, sizeof(*req));
  req->method = "POST";
  req->method_len = 4;
  req->target = target;
  req->target_len = strlen(target);
  req->target_form = CE_H1_TARGET_ORIGIN;
  req->path = target;
  req->path_len = req->target_len;
  req->version_minor = 1;
  field(req, "Host", "api.example.com");
  field(req, "Authorization", "Bearer sk-secret");
  field(req, "X-Latin1", "caf\xe9"); /* not UTF-8: the U+FFFD fallback */
  memset(resp, 0, sizeof(*resp));
  resp->status = 200;
  field(resp, "Content-Type", "application/json");
  field(resp, "Set-Cookie", "a=b");
}

static void fill(ce_reqinfo_t *r) {
  strcpy(r->host, "api.example.com");
  strcpy(r->sni, "api.example.com");
  r->port = 443;
  r->scheme = "https";
  r->matched_rule = 0;
  r->matched_kind = "allow";
  r->closed_at_us = r->opened_at_us + 5;
}

Test(event_failalloc, set_request_and_response) {
  ce_h1_head_t req, resp;
  heads(&req, &resp);
  for (size_t n = 0;; n++) {
    ce_reqinfo_t r;
    ce_reqinfo_init(&r, 1, 2);
    ce_failalloc_arm(n);
    int rc = ce_reqinfo_set_request(&r, &req, NULL);
    if (rc == CE_OK)
      rc = ce_reqinfo_set_response(&r, &resp, NULL);
    ce_failalloc_disarm();
    bool hit = ce_failalloc_failures() > 0;
    if (rc == CE_OK) {
      cr_assert_str_eq(r.path, "/v1/items");
      cr_assert_str_eq(r.query, "limit=5");
      static const char want[] = "[[\"Host\",\"api.example.com\"],[\"Authorization\","
                                 "\"[redacted]\"],[\"X-Latin1\",\"caf\xef\xbf\xbd\"]]";
      cr_assert_eq(r.headers_len, strlen(want), "allocation %zu", n);
      cr_assert_eq(memcmp(r.headers, want, r.headers_len), 0, "allocation %zu", n);
      static const char want_resp[] = "[[\"Content-Type\",\"application/json\"],"
                                      "[\"Set-Cookie\",\"[redacted]\"]]";
      cr_assert_eq(r.response_headers_len, strlen(want_resp), "allocation %zu", n);
      cr_assert_eq(memcmp(r.response_headers, want_resp, r.response_headers_len), 0,
                   "allocation %zu", n);
    } else {
      cr_assert(hit);
      cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
    }
    ce_reqinfo_clear(&r);
    if (!hit)
      break;
  }
}

typedef struct {
  const ce_reqinfo_t *r;
  bool ask;
} ev_arg_t;

static void write_ev(ce_jsonw_t *w, const void *arg) {
  const ev_arg_t *a = arg;
  if (a->ask)
    ce_event_write_decision_request(w, a->r, 1);
  else
    ce_event_write(w, "request_allowed", a->r, NULL);
}

/* Writes the line with each allocation failing in turn: CE_ENOMEM and no
 * line, or the whole line; never a partial one. preview_len past the
 * inline buffer makes the writer's heap growth fail too. */
static void event_loop(size_t preview_len, bool ask) {
  ce_h1_head_t req, resp;
  heads(&req, &resp);
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 2);
  cr_assert_eq(ce_reqinfo_set_request(&r, &req, NULL), CE_OK);
  cr_assert_eq(ce_reqinfo_set_response(&r, &resp, NULL), CE_OK);
  fill(&r);
  char *body = NULL;
  if (preview_len > 0) {
    body = malloc(preview_len);
    cr_assert_not_null(body);
    memset(body, 'b', preview_len);
    ce_reqinfo_add_preview(&r, body, preview_len, preview_len);
  }
  ev_arg_t a = {&r, ask};
  size_t members = 0;
  for (size_t n = 0;; n++) {
    ce__line_t *line = (ce__line_t *)0x1;
    ce_failalloc_arm(n);
    int rc = ask ? ce__line_encode_frame_with("decision_request", "id", 3, true, write_ev, &a, &line)
                 : ce__line_encode_frame_with("event", "seq", 3, false, write_ev, &a, &line);
    ce_failalloc_disarm();
    if (ce_failalloc_failures() == 0) {
      cr_assert_eq(rc, CE_OK);
      json_t *ev = json_loadb(line->data, line->len - 1, 0, NULL);
      cr_assert_not_null(ev);
      json_t *inner = ask ? json_object_get(ev, "request") : ev;
      members = json_object_size(inner);
      cr_assert_eq(json_object_get(inner, "body_preview") != NULL, preview_len > 0);
      cr_assert_not_null(json_object_get(inner, "matched_rule"));
      json_decref(ev);
      ce__line_unref(line);
      break;
    }
    cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
    cr_assert_eq(line, (ce__line_t *)0x1, "allocation %zu: *out written on failure", n);
  }
  cr_assert_gt(members, 20);
  ce_reqinfo_clear(&r);
  free(body);
}

Test(event_failalloc, event_line) { event_loop(0, false); }
Test(event_failalloc, event_line_with_preview) { event_loop(10, false); }
Test(event_failalloc, event_line_past_the_inline_buffer) { event_loop(32 * 1024, false); }
Test(event_failalloc, decision_request_line) { event_loop(0, true); }

/* A header list past the record's inline buffer: its heap growth fails. */
Test(event_failalloc, long_header_list) {
  ce_h1_head_t req, resp;
  heads(&req, &resp);
  size_t vlen = 16 * 1024;
  char *v = malloc(vlen + 1);
  cr_assert_not_null(v);
  memset(v, 'v', vlen);
  v[vlen] = '\0';
  field(&req, "X-Long", v);
  for (size_t n = 0;; n++) {
    ce_reqinfo_t r;
    ce_reqinfo_init(&r, 1, 2);
    ce_failalloc_arm(n);
    int rc = ce_reqinfo_set_request(&r, &req, NULL);
    ce_failalloc_disarm();
    bool hit = ce_failalloc_failures() > 0;
    if (rc == CE_OK) {
      cr_assert_not_null(r.headers);
      cr_assert_gt(r.headers_len, vlen);
    } else {
      cr_assert(hit);
      cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
    }
    ce_reqinfo_clear(&r);
    if (!hit)
      break;
  }
  free(v);
}

Test(event_failalloc, a_preview_whose_buffer_could_not_be_had_stays_empty_until_reset) {
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 1);
  /* The first piece's buffer fails: a later piece must not start a preview
   * that skips the body's first bytes. */
  ce_failalloc_arm(0);
  ce_reqinfo_add_preview(&r, "first ", 6, 64);
  ce_failalloc_disarm();
  cr_assert_eq(ce_failalloc_failures(), 1);
  cr_assert(r.body_preview_lost);
  ce_reqinfo_add_preview(&r, "second", 6, 64);
  cr_assert_null(r.body_preview);
  cr_assert_eq(r.body_preview_len, 0);
  /* Previewed again from the body's start (a decision's forward path): it works. */
  ce_reqinfo_reset_preview(&r);
  ce_reqinfo_add_preview(&r, "first ", 6, 64);
  ce_reqinfo_add_preview(&r, "second", 6, 64);
  cr_assert_eq(r.body_preview_len, 12);
  cr_assert(memcmp(r.body_preview, "first second", 12) == 0);
  ce_reqinfo_clear(&r);
}
