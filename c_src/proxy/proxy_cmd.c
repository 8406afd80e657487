/*
 * `condukt-egress proxy`: sets up the sidecar (policy, CA, TLS contexts,
 * control channel, listeners, signals) and runs the loop until SIGTERM has
 * drained every connection (docs/proxy.md).
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/error.h"
#include "common/trace.h"
#include "dns/hosts.h"
#include "dns/server.h"
#include "dns/stub.h"
#include "netfilter/ctflush.h"
#include "proxy/conn.h"
#include "proxy/event.h"
#include "proxy/netaddr.h"
#include "proxy/privdrop.h"
#include "proxy/proxy.h"
#include "proxy/stats.h"
#include "tls/bundle.h"
#include "tls/context.h"

#define PROG "condukt-egress proxy"

/* How long SIGTERM waits for busy exchanges before cutting them. */
#define CE_PROXY_DRAIN_MS 10000u
/* A token file is small: hex digits and a newline. */
#define CE_TOKEN_FILE_MAX 1024u

static uv_timer_t drain_timer;
static bool drain_timer_started;

/* ---- decision cache ------------------------------------------------------ */

static size_t slot_of(int32_t rule, const char *host) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t)(uint32_t)rule;
  for (const char *p = host; *p != '\0'; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return (size_t)(h % CE_DECISION_CACHE_SIZE);
}

bool ce_decision_cache_get(ce_proxy_t *p, int32_t rule, const char *host, bool *allow, const char **reason) {
  size_t i = slot_of(rule, host);
  for (size_t n = 0; n < CE_DECISION_CACHE_SIZE; n++, i = (i + 1) % CE_DECISION_CACHE_SIZE) {
    ce_decision_entry_t *e = &p->decisions[i];
    if (!e->used)
      return false;
    if (e->rule_index == rule && strcmp(e->host, host) == 0) {
      *allow = e->allow;
      *reason = e->reason;
      return true;
    }
  }
  return false;
}

void ce_decision_cache_put(ce_proxy_t *p, int32_t rule, const char *host, bool allow, const char *reason) {
  if (strlen(host) > CE_HOST_TEXT_MAX)
    return;
  /* Open addressing stays fast below three quarters full; past that the
   * cache starts over, which only costs a few repeated decider calls. */
  if (p->decision_count >= CE_DECISION_CACHE_SIZE * 3 / 4) {
    memset(p->decisions, 0, CE_DECISION_CACHE_SIZE * sizeof(*p->decisions));
    p->decision_count = 0;
  }
  size_t i = slot_of(rule, host);
  for (;; i = (i + 1) % CE_DECISION_CACHE_SIZE) {
    ce_decision_entry_t *e = &p->decisions[i];
    if (!e->used || (e->rule_index == rule && strcmp(e->host, host) == 0)) {
      if (!e->used)
        p->decision_count++;
      e->used = true;
      e->rule_index = rule;
      e->allow = allow;
      snprintf(e->host, sizeof(e->host), "%s", host);
      snprintf(e->reason, sizeof(e->reason), "%s", reason);
      return;
    }
  }
}

/* ---- lifecycle ----------------------------------------------------------- */

static void on_control_closed(void *data) {
  ce_proxy_t *p = data;
  p->control = NULL;
  uv_stop(p->loop);
}

static void finish_drain(ce_proxy_t *p) {
  if (p->conn_count > 0 || p->control == NULL)
    return;
  if (drain_timer_started && !uv_is_closing((uv_handle_t *)&drain_timer))
    uv_close((uv_handle_t *)&drain_timer, NULL);
  ce_control_t *ctl = p->control;
  ce_control_close(ctl, on_control_closed, p);
}

void ce_proxy_conn_gone(ce_proxy_t *p) {
  p->conn_count--;
  if (p->draining)
    finish_drain(p);
}

