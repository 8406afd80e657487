/* Tests for c_src/proxy/exchange.c: one request's fate whatever its
 * protocol. The deny page (the same words on HTTP/1.1 and h2; a decider's
 * reason may be as long as the control channel allows and the workspace
 * reads all of it), then the exchange itself driven with a fake channel
 * (events recorded as the control channel would write them, a decider
 * whose answers the test gives) and fake protocol ops: the target check,
 * allow / deny / decide, the decision cache, the bound on questions, and
 * one closing event per request. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/jsonw.h"
#include "control/control.h"
#include "policy/policy.h"
#include "proxy/exchange.h"
#include "proxy/proxy.h"

_Static_assert(CE_EXCHANGE_DENY_REASON_MAX == CE_CONTROL_MAX_REASON, "one limit: the control channel's");

Test(deny_text, a_reason_at_the_control_channel_limit_is_kept_whole) {
  char reason[CE_CONTROL_MAX_REASON + 1], host[CE_HOST_TEXT_MAX + 1], text[CE_EXCHANGE_DENY_TEXT_MAX];
  for (size_t i = 0; i < CE_CONTROL_MAX_REASON; i++)
    reason[i] = (char)('a' + i % 26);
  reason[CE_CONTROL_MAX_REASON] = '\0';
  /* The longest host and "who" too: nothing is cut. */
  memset(host, 'h', CE_HOST_TEXT_MAX);
  host[CE_HOST_TEXT_MAX] = '\0';
  char who[CE_EXCHANGE_DENY_WHO_MAX];
  memset(who, 'w', sizeof(who) - 1);
  who[sizeof(who) - 1] = '\0';

  ce_exchange_deny_text(text, sizeof(text), host, who, reason);
  char want[CE_EXCHANGE_DENY_TEXT_MAX + 64];
  snprintf(want, sizeof(want),
           "condukt: the network policy of this sandbox refused the request to %s\n"
           "refused by: %s\nreason: %s\n",
           host, who, reason);
  cr_assert_lt(strlen(want), sizeof(text), "the text buffer is too small for the longest refusal");
  cr_assert_str_eq(text, want);
}

Test(deny_text, bytes_outside_printable_ascii_become_question_marks) {
  char text[CE_EXCHANGE_DENY_TEXT_MAX];
  ce_exchange_deny_text(text, sizeof(text), "evil.com", "the decider of rule 2", "no\r\nX-Injected: 1 \xc3\xa9");
  cr_assert_str_eq(text,
                   "condukt: the network policy of this sandbox refused the request to evil.com\n"
                   "refused by: the decider of rule 2\nreason: no??X-Injected: 1 ??\n");
}

Test(deny_text, a_longer_reason_is_cut_at_the_limit) {
  static char reason[2 * CE_CONTROL_MAX_REASON + 1];
  memset(reason, 'r', sizeof(reason) - 1);
  char text[CE_EXCHANGE_DENY_TEXT_MAX];
  ce_exchange_deny_text(text, sizeof(text), "a.example", "rule 0 (deny)", reason);
  const char *r = strstr(text, "reason: ");
  cr_assert_not_null(r);
  cr_assert_eq(strlen(r + 8), CE_CONTROL_MAX_REASON + 1); /* the reason, then "\n" */
  cr_assert_eq(text[strlen(text) - 1], '\n');
}

/* ---- the exchange: one request's fate, with a fake channel and fake ops ---- */

#define MAX_EVENTS 16

typedef struct {
  char name[32];
  char reason[CE_CONTROL_MAX_REASON + 1];
  char host[sizeof(((ce_reqinfo_t *)0)->host)];
  int status;
  int32_t rule;
  char kind[16];
  char text[4096]; /* the event as the control channel writes it */
} event_t;

typedef struct {
  event_t events[MAX_EVENTS];
  size_t nevents;
  /* The decider: the last question, and what ask answers. */
  uint64_t next_id;    /* 0: ask fails */
  char asked_preview[64]; /* the body preview the question carried */
  uint64_t asked;      /* questions sent */
  uint64_t cancelled;
  int32_t asked_rule;
  ce_control_decision_cb cb;
  void *cb_data;
} channel_t;

