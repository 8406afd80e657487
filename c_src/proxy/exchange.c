/* One request's fate, whatever its protocol (proxy/exchange.h). */
#include "proxy/exchange.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/text.h"
#include "common/trace.h"

#define trace(x, fmt, ...) CE_TRACE_D("proxy", 'c', (x)->conn.conn_id, "[request %llu] " fmt, \
                                      (unsigned long long)(x)->req.id, ##__VA_ARGS__)

static const char *const state_names[] = {"idle",     "open",    "previewing", "waiting",
                                          "deciding", "allowed", "refused"};

static void set_state(ce_exchange_t *x, ce_exchange_state_t s) {
  if (x->state != s)
    trace(x, "%s -> %s", state_names[x->state], state_names[s]);
  x->state = s;
}

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- the control channel as the exchange's channel ---------------------- */

static void control_emit(void *ctx, const char *name, const ce_reqinfo_t *r, const char *reason) {
  ce_event_emit(ctx, name, r, reason);
}

static uint64_t control_ask(void *ctx, const ce_reqinfo_t *r, int32_t rule, uint32_t timeout_ms,
                            ce_control_decision_cb cb, void *data) {
  return ce_event_ask(ctx, r, rule, timeout_ms, cb, data);
}

static void control_cancel(void *ctx, uint64_t id) { ce_control_cancel(ctx, id); }

const ce_exchange_channel_t ce_exchange_control_channel = {control_emit, control_ask, control_cancel};

/* ---- texts --------------------------------------------------------------- */

/* Printable ASCII only: a response body the workspace reads as text, and
 * no byte a terminal or a log could take for a control sequence. */