static void on_drain_deadline(uv_timer_t *t) {
  ce_proxy_t *p = t->data;
  CE_TRACE_W("proxy", 0, 0, "drain deadline passed with %zu connection(s) busy; closing them",
             p->conn_count);
  ce_conn_abort_all(p);
}

static void begin_drain(ce_proxy_t *p, const char *why) {
  if (p->draining)
    return;
  p->draining = true;
  CE_TRACE_I("proxy", 0, 0, "%s: draining %zu connection(s)", why, p->conn_count);
  for (size_t i = 0; i < p->listener_count; i++)
    uv_close((uv_handle_t *)&p->listeners[i], NULL);
  /* The workspace's resolver stops with the listeners. */
  ce_dns_server_close(p->dns_server);
  p->dns_server = NULL;
  uv_close((uv_handle_t *)&p->sigterm, NULL);
  uv_close((uv_handle_t *)&p->sigint, NULL);
  uv_close((uv_handle_t *)&p->sigpipe, NULL);
  uv_close((uv_handle_t *)&p->sigusr1, NULL);
  ce_conn_drain_all(p);
  uv_timer_init(p->loop, &drain_timer);
  drain_timer.data = p;
  drain_timer_started = true;
  uv_timer_start(&drain_timer, on_drain_deadline, CE_PROXY_DRAIN_MS, 1000);
  finish_drain(p);
}

static void on_signal(uv_signal_t *s, int signum) {
  ce_proxy_t *p = s->data;
  if (signum == SIGPIPE)
    return;
  if (signum == SIGUSR1) {
    /* Whatever the trace level, as "proxy ready" is: it was asked for. */
    ce_buffer_stats_t st;
    char line[256];
    ce_proxy_buffer_stats(p, &st);
    ce_proxy_buffer_stats_text(&st, line, sizeof(line));
    fprintf(stderr, "condukt-egress: %s\n", line);
    return;
  }
  begin_drain(p, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void on_connection(uv_stream_t *listener, int status) {
  ce_proxy_t *p = listener->data;
  if (status < 0) {
    CE_TRACE_E("proxy", 0, 0, "accept failed: %s", uv_strerror(status));
    return;
  }
  ce_conn_accept(p, listener);
}

/* ---- setup --------------------------------------------------------------- */

static int read_token(const char *path, uint8_t *out, size_t cap, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, PROG ": cannot open the token file %s: %s\n", path, strerror(errno));
    return CE_EXIT_FAIL;
  }
  char buf[CE_TOKEN_FILE_MAX + 1];
  size_t n = fread(buf, 1, sizeof(buf), f);
  fclose(f);
  if (n > CE_TOKEN_FILE_MAX) {
    fprintf(stderr, PROG ": the token file %s is larger than %u bytes\n", path, CE_TOKEN_FILE_MAX);
    return CE_EXIT_FAIL;
  }
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
    n--;
  if (n < 32 || n % 2 != 0 || n / 2 > cap) {
    fprintf(stderr, PROG ": the token file %s must hold an even number (32 to %zu) of hex digits\n", path, cap * 2);
    return CE_EXIT_FAIL;
  }
  for (size_t i = 0; i < n; i += 2) {
    int v = 0;
    for (size_t k = 0; k < 2; k++) {
      char ch = buf[i + k];
      int d = (ch >= '0' && ch <= '9') ? ch - '0' : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10 : -1;
      if (d < 0) {
        fprintf(stderr, PROG ": the token file %s holds a character that is not a lowercase hex digit\n", path);
        return CE_EXIT_FAIL;
      }
      v = v * 16 + d;
    }
    out[i / 2] = (uint8_t)v;
  }
  *len = n / 2;
  return CE_EXIT_OK;
}

/* The control channel's "credential" frame: a rotated secret replaces the
 * value of one the policy's credentials name; the next request that gets
 * it carries the new value. A name no credential uses is refused. */