static void fake_emit(void *ctx, const char *name, const ce_reqinfo_t *r, const char *reason) {
  channel_t *ch = ctx;
  cr_assert_lt(ch->nevents, MAX_EVENTS);
  event_t *e = &ch->events[ch->nevents++];
  snprintf(e->name, sizeof(e->name), "%s", name);
  snprintf(e->reason, sizeof(e->reason), "%s", reason != NULL ? reason : "");
  snprintf(e->host, sizeof(e->host), "%s", r->host);
  snprintf(e->kind, sizeof(e->kind), "%s", r->matched_kind != NULL ? r->matched_kind : "");
  e->status = r->status;
  e->rule = r->matched_rule;
  ce_jsonw_t w;
  ce_jsonw_init(&w, e->text, sizeof(e->text) - 1, sizeof(e->text) - 1);
  ce_event_write(&w, name, r, reason);
  cr_assert_eq(ce_jsonw_error(&w), CE_OK, "the event %s cannot be written", name);
  cr_assert_eq(w.buf, e->text, "the event %s outgrew the test's buffer", name);
  e->text[w.len] = '\0';
}

static uint64_t fake_ask(void *ctx, const ce_reqinfo_t *r, int32_t rule, uint32_t timeout_ms,
                         ce_control_decision_cb cb, void *data) {
  (void)timeout_ms;
  channel_t *ch = ctx;
  if (ch->next_id == 0)
    return 0;
  ch->asked++;
  ch->asked_rule = rule;
  snprintf(ch->asked_preview, sizeof(ch->asked_preview), "%.*s", (int)r->body_preview_len,
           r->body_preview != NULL ? r->body_preview : "");
  ch->cb = cb;
  ch->cb_data = data;
  return ch->next_id++;
}

static void fake_cancel(void *ctx, uint64_t id) {
  (void)id;
  channel_t *ch = ctx;
  ch->cancelled++;
  ch->cb = NULL;
}

static const ce_exchange_channel_t fake_channel = {fake_emit, fake_ask, fake_cancel};

/* What the protocol side saw. */
typedef struct {
  int forwarded;
  int responded;
  int status;
  char text[CE_EXCHANGE_DENY_TEXT_MAX];
  int asking;
  int answered;
  bool refuse_answers; /* answer_wanted says no */
  bool end_on_respond; /* respond ends the request, as HTTP/1.1 does */
  char body[64];       /* the request body buffered so far */
  bool body_ended;
  int previews;
  int previewing;
} side_t;

static void op_forward(ce_exchange_t *x) { ((side_t *)x->owner)->forwarded++; }
static void op_respond(ce_exchange_t *x, int status, const char *text) {
  side_t *s = x->owner;
  s->responded++;
  s->status = status;
  snprintf(s->text, sizeof(s->text), "%s", text);
  x->req.bytes_in += strlen(text);
  if (s->end_on_respond)
    ce_exchange_end(x);
}
static void op_asking(ce_exchange_t *x) { ((side_t *)x->owner)->asking++; }
static bool op_answer_wanted(ce_exchange_t *x) { return !((side_t *)x->owner)->refuse_answers; }
static void op_answered(ce_exchange_t *x) { ((side_t *)x->owner)->answered++; }

/* The body buffered so far, as the protocol would preview it. */
static bool op_preview(ce_exchange_t *x, bool final) {
  side_t *s = x->owner;
  s->previews++;
  free(x->req.body_preview);
  x->req.body_preview = NULL;
  x->req.body_preview_len = 0;
  ce_reqinfo_add_preview(&x->req, s->body, strlen(s->body), x->conn.proxy->opts->body_preview);
  return final || s->body_ended || x->req.body_preview_len >= x->conn.proxy->opts->body_preview;
}
static void op_previewing(ce_exchange_t *x) { ((side_t *)x->owner)->previewing++; }