static void plain(char *dst, size_t cap, const char *src) {
  size_t w = 0;
  for (size_t i = 0; src[i] != '\0' && w + 1 < cap; i++) {
    unsigned char ch = (unsigned char)src[i];
    dst[w++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
  }
  dst[w] = '\0';
}

void ce_exchange_deny_text(char *out, size_t cap, const char *host, const char *who, const char *reason) {
  char h[CE_HOST_TEXT_MAX + 1], why[CE_EXCHANGE_DENY_REASON_MAX + 1];
  plain(h, sizeof(h), host);
  plain(why, sizeof(why), reason);
  snprintf(out, cap,
           "condukt: the network policy of this sandbox refused the request to %s\n"
           "refused by: %s\nreason: %s\n",
           h, who, why);
}

void ce_exchange_text(char *out, size_t cap, const char *detail) {
  char d[CE_EXCHANGE_TEXT_MAX - 16];
  plain(d, sizeof(d), detail);
  snprintf(out, cap, "condukt: %s\n", d);
}

/* ---- the record ---------------------------------------------------------- */

void ce_exchange_init(ce_exchange_t *x, const ce_exchange_ops_t *ops, void *owner, ce_exchange_asks_t *asks) {
  memset(x, 0, sizeof(*x));
  x->ops = ops;
  x->owner = owner;
  x->asks = asks;
  x->decide_rule = -1;
}

void ce_exchange_open(ce_exchange_t *x, const ce_exchange_conn_t *conn, int32_t stream_id) {
  ce_exchange_end(x);
  x->conn = *conn;
  ce_reqinfo_init(&x->req, ++conn->proxy->next_request_id, conn->conn_id);
  x->req.scheme = conn->tls ? "https" : "http";
  x->req.port = conn->port;
  x->req.stream_id = stream_id;
  ce_text_copy(x->req.sni, sizeof(x->req.sni), conn->sni_raw != NULL ? conn->sni_raw : "");
  ce_text_copy(x->req.host, sizeof(x->req.host), conn->name != NULL ? conn->name->text : "");
  x->ended = false;
  x->allowed_sent = false;
  x->decide_rule = -1;
  x->decide_cache = false;
  x->previewed = false;
  memset(&x->verdict, 0, sizeof(x->verdict));
  set_state(x, CE_EXCHANGE_OPEN);
}

static void cancel_ask(ce_exchange_t *x) {
  if (x->ask_id == 0)
    return;
  x->conn.channel->cancel(x->conn.channel_ctx, x->ask_id);
  x->ask_id = 0;
  if (x->asks != NULL)
    x->asks->out--;
}

void ce_exchange_cancel(ce_exchange_t *x) { cancel_ask(x); }

void ce_exchange_end(ce_exchange_t *x) {
  if (x->state == CE_EXCHANGE_IDLE)
    return;
  cancel_ask(x);
  ce_reqinfo_clear(&x->req);
  set_state(x, CE_EXCHANGE_IDLE);
}

void ce_exchange_emit(ce_exchange_t *x, const char *name, const char *reason) {
  if (x->state == CE_EXCHANGE_IDLE)
    return;
  x->conn.channel->emit(x->conn.channel_ctx, name, &x->req, reason);
}

void ce_exchange_allowed(ce_exchange_t *x) {
  if (x->allowed_sent || x->state == CE_EXCHANGE_IDLE)
    return;
  x->allowed_sent = true;
  ce_exchange_emit(x, "request_allowed", NULL);
}

bool ce_exchange_finish(ce_exchange_t *x, const char *reason) {
  if (x->ended || x->state == CE_EXCHANGE_IDLE)
    return false;
  x->ended = true;
  x->req.closed_at_us = ce_now_us();
  ce_exchange_emit(x, reason != NULL ? "request_failed" : "request_closed", reason);
  return true;
}

/* ---- refusals ------------------------------------------------------------ */

void ce_exchange_refuse_as(ce_exchange_t *x, const char *event, int status, const char *reason, const char *text) {
  set_state(x, CE_EXCHANGE_REFUSED);
  x->req.status = status;
  x->req.closed_at_us = ce_now_us();
  /* The event before the answer: the answer may end the request. */
  if (!x->ended) {
    x->ended = true;
    ce_exchange_emit(x, event, reason);
  }
  if (text != NULL)
    x->ops->respond(x, status, text);
}

void ce_exchange_refuse(ce_exchange_t *x, const char *event, int status, const char *reason, const char *detail) {
  char text[CE_EXCHANGE_TEXT_MAX];
  ce_exchange_text(text, sizeof(text), detail);
  ce_exchange_refuse_as(x, event, status, reason, text);
}

void ce_exchange_reject(ce_exchange_t *x, int status, const char *reason, const char *detail) {
  ce_text_copy(x->req.host, sizeof(x->req.host), x->conn.name != NULL ? x->conn.name->text : "");
  ce_exchange_emit(x, "request_opened", NULL);
  if (detail == NULL)
    ce_exchange_refuse_as(x, "request_denied", status, reason, NULL);
  else
    ce_exchange_refuse(x, "request_denied", status, reason, detail);
}

void ce_exchange_refuse_private(ce_exchange_t *x, const char *reason) {
  const char *detail = "the network policy of this sandbox refused the request: the host resolves to a private, "
                       "loopback or link-local address that the policy does not name";
  char text[CE_EXCHANGE_TEXT_MAX], d[CE_EXCHANGE_TEXT_MAX];
  snprintf(d, sizeof(d), "%s (%s)", detail, reason);
  ce_exchange_text(text, sizeof(text), d);
  /* Said allowed already (an upstream taken again): a failure. */
  ce_exchange_refuse_as(x, x->allowed_sent ? "request_failed" : "request_denied", 403, reason, text);
}

/* A policy refusal: the deny page names who refused. */
static void deny(ce_exchange_t *x, const char *who, const char *reason) {
  char text[CE_EXCHANGE_DENY_TEXT_MAX];
  ce_exchange_deny_text(text, sizeof(text), x->req.host, who, reason);
  ce_exchange_refuse_as(x, "request_denied", 403, reason, text);
}

/* ---- the target ---------------------------------------------------------- */

/* Splits "host", "host:port", "[v6]" or "[v6]:port". Returns false when the
 * port is malformed. */
static bool split_authority(const char *a, size_t n, size_t *host_len, long *port) {
  *port = -1;
  size_t hl = n;
  if (n > 0 && a[0] == '[') {
    const char *close = memchr(a, ']', n);
    if (close == NULL)
      return false;
    hl = (size_t)(close - a) + 1;
  } else {
    const char *colon = memchr(a, ':', n);
    if (colon != NULL)
      hl = (size_t)(colon - a);
  }
  if (hl < n) {
    if (a[hl] != ':' || hl + 1 == n || n - hl - 1 > 5)
      return false;
    long p = 0;
    for (size_t i = hl + 1; i < n; i++) {
      if (a[i] < '0' || a[i] > '9')
        return false;
      p = p * 10 + (a[i] - '0');
    }
    if (p == 0 || p > 65535)
      return false;
    *port = p;
  }
  *host_len = hl;
  return true;
}

void ce_exchange_check_target(const ce_exchange_conn_t *conn, const char *auth, size_t len, const char *method,
                              size_t method_len, const char *target, size_t target_len, const char *label,
                              char *host, size_t host_cap, ce_target_check_t *t) {
  memset(t, 0, sizeof(*t));
  const char *name = conn->name != NULL ? conn->name->text : "";
  if (auth == NULL || len == 0) {
    ce_text_copy(host, host_cap, name);
    t->status = 400;
    t->reason = "bad_request: missing host";
    snprintf(t->detail, sizeof(t->detail), "malformed request: the request names no host");
    return;
  }
  size_t host_len;
  long port;
  bool port_ok = split_authority(auth, len, &host_len, &port);
  ce_policy_eval_request(conn->proxy->policy, auth, port_ok ? host_len : len, method, method_len, target, target_len,
                         &t->verdict);
  if (!port_ok || !t->verdict.host_valid) {
    size_t n = len < host_cap - 1 ? len : host_cap - 1;
    memcpy(host, auth, n);
    host[n] = '\0';
    t->status = 400;
    t->reason = "invalid_host";
    snprintf(t->detail, sizeof(t->detail), "malformed request: the %s is not a valid host name or address", label);
    return;
  }
  ce_text_copy(host, host_cap, t->verdict.host.text);
  /* DESIGN §4: the request must name the host the connection was opened
   * for (TLS: the SNI, or the IP dialled when there was none) and its
   * port; anything else is domain fronting or coalescing: 421 (RFC 9110
   * §15.5.20). Plain HTTP may name any host per request: its upstream is
   * the host named, resolved by the proxy. */
  if (conn->tls && strcmp(t->verdict.host.text, name) != 0) {
    t->status = 421;
    t->reason = "misdirected_request";
    snprintf(t->detail, sizeof(t->detail),
             "misdirected request: the %s %s is not the TLS server name %s of this connection", label,
             t->verdict.host.text, name);
    return;
  }
  if (port >= 0 && port != conn->port) {
    t->status = 421;
    t->reason = "misdirected_request";
    snprintf(t->detail, sizeof(t->detail),
             "misdirected request: the %s names port %ld but this connection is to port %u", label, port,
             (unsigned)conn->port);
    return;
  }
}

bool ce_exchange_admit(ce_exchange_t *x, const char *auth, size_t len, const char *method, size_t method_len,
                       const char *target, size_t target_len, const char *label) {
  ce_target_check_t t;
  ce_exchange_check_target(&x->conn, auth, len, method, method_len, target, target_len, label, x->req.host,
                           sizeof(x->req.host), &t);
  ce_exchange_emit(x, "request_opened", NULL);
  if (t.status != 0) {
    ce_exchange_refuse(x, "request_denied", t.status, t.reason, t.detail);
    return false;
  }
  x->verdict.decision = t.verdict.decision;
  x->verdict.reason = t.verdict.reason;
  x->verdict.rule_index = t.verdict.rule_index;
  x->verdict.rule_kind = t.verdict.rule_kind;
  return true;
}

/* ---- decisions ----------------------------------------------------------- */

static void decided(ce_exchange_t *x, bool allow, const char *reason) {
  x->req.matched_rule = x->decide_rule;
  x->req.matched_kind = "decide";
  if (allow) {
    if (x->previewed) {
      /* The forwarding path previews the same bytes again, as it does
       * for every request: the record starts over. */
      ce_reqinfo_reset_preview(&x->req);
    }
    set_state(x, CE_EXCHANGE_ALLOWED);
    x->ops->forward(x);
    return;
  }
  char who[CE_EXCHANGE_DENY_WHO_MAX];
  snprintf(who, sizeof(who), "the decider of rule %d", (int)x->decide_rule);
  deny(x, who, reason);
}

bool ce_exchange_decision_outcome(ce_proxy_t *p, int status, bool allow, const char *reason, bool cacheable,
                                  bool cache, int32_t rule, const char *host, const char **why) {
  if (status != CE_OK) {
    *why = status == CE_ETIMEDOUT ? "decider_timeout" : "control_channel_unavailable";
    return false;
  }
  *why = allow ? NULL : (reason != NULL && reason[0] != '\0' ? reason : "denied_by_decider");
  if (cache && cacheable)
    ce_decision_cache_put(p, rule, host, allow, *why != NULL ? *why : "");
  return allow;
}

static void on_answer(void *data, int status, bool allow, const char *reason, bool cacheable) {
  ce_exchange_t *x = data;
  x->ask_id = 0;
  if (x->asks != NULL)
    x->asks->out--;
  if (x->state != CE_EXCHANGE_DECIDING)
    return;
  if (x->ops->answer_wanted != NULL && !x->ops->answer_wanted(x))
    return;
  const char *why;
  bool ok = ce_exchange_decision_outcome(x->conn.proxy, status, allow, reason, cacheable, x->decide_cache,
                                         x->decide_rule, x->req.host, &why);
  trace(x, "the decider answered: %s", ok ? "allow" : why);
  decided(x, ok, why);
  if (x->ops->answered != NULL)
    x->ops->answered(x);
}

/* The cache, else a question when the connection has room for one. */
static void ask(ce_exchange_t *x) {
  ce_rule_info_t info;
  if (ce_policy_rule(x->conn.proxy->policy, (size_t)x->decide_rule, &info) != 0) {
    decided(x, false, "decider_error");
    return;
  }
  x->decide_cache = info.cache;
  bool allow;
  const char *reason;
  if (info.cache && ce_decision_cache_get(x->conn.proxy, x->decide_rule, x->req.host, &allow, &reason)) {
    trace(x, "decision cache hit for %s", x->req.host);
    decided(x, allow, allow ? NULL : reason);
    return;
  }
  if (!x->previewed && x->conn.proxy->opts->body_preview > 0 && x->ops->preview != NULL) {
    /* The question carries the first body bytes: they are awaited (read
     * into the connection's bounded buffer, nothing forwarded), at most
     * CE_EXCHANGE_PREVIEW_WAIT_MS. */
    set_state(x, CE_EXCHANGE_PREVIEWING);
    x->preview_until = mono_ms() + CE_EXCHANGE_PREVIEW_WAIT_MS;
    if (x->ops->previewing != NULL)
      x->ops->previewing(x);
    return;
  }
  if (x->asks != NULL && x->asks->out >= x->asks->max) {
    /* Asked (the cache first) when a question ends: ce_exchange_resume. */
    set_state(x, CE_EXCHANGE_WAITING);
    return;
  }
  set_state(x, CE_EXCHANGE_DECIDING);
  if (x->ops->asking != NULL)
    x->ops->asking(x);
  /* A request that cannot be written (out of memory, too long) fails the
   * ask: no question, so the request is denied (fail closed). */
  x->ask_id = x->conn.channel->ask(x->conn.channel_ctx, &x->req, x->decide_rule, info.timeout_ms, on_answer, x);
  if (x->ask_id == 0) {
    decided(x, false, "control_channel_unavailable");
    return;
  }
  if (x->asks != NULL)
    x->asks->out++;
}

void ce_exchange_decide(ce_exchange_t *x) {
  const ce_exchange_verdict_t *v = &x->verdict;
  x->req.matched_rule = v->rule_index;
  x->req.matched_kind = v->rule_index >= 0 ? ce_rule_kind_name(v->rule_kind) : NULL;
  if (v->decision == CE_DECISION_DECIDE && v->rule_index >= 0) {
    x->decide_rule = v->rule_index;
    ask(x);
    return;
  }
  if (v->decision == CE_DECISION_ALLOW) {
    set_state(x, CE_EXCHANGE_ALLOWED);
    x->ops->forward(x);
    return;
  }
  const char *reason = v->decision == CE_DECISION_DENY ? ce_reason_name(v->reason) : "decider_error";
  char who[CE_EXCHANGE_DENY_WHO_MAX];
  if (v->rule_index >= 0)
    snprintf(who, sizeof(who), "rule %d (%s)", (int)v->rule_index, ce_rule_kind_name(v->rule_kind));
  else
    snprintf(who, sizeof(who), "the policy default");
  deny(x, who, reason);
}

void ce_exchange_body(ce_exchange_t *x, bool final) {
  if (x->state != CE_EXCHANGE_PREVIEWING)
    return;
  if (!x->ops->preview(x, final || mono_ms() >= x->preview_until))
    return;
  x->previewed = true;
  trace(x, "the question carries %zu body bytes", x->req.body_preview_len);
  ask(x);
}

bool ce_exchange_resume(ce_exchange_t *x) {
  if (x->state != CE_EXCHANGE_WAITING)
    return false;
  if (x->asks != NULL && x->asks->out >= x->asks->max)
    return false;
  ask(x);
  return true;
}