_Static_assert(CE_CONTROL_SECRET_NAME_MAX == CE_CRED_NAME_MAX, "credential frame limits");
_Static_assert(CE_CONTROL_SECRET_VALUE_MAX == CE_CRED_VALUE_MAX, "credential frame limits");

static int on_credential(void *data, const char *name, const char *value, size_t value_len) {
  ce_proxy_t *p = data;
  size_t nl = strlen(name);
  if (p->secrets == NULL || ce_secrets_get(p->secrets, name, nl, &(size_t){0}) == NULL)
    return CE_EINVAL;
  return ce_secrets_set(p->secrets, name, nl, value, value_len);
}

static bool redacted_already(const char *name, size_t len, const void *opts) {
  return ce_header_redacted(name, len, opts);
}

/* The credentials' secrets (docs/credentials.md): read once, before the
 * privileges go; every secret the policy names must have a value. The
 * credentials' headers are redacted in events like Authorization. */
static int load_secrets(ce_proxy_t *p, ce_proxy_options_t *opts) {
  char err[CE_SECRETS_ERROR_MAX];
  if (opts->credentials_path != NULL && ce_secrets_load_file(opts->credentials_path, &p->secrets, err) != 0) {
    fprintf(stderr, PROG ": %s: %s\n", opts->credentials_path, err);
    return CE_EXIT_FAIL;
  }
  if (ce_policy_credential_count(p->policy) > 0 && p->secrets == NULL) {
    fprintf(stderr, PROG ": the policy has credentials: pass their values with --credentials FILE\n");
    return CE_EXIT_FAIL;
  }
  if (ce_secrets_check(p->secrets, p->policy, err) != 0) {
    fprintf(stderr, PROG ": %s: %s\n", opts->credentials_path, err);
    return CE_EXIT_FAIL;
  }
  if (ce_credential_redact_names(p->policy, opts->redact, &opts->redact_count, CE_PROXY_MAX_REDACT, redacted_already,
                                 opts) != 0) {
    fprintf(stderr, PROG ": more than %d headers to redact with the credentials'\n", CE_PROXY_MAX_REDACT);
    return CE_EXIT_FAIL;
  }
  return CE_EXIT_OK;
}

static int start_listeners(ce_proxy_t *p) {
  for (size_t i = 0; i < p->opts->listen_count; i++) {
    const char *text = p->opts->listen[i];
    struct sockaddr_storage *sa = &p->listen_addrs[i];
    if (ce_addr_parse(text, sa) != CE_OK) {
      fprintf(stderr, PROG ": --listen expects ADDRESS:PORT (IPv6 in brackets), got '%s'\n", text);
      return CE_EXIT_USAGE;
    }
    uv_tcp_t *t = &p->listeners[i];
    uv_tcp_init(p->loop, t);
    t->data = p;
    p->listener_count++;
    int rc = uv_tcp_bind(t, (struct sockaddr *)sa, sa->ss_family == AF_INET6 ? UV_TCP_IPV6ONLY : 0);
    if (rc == 0)
      rc = uv_listen((uv_stream_t *)t, 511, on_connection);
    if (rc != 0) {
      fprintf(stderr, PROG ": cannot listen on %s: %s\n", text, uv_strerror(rc));
      return CE_EXIT_FAIL;
    }
  }
  return CE_EXIT_OK;
}

/* The proxy's resolver (docs/dns.md): the static names of --hosts and
 * the upstream resolvers of --dns-upstream, else those of --resolv-conf
 * read now, once. Nothing is read again later: a file the workspace can
 * write (a shared resolv.conf) counts only as it was at start. */
/* The nameservers of a resolv.conf-style file into so (0 when the file
 * is missing or names none). */
static size_t read_resolvers(const char *path, ce_dns_stub_opts_t *so) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return 0;
  char buf[16384];
  size_t n = fread(buf, 1, sizeof(buf), f);
  fclose(f);
  return ce_dns_resolv_conf_parse(buf, n, so);
}