static const ce_exchange_ops_t ops = {
    .forward = op_forward,
    .respond = op_respond,
    .preview = op_preview,
    .previewing = op_previewing,
    .asking = op_asking,
    .answer_wanted = op_answer_wanted,
    .answered = op_answered,
};

static const char *POLICY =
    "{\"version\":2,\"default\":\"deny\",\"rules\":["
    "{\"index\":0,\"kind\":\"deny\",\"hosts\":[\"evil.example\"]},"
    "{\"index\":1,\"kind\":\"allow\",\"hosts\":[{\"host\":\"api.example\",\"methods\":[\"GET\",\"HEAD\"],"
    "\"paths\":[\"/repos/myorg/**\"]},\"ok.example\"]},"
    "{\"index\":2,\"kind\":\"decide\",\"timeout_ms\":1000,\"cache\":false}]}";
/* Host, method and path rules alone: what no rule allows meets the default. */
static const char *POLICY_RULES =
    "{\"version\":2,\"default\":\"deny\",\"rules\":["
    "{\"index\":0,\"kind\":\"deny\",\"hosts\":[\"evil.example\"]},"
    "{\"index\":1,\"kind\":\"allow\",\"hosts\":[{\"host\":\"api.example\",\"methods\":[\"GET\",\"HEAD\"],"
    "\"paths\":[\"/repos/myorg/**\"]}]}]}";
/* The same with a decide rule that caches its answers. */
static const char *POLICY_CACHED =
    "{\"version\":2,\"default\":\"deny\",\"rules\":["
    "{\"index\":0,\"kind\":\"allow\",\"hosts\":[\"ok.example\"]},"
    "{\"index\":1,\"kind\":\"decide\",\"timeout_ms\":1000,\"cache\":true}]}";

typedef struct {
  ce_proxy_t proxy;
  ce_proxy_options_t opts;
  channel_t ch;
  ce_host_t name;
  ce_exchange_conn_t conn;
} fixture_t;

static void fixture_with(fixture_t *f, const char *policy, bool tls, const char *sni, uint16_t port) {
  memset(f, 0, sizeof(*f));
  ce_policy_error_t err;
  cr_assert_eq(ce_policy_load_buffer(policy, strlen(policy), &f->proxy.policy, &err), 0, "%s", err.message);
  f->proxy.opts = &f->opts;
  f->proxy.decisions = calloc(CE_DECISION_CACHE_SIZE, sizeof(*f->proxy.decisions));
  cr_assert_not_null(f->proxy.decisions);
  cr_assert_eq(ce_host_normalize(sni, strlen(sni), &f->name), 0);
  f->ch.next_id = 100;
  f->conn = (ce_exchange_conn_t){.proxy = &f->proxy, .channel = &fake_channel, .channel_ctx = &f->ch,
                                 .conn_id = 7, .tls = tls, .port = port, .sni_raw = sni, .name = &f->name};
}

static void fixture(fixture_t *f, bool tls, const char *sni, uint16_t port) {
  fixture_with(f, POLICY, tls, sni, port);
}

static void fixture_free(fixture_t *f) {
  ce_policy_free(f->proxy.policy);
  free(f->proxy.decisions);
}

/* One request through admit and decide. */
static bool request(fixture_t *f, ce_exchange_t *x, side_t *s, const char *host, const char *method,
                    const char *path) {
  ce_exchange_init(x, &ops, s, NULL);
  ce_exchange_open(x, &f->conn, 0);
  if (!ce_exchange_admit(x, host, host != NULL ? strlen(host) : 0, method, strlen(method), path, strlen(path),
                         "Host"))
    return false;
  ce_exchange_decide(x);
  return true;
}

static const event_t *ev(const fixture_t *f, size_t i) {
  cr_assert_lt(i, f->ch.nevents, "event %zu of %zu", i, f->ch.nevents);
  return &f->ch.events[i];
}

