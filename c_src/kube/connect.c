/*
 * Reaching the API server (internal.h): the server's name is resolved
 * here, not by libwebsockets, and each address is tried in turn.
 *
 * libwebsockets 4.1 connects to the first address its resolver returns
 * and gives up when that one fails; `localhost` resolves to ::1 first on
 * Debian, so a server that listens on 127.0.0.1 only was never reached.
 * Here every address (at most CE__KUBE_ADDRS_MAX, in the resolver's
 * order) gets an attempt of its own, one wsi given the address as an IP
 * literal, under CE_KUBE_CONNECT_ATTEMPT_MS. An attempt that fails before
 * the server was reached (refused, unreachable, reset, no TLS handshake
 * started in time) moves on to the next address; once the server was
 * reached (its certificate came, or it answered) what happens is final,
 * so a request is never sent twice. The Host header, the SNI and the
 * certificate check keep the server's name whatever address was dialled.
 * When every address failed, the error names the host and what each
 * attempt said.
 */
#include "kube/internal.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"

static void on_attempt_timer(uv_timer_t *t);

static bool tls_like(const char *w) {
  return strstr(w, "SSL") != NULL || strstr(w, "ssl") != NULL || strstr(w, "tls") != NULL ||
         strstr(w, "TLS") != NULL;
}

static void tried_add(conn_t *cn, const char *why) {
  size_t n = strlen(cn->tried);
  if (n + 1 < sizeof(cn->tried))
    snprintf(cn->tried + n, sizeof(cn->tried) - n, "%s%s: %s", n > 0 ? "; " : "",
             cn->addr_text, why);
}

static void attempt(conn_t *cn) {
  const struct sockaddr *sa = (const struct sockaddr *)&cn->addrs[cn->addr_i];
  const void *ip = sa->sa_family == AF_INET6
                       ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                       : (const void *)&((const struct sockaddr_in *)sa)->sin_addr;
  if (inet_ntop(sa->sa_family, ip, cn->addr_text, sizeof(cn->addr_text)) == NULL)
    snprintf(cn->addr_text, sizeof(cn->addr_text), "?");
  ce__kube_conn_stage(cn, KC_CONNECTING);
  uv_timer_start(&cn->attempt, on_attempt_timer, CE_KUBE_CONNECT_ATTEMPT_MS, 0);
  ce__kube_conn_connect(cn, cn->addr_text);
}

bool ce__kube_connect_failed(conn_t *cn, const char *why) {
  uv_timer_stop(&cn->attempt);
  tried_add(cn, why);
  if (cn->wsi != NULL) {
    /* libwebsockets ends this wsi; its last callbacks find no conn. */
    lws_set_opaque_user_data(cn->wsi, NULL);
    cn->wsi = NULL;
  }
  if (!cn->finished && cn->k != NULL && cn->addr_i + 1 < cn->n_addrs) {
    cn->addr_i++;
    ce__kube_conn_stage(cn, KC_NEXT);
    /* Not from inside libwebsockets' callback: the next turn of the loop. */
    uv_timer_start(&cn->attempt, on_attempt_timer, 0, 0);
    return true;
  }
  if (!cn->finished) {
    char s[CE__KUBE_SHOWN_MAX];
    ce__kube_conn_finish(cn, tls_like(why) ? CE_ETLS : CE_EUNAVAIL,
                         "%s: cannot connect to \"%s\": %s",
                         cn->k != NULL ? cn->k->cfg.server : "?",
                         cn->k != NULL ? ce__kube_shown(s, cn->k->cfg.host) : "?", cn->tried);
  }
  return false;
}

void ce__kube_connect_reached(conn_t *cn) {
  uv_timer_stop(&cn->attempt);
  ce__kube_conn_stage(cn, KC_OPEN);
}