/* Keeps the resolvers read at the first start in --dns-state (a place
 * only the sidecar can write, which outlives a restart of its container),
 * so that a restart never takes them from a resolv.conf the workspace
 * may have rewritten meanwhile. Written whole or not at all (rename). */
static void write_resolvers(const char *path, const ce_dns_stub_opts_t *so) {
  char tmp[PATH_MAX];
  int len = snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = len > 0 && (size_t)len < sizeof(tmp) ? fopen(tmp, "wb") : NULL;
  bool ok = f != NULL;
  for (size_t i = 0; ok && i < so->upstream_count; i++) {
    char text[CE_ADDR_TEXT_MAX];
    ce_addr_text((const struct sockaddr *)&so->upstreams[i], text);
    ok = fprintf(f, "nameserver %s\n", text) > 0;
  }
  if (f != NULL && fclose(f) != 0)
    ok = false;
  if (ok && rename(tmp, path) != 0)
    ok = false;
  if (!ok) {
    fprintf(stderr, PROG ": warning: cannot keep the resolvers in --dns-state %s: %s; a restart reads %s again\n",
            path, strerror(errno), "the resolv.conf");
    unlink(tmp);
  }
}

static int dns_setup(ce_proxy_t *p) {
  const ce_proxy_options_t *o = p->opts;
  char err[CE_HOSTS_ERROR_MAX];
  if (o->hosts_path != NULL && ce_hosts_load_file(o->hosts_path, &p->hosts, err, sizeof(err)) != CE_OK) {
    fprintf(stderr, PROG ": --hosts %s: %s\n", o->hosts_path, err);
    return CE_EXIT_FAIL;
  }
  ce_dns_stub_opts_t so;
  memset(&so, 0, sizeof(so));
  so.hosts = p->hosts;
  so.mark = o->mark;
  if (o->dns_upstream_count > 0) {
    for (size_t i = 0; i < o->dns_upstream_count; i++)
      so.upstreams[i] = o->dns_upstreams[i];
    so.upstream_count = o->dns_upstream_count;
  } else if (o->dns_state_path != NULL && read_resolvers(o->dns_state_path, &so) > 0) {
    CE_TRACE_I("proxy", 0, 0, "DNS upstreams as kept in %s at the first start", o->dns_state_path);
  } else if (read_resolvers(o->resolv_conf_path, &so) == 0) {
    fprintf(stderr,
            PROG ": warning: no --dns-upstream and no nameserver in %s: only IP literals and the names of "
                 "--hosts resolve\n",
            o->resolv_conf_path);
  } else if (o->dns_state_path != NULL) {
    write_resolvers(o->dns_state_path, &so);
  }
  if (ce_dns_stub_new(p->loop, &so, &p->dns) != CE_OK) {
    fprintf(stderr, PROG ": out of memory\n");
    return CE_EXIT_FAIL;
  }
  for (size_t i = 0; i < so.upstream_count; i++) {
    char text[CE_ADDR_TEXT_MAX];
    ce_addr_text((const struct sockaddr *)&so.upstreams[i], text);
    CE_TRACE_I("proxy", 0, 0, "DNS upstream %s port %u", text,
               (unsigned)ce_addr_port((const struct sockaddr *)&so.upstreams[i]));
  }
  if (o->dns_listen_off)
    return CE_EXIT_OK;
  ce_dns_server_opts_t dso = {
      .listen = o->dns_listen,
      .listen_count = o->dns_listen_count,
      .policy = p->policy,
      .stub = p->dns,
      .control = p->control,
      .next_id = &p->next_request_id,
  };
  char serr[300];
  int rc = ce_dns_server_start(p->loop, &dso, &p->dns_server, serr, sizeof(serr));
  if (rc != CE_OK) {
    fprintf(stderr, PROG ": %s\n", rc == CE_ENOMEM ? "out of memory" : serr);
    return rc == CE_EINVAL ? CE_EXIT_USAGE : CE_EXIT_FAIL;
  }
  for (size_t i = 0; i < o->dns_listen_count; i++)
    CE_TRACE_I("proxy", 0, 0, "the workspace's DNS resolver listens on %s (UDP and TCP)", o->dns_listen[i]);
  return CE_EXIT_OK;
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

int ce_cmd_proxy(int argc, char **argv) {
  ce_proxy_options_t opts;
  int rc = ce_proxy_options_parse(argc, argv, &opts);
  if (rc == -1) {
    ce_proxy_options_free(&opts);
    return CE_EXIT_OK;
  }
  if (rc != CE_EXIT_OK) {
    ce_proxy_options_free(&opts);
    return rc;
  }
  signal(SIGPIPE, SIG_IGN);
  ce_trace_configure(opts.verbose);

  ce_proxy_t proxy;
  memset(&proxy, 0, sizeof(proxy));
  ce_proxy_t *p = &proxy;
  p->opts = &opts;
  int exit_code = CE_EXIT_FAIL;
  char err[512] = "";
  uv_loop_t loop;
  bool loop_ready = false;

  ce_policy_error_t perr;
  if (ce_policy_load_file(opts.policy_path, &p->policy, &perr) != 0) {
    fprintf(stderr, PROG ": %s: %s\n", opts.policy_path, perr.message);
    goto fail;
  }
  if (load_secrets(p, &opts) != CE_EXIT_OK)
    goto fail;
  if (ce_ca_load(opts.ca_cert_path, opts.ca_key_path, &p->ca, err, sizeof(err)) != CE_OK) {
    fprintf(stderr, PROG ": %s\n", err);
    goto fail;
  }
  if (ce_leaf_cache_new(p->ca, 0, &p->leaves) != CE_OK) {
    fprintf(stderr, PROG ": out of memory\n");
    goto fail;
  }
  if (ce_tls_server_ctx_new(&p->server_ctx, err, sizeof(err)) != CE_OK) {
    fprintf(stderr, PROG ": %s\n", err);
    goto fail;
  }
  char bundle_buf[PATH_MAX + 64];
  const char *bundle = opts.trust_bundle_path;
  if (bundle == NULL)
    bundle = ce_trust_default_roots(bundle_buf, sizeof(bundle_buf));
  if (bundle == NULL) {
    fprintf(stderr, PROG ": cannot locate the trust bundle; pass --trust-bundle\n");
    goto fail;
  }
  if (ce_tls_client_ctx_new(bundle, opts.upstream_extra_ca_path, &p->client_ctx, err, sizeof(err)) != CE_OK) {
    fprintf(stderr, PROG ": %s\n", err);
    goto fail;
  }
  uint8_t token[128];
  size_t token_len = 0;
  if (read_token(opts.token_path, token, sizeof(token), &token_len) != CE_EXIT_OK)
    goto fail;
  p->decisions = calloc(CE_DECISION_CACHE_SIZE, sizeof(*p->decisions));
  ce_bufpool_init(&p->inbufs, CE_CONN_INPUT_MAX, CE_CONN_SPARE_INPUTS);
  p->read_buf = malloc(CE_CONN_READ_CHUNK);
  p->head_buf = malloc(CE_CONN_HEAD_OUT_MAX);
  if (p->decisions == NULL || p->read_buf == NULL || p->head_buf == NULL) {
    fprintf(stderr, PROG ": out of memory\n");
    goto fail;
  }

  /* Every file is read; no socket exists yet. From here on the proxy is
   * the sidecar's uid, whose marked sockets alone are exempt
   * (docs/netfilter.md, "The exemption"). */
  if (opts.user != 0 && ce_privdrop(opts.user, err, sizeof(err)) != CE_OK) {
    fprintf(stderr, PROG ": %s\n", err);
    goto fail;
  }

  uv_loop_init(&loop);
  loop_ready = true;
  p->loop = &loop;
  ce_control_opts_t copts = {
      .listen = opts.control,
      .token = token,
      .token_len = token_len,
      .session_id = opts.session_id,
      .stdout_fd = STDOUT_FILENO,
      .on_credential = on_credential,
      .credential_data = p,
  };
  if (ce_control_start(p->loop, &copts, &p->control, err, sizeof(err)) != CE_OK) {
    fprintf(stderr, PROG ": control channel: %s\n", err);
    goto fail;
  }
  /* Before any upstream connection of ours exists: the conntrack entries
   * an earlier run of the proxy left would capture workspace connections
   * from the same source ports (docs/netfilter.md, "Stale conntrack
   * entries"). Not fatal: without it some connections may be refused, but
   * nothing is let through. */
  char cterr[CE_CTFLUSH_ERR_MAX];
  if (ce_ctflush_mark(opts.mark, cterr, sizeof(cterr)) != CE_OK)
    fprintf(stderr,
            PROG ": warning: cannot delete the conntrack entries left by earlier upstream connections "
                 "(connection mark 0x%x): %s; until they expire, a workspace connection from one of their "
                 "source ports is refused\n",
            (unsigned)opts.mark, cterr);
  else
    CE_TRACE_I("proxy", 0, 0, "deleted the conntrack entries with connection mark 0x%x", (unsigned)opts.mark);
  rc = dns_setup(p);
  if (rc != CE_EXIT_OK) {
    exit_code = rc;
    goto fail;
  }
  rc = start_listeners(p);
  if (rc != CE_EXIT_OK) {
    exit_code = rc;
    goto fail;
  }
  uv_signal_init(p->loop, &p->sigterm);
  uv_signal_init(p->loop, &p->sigint);
  uv_signal_init(p->loop, &p->sigpipe);
  uv_signal_init(p->loop, &p->sigusr1);
  p->sigterm.data = p->sigint.data = p->sigpipe.data = p->sigusr1.data = p;
  uv_signal_start(&p->sigterm, on_signal, SIGTERM);
  uv_signal_start(&p->sigint, on_signal, SIGINT);
  uv_signal_start(&p->sigpipe, on_signal, SIGPIPE);
  uv_signal_start(&p->sigusr1, on_signal, SIGUSR1);

  /* "proxy ready" and "drained, exiting" are not traces but the start and
   * end markers test/support/netns/sidecar.ex waits for: written whatever
   * the trace level, and byte for byte as they are. */
  fprintf(stderr, "condukt-egress: proxy ready (session %s, %zu listener(s), control %s)\n", opts.session_id,
          p->listener_count, opts.control);
  uv_run(p->loop, UV_RUN_DEFAULT);
  exit_code = CE_EXIT_OK;
  fprintf(stderr, "condukt-egress: drained, exiting\n");

fail:
  if (loop_ready) {
    /* The server first: its queries end when the stub closes. */
    ce_dns_server_close(p->dns_server);
    p->dns_server = NULL;
    ce_dns_stub_close(p->dns);
    p->dns = NULL;
    if (p->control != NULL) {
      ce_control_close(p->control, on_control_closed, p);
      uv_run(p->loop, UV_RUN_DEFAULT);
    }
    ce_conn_writes_close(p);
    uv_walk(p->loop, close_walk, NULL);
    uv_run(p->loop, UV_RUN_DEFAULT);
    uv_loop_close(p->loop);
  }
  free(p->decisions);
  free(p->read_buf);
  free(p->head_buf);
  ce_bufpool_clear(&p->inbufs);
  ce_bufpool_clear(&p->recbufs);
  SSL_CTX_free(p->client_ctx);
  SSL_CTX_free(p->server_ctx);
  ce_leaf_cache_free(p->leaves);
  ce_ca_free(p->ca);
  ce_policy_free(p->policy);
  ce_secrets_free(p->secrets);
  ce_hosts_free(p->hosts);
  ce_proxy_options_free(&opts);
  return exit_code;
}