Test(exchange, an_allowed_request_is_forwarded_and_its_events_carry_bytes_and_duration) {
  fixture_t f;
  fixture(&f, true, "ok.example", 443);
  ce_exchange_t x;
  side_t s = {0};
  cr_assert(request(&f, &x, &s, "ok.example", "POST", "/anything"));
  cr_assert_eq(s.forwarded, 1);
  cr_assert_eq(s.responded, 0);
  cr_assert_eq(x.state, CE_EXCHANGE_ALLOWED);
  ce_exchange_allowed(&x);
  ce_exchange_allowed(&x); /* once */
  x.req.bytes_out = 123;
  x.req.bytes_in = 4567;
  ce_reqinfo_add_preview(&x.req, "hello body", 10, 5);
  cr_assert(ce_exchange_finish(&x, NULL));
  cr_assert_not(ce_exchange_finish(&x, "late"), "a request has one closing event");
  cr_assert_eq(f.ch.nevents, 3);
  cr_assert_str_eq(ev(&f, 0)->name, "request_opened");
  cr_assert_str_eq(ev(&f, 1)->name, "request_allowed");
  cr_assert_eq(ev(&f, 1)->rule, 1);
  cr_assert_str_eq(ev(&f, 1)->kind, "allow");
  cr_assert_str_eq(ev(&f, 2)->name, "request_closed");
  cr_assert_not_null(strstr(ev(&f, 2)->text, "\"bytes_in\":4567"), "%s", ev(&f, 2)->text);
  cr_assert_not_null(strstr(ev(&f, 2)->text, "\"bytes_out\":123"), "%s", ev(&f, 2)->text);
  cr_assert_not_null(strstr(ev(&f, 2)->text, "\"duration_us\":"), "%s", ev(&f, 2)->text);
  cr_assert_null(strstr(ev(&f, 0)->text, "\"duration_us\":"), "only the closing events carry it");
  ce_exchange_end(&x);
  cr_assert_eq(x.state, CE_EXCHANGE_IDLE);
  fixture_free(&f);
}

Test(exchange, a_deny_rule_answers_403_naming_the_rule) {
  fixture_t f;
  fixture(&f, false, "10.0.0.1", 80);
  ce_exchange_t x;
  side_t s = {0};
  cr_assert(request(&f, &x, &s, "evil.example", "GET", "/"));
  cr_assert_eq(s.forwarded, 0);
  cr_assert_eq(s.responded, 1);
  cr_assert_eq(s.status, 403);
  cr_assert_str_eq(s.text, "condukt: the network policy of this sandbox refused the request to evil.example\n"
                           "refused by: rule 0 (deny)\nreason: denied_by_rule\n");
  cr_assert_eq(f.ch.nevents, 2);
  cr_assert_str_eq(ev(&f, 1)->name, "request_denied");
  cr_assert_str_eq(ev(&f, 1)->reason, "denied_by_rule");
  cr_assert_eq(ev(&f, 1)->status, 403);
  cr_assert_eq(ev(&f, 1)->rule, 0);
  cr_assert_not(ce_exchange_finish(&x, "client_reset"), "a denied request has had its closing event");
  ce_exchange_end(&x);
  fixture_free(&f);
}

Test(exchange, a_method_or_path_outside_the_rule_falls_through_to_the_default) {
  fixture_t f;
  fixture_with(&f, POLICY_RULES, true, "api.example", 443);
  ce_exchange_t x;
  side_t s = {0};
  cr_assert(request(&f, &x, &s, "api.example", "GET", "/repos/myorg/x"));
  cr_assert_eq(s.forwarded, 1);
  ce_exchange_end(&x);

  side_t post = {0};
  cr_assert(request(&f, &x, &post, "api.example", "POST", "/repos/myorg/x"));
  cr_assert_eq(post.forwarded, 0);
  cr_assert_eq(post.status, 403);
  cr_assert_not_null(strstr(post.text, "refused by: the policy default\nreason: default_deny\n"), "%s", post.text);
  ce_exchange_end(&x);

  side_t escape = {0};
  cr_assert(request(&f, &x, &escape, "api.example", "GET", "/repos/myorg/../other"));
  cr_assert_eq(escape.forwarded, 0, "a dot segment must not leave the rule's path");
  cr_assert_eq(escape.status, 403);
  ce_exchange_end(&x);
  fixture_free(&f);
}