static void on_attempt_timer(uv_timer_t *t) {
  conn_t *cn = t->data;
  if (cn->stage == KC_NEXT) {
    if (cn->finished || cn->k == NULL)
      ce__kube_conn_fail_early(cn, CE_ECLOSED, "kube: the handle was closed");
    else
      attempt(cn);
    return;
  }
  if (cn->stage != KC_CONNECTING)
    return;
  /* Killed now, not asynchronously: libwebsockets 4.1 would leave the
   * connecting wsi's libuv poll handle open. Its last callbacks find no
   * conn. */
  struct lws *old = cn->wsi;
  if (old != NULL) {
    lws_set_opaque_user_data(old, NULL);
    cn->wsi = NULL;
    lws_set_timeout(old, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_SYNC);
  }
  char why[64];
  snprintf(why, sizeof(why), "no connection within %u ms", CE_KUBE_CONNECT_ATTEMPT_MS);
  if (!ce__kube_connect_failed(cn, why)) {
    if (cn->kind == K_TUNNEL) {
      cn->failed = true;
      ce__kube_tunnel_close_local(cn);
    }
    ce__kube_conn_lws_gone(cn);
  }
}

static bool same_addr(const struct sockaddr_storage *a, const struct addrinfo *ai) {
  return a->ss_family == ai->ai_family && memcmp(a, ai->ai_addr, ai->ai_addrlen) == 0;
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  conn_t *cn = req->data;
  cn->gai_busy = false;
  cn->handles--;
  if (cn->stage != KC_RESOLVING) {
    /* Ended meanwhile (the handle closed): the conn may go now. */
    uv_freeaddrinfo(res);
    ce__kube_conn_maybe_free(cn);
    return;
  }
  if (cn->finished || cn->k == NULL) {
    uv_freeaddrinfo(res);
    ce__kube_conn_fail_early(cn, CE_ECLOSED, "kube: the handle was closed");
    return;
  }
  char s[CE__KUBE_SHOWN_MAX], msg[CE_KUBE_MSG_MAX];
  const ce_kube_config_t *cfg = &cn->k->cfg;
  if (status < 0) {
    snprintf(msg, sizeof(msg), "%s: cannot resolve \"%s\": %s", cfg->server,
             ce__kube_shown(s, cfg->host), uv_strerror(status));
    ce__kube_conn_fail_early(cn, CE_EUNAVAIL, msg);
    return;
  }
  cn->n_addrs = 0;
  for (const struct addrinfo *ai = res; ai != NULL && cn->n_addrs < CE__KUBE_ADDRS_MAX;
       ai = ai->ai_next) {
    if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) ||
        ai->ai_addrlen > sizeof(cn->addrs[0]))
      continue;
    bool seen = false;
    for (size_t i = 0; i < cn->n_addrs && !seen; i++)
      seen = same_addr(&cn->addrs[i], ai);
    if (seen)
      continue;
    memset(&cn->addrs[cn->n_addrs], 0, sizeof(cn->addrs[0]));
    memcpy(&cn->addrs[cn->n_addrs], ai->ai_addr, ai->ai_addrlen);
    cn->n_addrs++;
  }
  uv_freeaddrinfo(res);
  if (cn->n_addrs == 0) {
    snprintf(msg, sizeof(msg), "%s: \"%s\" has no IPv4 or IPv6 address", cfg->server,
             ce__kube_shown(s, cfg->host));
    ce__kube_conn_fail_early(cn, CE_EUNAVAIL, msg);
    return;
  }
  cn->addr_i = 0;
  attempt(cn);
}

void ce__kube_connect_start(conn_t *cn) {
  const ce_kube_config_t *cfg = &cn->k->cfg;
  char port[8];
  snprintf(port, sizeof(port), "%u", (unsigned)cfg->port);
  /* No AI_ADDRCONFIG: it ignores loopback, and a namespace with only lo
   * would then resolve localhost to nothing. */
  struct addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  ce__kube_conn_stage(cn, KC_RESOLVING);
  cn->tried[0] = '\0';
  cn->gai_busy = true;
  cn->handles++;
  int rc = uv_getaddrinfo(cn->k->c->loop, &cn->gai, on_resolved, cfg->host, port, &hints);
  if (rc != 0) {
    cn->gai_busy = false;
    cn->handles--;
    char s[CE__KUBE_SHOWN_MAX], msg[CE_KUBE_MSG_MAX];
    snprintf(msg, sizeof(msg), "%s: cannot resolve \"%s\": %s", cfg->server,
             ce__kube_shown(s, cfg->host), uv_strerror(rc));
    ce__kube_conn_fail_early(cn, CE_EUNAVAIL, msg);
  }
}
