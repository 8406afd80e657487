/* Allocation-failure tests for c_src/proxy/event.c: filling a request
 * record and building its event, with each allocation failing in turn. The
 * record is cleared after every attempt, so LSan at exit proves that a
 * half-filled record frees what it holds. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/error.h"
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
      cr_assert_eq(json_array_size(r.headers), 3, "allocation %zu", n);
      cr_assert_eq(json_array_size(r.response_headers), 2, "allocation %zu", n);
    } else {
      cr_assert(hit);
      cr_assert_eq(rc, CE_ENOMEM, "allocation %zu: %s", n, ce_err_name(rc));
    }
    ce_reqinfo_clear(&r);
    if (!hit)
      break;
  }
}

static void event_loop(bool preview) {
  ce_h1_head_t req, resp;
  heads(&req, &resp);
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 1, 2);
  cr_assert_eq(ce_reqinfo_set_request(&r, &req, NULL), CE_OK);
  cr_assert_eq(ce_reqinfo_set_response(&r, &resp, NULL), CE_OK);
  fill(&r);
  if (preview)
    ce_reqinfo_add_preview(&r, "hello body", 10, 64);
  size_t members = 0;
  for (size_t n = 0;; n++) {
    ce_failalloc_arm(n);
    json_t *ev = ce_event_new("request_allowed", &r, NULL);
    ce_failalloc_disarm();
    bool hit = ce_failalloc_failures() > 0;
    if (!hit) {
      cr_assert_not_null(ev);
      members = json_object_size(ev);
      cr_assert_eq(json_object_get(ev, "body_preview") != NULL, preview);
      json_decref(ev);
      break;
    }
    /* NULL, or an event with every member: never a partial one. */
    if (ev != NULL) {
      cr_assert_eq(json_object_get(ev, "body_preview") != NULL, preview, "allocation %zu", n);
      cr_assert_not_null(json_object_get(ev, "matched_rule"), "allocation %zu", n);
      json_decref(ev);
    }
  }
  cr_assert_gt(members, 20);
  ce_reqinfo_clear(&r);
}

Test(event_failalloc, event_new) { event_loop(false); }
Test(event_failalloc, event_new_with_preview) { event_loop(true); }