Test(exchange, the_target_must_be_the_connections_name_and_port) {
  fixture_t f;
  fixture(&f, true, "ok.example", 443);
  ce_exchange_t x;

  side_t other = {0};
  cr_assert_not(request(&f, &x, &other, "evil.example", "GET", "/"));
  cr_assert_eq(other.status, 421);
  cr_assert_not_null(strstr(other.text, "is not the TLS server name ok.example"), "%s", other.text);
  cr_assert_str_eq(ev(&f, 1)->reason, "misdirected_request");
  ce_exchange_end(&x);

  side_t port = {0};
  cr_assert_not(request(&f, &x, &port, "ok.example:8443", "GET", "/"));
  cr_assert_eq(port.status, 421);
  ce_exchange_end(&x);

  side_t same_port = {0};
  cr_assert(request(&f, &x, &same_port, "ok.example:443", "GET", "/"));
  cr_assert_eq(same_port.forwarded, 1);
  ce_exchange_end(&x);

  side_t none = {0};
  cr_assert_not(request(&f, &x, &none, NULL, "GET", "/"));
  cr_assert_eq(none.status, 400);
  cr_assert_str_eq(none.text, "condukt: malformed request: the request names no host\n");
  ce_exchange_end(&x);

  side_t bad = {0};
  cr_assert_not(request(&f, &x, &bad, "ok.example:99999", "GET", "/"));
  cr_assert_eq(bad.status, 400);
  cr_assert_str_eq(f.ch.events[f.ch.nevents - 1].reason, "invalid_host");
  ce_exchange_end(&x);
  cr_assert_eq(f.ch.asked, 0);
  fixture_free(&f);
}

Test(exchange, a_plain_connection_may_name_any_host) {
  fixture_t f;
  fixture(&f, false, "10.0.0.1", 80);
  ce_exchange_t x;
  side_t s = {0};
  cr_assert(request(&f, &x, &s, "ok.example", "GET", "/"));
  cr_assert_eq(s.forwarded, 1);
  cr_assert_str_eq(x.req.host, "ok.example");
  cr_assert_str_eq(x.req.scheme, "http");
  ce_exchange_end(&x);
  fixture_free(&f);
}

Test(exchange, a_decide_rule_asks_and_the_answer_allows) {
  fixture_t f;
  fixture(&f, true, "ask.example", 443);
  ce_exchange_t x;
  side_t s = {0};
  cr_assert(request(&f, &x, &s, "ask.example", "GET", "/"));
  cr_assert_eq(x.state, CE_EXCHANGE_DECIDING);
  cr_assert_eq(s.asking, 1);
  cr_assert_eq(f.ch.asked, 1);
  cr_assert_eq(f.ch.asked_rule, 2);
  cr_assert_eq(s.forwarded, 0, "nothing goes upstream before the answer");
  f.ch.cb(f.ch.cb_data, CE_OK, true, NULL, true);
  cr_assert_eq(s.forwarded, 1);
  cr_assert_eq(s.answered, 1);
  cr_assert_eq(x.req.matched_rule, 2);
  cr_assert_str_eq(x.req.matched_kind, "decide");
  ce_exchange_end(&x);
  cr_assert_eq(f.ch.cancelled, 0, "no question is out any more");
  fixture_free(&f);
}

Test(exchange, a_decider_that_refuses_is_named_with_its_reason) {
  fixture_t f;
  fixture(&f, true, "ask.example", 443);
  ce_exchange_t x;
  side_t s = {0};
  cr_assert(request(&f, &x, &s, "ask.example", "GET", "/"));
  f.ch.cb(f.ch.cb_data, CE_OK, false, "not on weekends", false);
  cr_assert_eq(s.status, 403);
  cr_assert_str_eq(s.text, "condukt: the network policy of this sandbox refused the request to ask.example\n"
                           "refused by: the decider of rule 2\nreason: not on weekends\n");
  const event_t *e = ev(&f, f.ch.nevents - 1);
  cr_assert_str_eq(e->name, "request_denied");
  cr_assert_str_eq(e->reason, "not on weekends");
  cr_assert_str_eq(e->kind, "decide");
  ce_exchange_end(&x);
  fixture_free(&f);
}

Test(exchange, no_answer_fails_closed) {
  fixture_t f;
  fixture(&f, true, "ask.example", 443);
  ce_exchange_t x;
  side_t timeout = {0};
  cr_assert(request(&f, &x, &timeout, "ask.example", "GET", "/"));
  f.ch.cb(f.ch.cb_data, CE_ETIMEDOUT, true, NULL, true);
  cr_assert_eq(timeout.forwarded, 0, "a timeout never allows, whatever allow says");
  cr_assert_str_eq(f.ch.events[f.ch.nevents - 1].reason, "decider_timeout");
  ce_exchange_end(&x);

  side_t gone = {0};
  cr_assert(request(&f, &x, &gone, "ask.example", "GET", "/"));
  f.ch.cb(f.ch.cb_data, CE_ECLOSED, true, NULL, true);
  cr_assert_eq(gone.forwarded, 0);
  cr_assert_str_eq(f.ch.events[f.ch.nevents - 1].reason, "control_channel_unavailable");
  ce_exchange_end(&x);

  f.ch.next_id = 0; /* nothing can be asked */
  side_t unsent = {0};
  cr_assert(request(&f, &x, &unsent, "ask.example", "GET", "/"));
  cr_assert_eq(unsent.forwarded, 0);
  cr_assert_eq(unsent.status, 403);
  cr_assert_str_eq(f.ch.events[f.ch.nevents - 1].reason, "control_channel_unavailable");
  ce_exchange_end(&x);

  f.ch.next_id = 200;
  side_t empty = {0};
  cr_assert(request(&f, &x, &empty, "ask.example", "GET", "/"));
  f.ch.cb(f.ch.cb_data, CE_OK, false, "", false);
  cr_assert_str_eq(f.ch.events[f.ch.nevents - 1].reason, "denied_by_decider");
  ce_exchange_end(&x);
  fixture_free(&f);
}

Test(exchange, a_caching_rule_answers_the_next_request_from_the_cache) {
  fixture_t f;
  fixture_with(&f, POLICY_CACHED, true, "cached.example", 443);
  ce_exchange_t x;
  side_t first = {0};
  cr_assert(request(&f, &x, &first, "cached.example", "GET", "/"));
  f.ch.cb(f.ch.cb_data, CE_OK, false, "no", true);
  cr_assert_eq(first.status, 403);
  ce_exchange_end(&x);
  side_t second = {0};
  cr_assert(request(&f, &x, &second, "cached.example", "GET", "/"));
  cr_assert_eq(f.ch.asked, 1, "the second request is answered from the cache");
  cr_assert_eq(second.status, 403);
  cr_assert_not_null(strstr(second.text, "reason: no\n"), "%s", second.text);
  ce_exchange_end(&x);
  fixture_free(&f);
}

Test(exchange, questions_per_connection_are_bounded_and_waiting_ones_ask_in_turn) {
  fixture_t f;
  fixture(&f, true, "ask.example", 443);
  ce_exchange_asks_t asks = {.max = 1};
  ce_exchange_t a, b;
  side_t sa = {0}, sb = {0};
  ce_exchange_init(&a, &ops, &sa, &asks);
  ce_exchange_init(&b, &ops, &sb, &asks);
  ce_exchange_open(&a, &f.conn, 1);
  ce_exchange_open(&b, &f.conn, 3);
  cr_assert(ce_exchange_admit(&a, "ask.example", 11, "GET", 3, "/", 1, ":authority"));
  cr_assert(ce_exchange_admit(&b, "ask.example", 11, "GET", 3, "/", 1, ":authority"));
  ce_exchange_decide(&a);
  ce_exchange_decide(&b);
  cr_assert_eq(a.state, CE_EXCHANGE_DECIDING);
  cr_assert_eq(b.state, CE_EXCHANGE_WAITING);
  cr_assert_eq(asks.out, 1);
  cr_assert_not(ce_exchange_resume(&b), "no room yet");
  f.ch.cb(f.ch.cb_data, CE_OK, true, NULL, false);
  cr_assert_eq(asks.out, 0);
  cr_assert(ce_exchange_resume(&b));
  cr_assert_eq(b.state, CE_EXCHANGE_DECIDING);
  cr_assert_eq(asks.out, 1);
  /* The stream goes away: its question is cancelled, the room given back. */
  ce_exchange_end(&b);
  cr_assert_eq(f.ch.cancelled, 1);
  cr_assert_eq(asks.out, 0);
  ce_exchange_end(&a);
  fixture_free(&f);
}

Test(exchange, an_answer_the_request_no_longer_wants_is_dropped) {
  fixture_t f;
  fixture(&f, true, "ask.example", 443);
  ce_exchange_t x;
  side_t s = {0};
  cr_assert(request(&f, &x, &s, "ask.example", "GET", "/"));
  s.refuse_answers = true;
  size_t before = f.ch.nevents;
  f.ch.cb(f.ch.cb_data, CE_OK, true, NULL, true);
  cr_assert_eq(s.forwarded, 0);
  cr_assert_eq(s.answered, 0);
  cr_assert_eq(f.ch.nevents, before);
  ce_exchange_end(&x);
  fixture_free(&f);
}

Test(exchange, a_private_address_is_a_denial_before_allowed_and_a_failure_after) {
  fixture_t f;
  fixture(&f, true, "ok.example", 443);
  ce_exchange_t x;
  side_t s = {0};
  s.end_on_respond = true; /* the answer may end the request: the event went out before */
  cr_assert(request(&f, &x, &s, "ok.example", "GET", "/"));
  ce_exchange_refuse_private(&x, "upstream_private_address: 10.1.2.3");
  cr_assert_eq(s.status, 403);
  cr_assert_not_null(strstr(s.text, "private, loopback or link-local address"), "%s", s.text);
  cr_assert_str_eq(f.ch.events[f.ch.nevents - 1].name, "request_denied");
  cr_assert_eq(x.state, CE_EXCHANGE_IDLE);

  side_t again = {0};
  cr_assert(request(&f, &x, &again, "ok.example", "GET", "/"));
  ce_exchange_allowed(&x);
  ce_exchange_refuse_private(&x, "upstream_private_address: 10.1.2.3");
  cr_assert_str_eq(f.ch.events[f.ch.nevents - 1].name, "request_failed");
  cr_assert_str_eq(f.ch.events[f.ch.nevents - 1].reason, "upstream_private_address: 10.1.2.3");
  ce_exchange_end(&x);
  fixture_free(&f);
}

Test(exchange, a_rejected_request_names_the_connection_and_may_leave_the_answer_to_the_caller) {
  fixture_t f;
  fixture(&f, true, "ok.example", 443);
  ce_exchange_t x;
  side_t s = {0};
  ce_exchange_init(&x, &ops, &s, NULL);
  ce_exchange_open(&x, &f.conn, 5);
  ce_exchange_reject(&x, 400, "bad_request: connect_not_supported", "CONNECT is not supported\r\n");
  cr_assert_eq(s.status, 400);
  cr_assert_str_eq(s.text, "condukt: CONNECT is not supported??\n");
  cr_assert_str_eq(ev(&f, 0)->name, "request_opened");
  cr_assert_str_eq(ev(&f, 0)->host, "ok.example");
  cr_assert_str_eq(ev(&f, 1)->name, "request_denied");
  cr_assert_not_null(strstr(ev(&f, 1)->text, "\"stream_id\":5"), "%s", ev(&f, 1)->text);
  ce_exchange_end(&x);

  side_t reset = {0};
  ce_exchange_init(&x, &ops, &reset, NULL);
  ce_exchange_open(&x, &f.conn, 7);
  ce_exchange_reject(&x, 0, "request_header_budget", NULL);
  cr_assert_eq(reset.responded, 0, "the caller resets the stream itself");
  cr_assert_str_eq(f.ch.events[f.ch.nevents - 1].name, "request_denied");
  ce_exchange_end(&x);
  fixture_free(&f);
}

Test(exchange, with_a_body_preview_the_question_waits_for_the_first_body_bytes_and_carries_them) {
  fixture_t f;
  fixture(&f, true, "ask.example", 443);
  f.opts.body_preview = 8;
  ce_exchange_t x;
  side_t s = {0};
  snprintf(s.body, sizeof(s.body), "abc");
  cr_assert(request(&f, &x, &s, "ask.example", "POST", "/"));
  cr_assert_eq(x.state, CE_EXCHANGE_PREVIEWING);
  cr_assert_eq(s.previewing, 1);
  cr_assert_eq(f.ch.asked, 0, "no question before the body");
  ce_exchange_body(&x, false);
  cr_assert_eq(f.ch.asked, 0, "3 of 8 bytes: still waiting");
  snprintf(s.body, sizeof(s.body), "abcdefghijkl");
  ce_exchange_body(&x, false);
  cr_assert_eq(f.ch.asked, 1);
  cr_assert_str_eq(f.ch.asked_preview, "abcdefgh", "the question carries the first 8 bytes");
  cr_assert_eq(x.state, CE_EXCHANGE_DECIDING);
  ce_exchange_body(&x, true); /* late: nothing happens */
  cr_assert_eq(f.ch.asked, 1);
  f.ch.cb(f.ch.cb_data, CE_OK, true, NULL, false);
  cr_assert_eq(s.forwarded, 1);
  cr_assert_eq(x.req.body_preview_len, 0, "forwarding previews the same bytes again, from the start");
  ce_exchange_end(&x);
  fixture_free(&f);
}

Test(exchange, the_wait_for_the_body_ends_with_what_came) {
  fixture_t f;
  fixture(&f, true, "ask.example", 443);
  f.opts.body_preview = 8;
  ce_exchange_t x;
  side_t s = {0};
  snprintf(s.body, sizeof(s.body), "ab");
  cr_assert(request(&f, &x, &s, "ask.example", "POST", "/"));
  ce_exchange_body(&x, true); /* the protocol's timer */
  cr_assert_eq(f.ch.asked, 1);
  cr_assert_str_eq(f.ch.asked_preview, "ab");
  f.ch.cb(f.ch.cb_data, CE_OK, false, "no", false);
  cr_assert_eq(s.status, 403);
  cr_assert_eq(x.req.body_preview_len, 2, "a refusal's event keeps the preview the decider saw");
  ce_exchange_end(&x);

  /* A body that ended short of the preview size: asked at once. */
  side_t short_body = {0};
  snprintf(short_body.body, sizeof(short_body.body), "x");
  short_body.body_ended = true;
  cr_assert(request(&f, &x, &short_body, "ask.example", "POST", "/"));
  ce_exchange_body(&x, false);
  cr_assert_eq(f.ch.asked, 2);
  cr_assert_str_eq(f.ch.asked_preview, "x");
  ce_exchange_end(&x);
  fixture_free(&f);
}

Test(exchange, an_allow_or_deny_rule_never_waits_for_the_body) {
  fixture_t f;
  fixture(&f, true, "ok.example", 443);
  f.opts.body_preview = 8;
  ce_exchange_t x;
  side_t s = {0};
  cr_assert(request(&f, &x, &s, "ok.example", "POST", "/"));
  cr_assert_eq(s.forwarded, 1);
  cr_assert_eq(s.previews, 0);
  cr_assert_eq(s.previewing, 0);
  ce_exchange_end(&x);
  fixture_free(&f);
}
