/*
 * The Kubernetes client's credentials (internal.h): the bearer token of
 * each operation, from the kubeconfig, from a token file (re-read when it
 * changes), or from an exec plugin (client-go's ExecCredential protocol,
 * run with uv_spawn in a process group of its own, bounded in time and
 * output). Operations that need a plugin's credential wait on
 * k->waiting (stage KC_CRED) while one run of the plugin serves them all;
 * a credential the server refuses (401) is fetched again, once.
 */
#include "kube/internal.h"

#include <errno.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/text.h"

extern char **environ;

/* An exec credential is renewed this long before it expires. */
#define CRED_SLACK_S 10

struct plugin {
  ce_kube_t *k;
  uv_process_t proc;
  uv_pipe_t out, err;
  uv_timer_t timer;
  int handles;
  int pending;          /* exit and two EOFs */
  bool timed_out, spawned, exited;
  int64_t exit_status;
  int term_signal;
  buf_t o, e;
  bool too_big;
};


/* Re-reads a token file when its modification time changed. */
static int load_token_file(ce_kube_t *k, char *err, size_t errlen) {
  struct stat st;
  char s[CE__KUBE_SHOWN_MAX];
  if (stat(k->cfg.token_file, &st) != 0)
    return ce__kube_efmt(err, errlen, errno == ENOENT ? CE_ENOENT : CE_EIO,
                         "the token file \"%s\" cannot be read: %s",
                         ce__kube_shown(s, k->cfg.token_file), strerror(errno));
  if (k->token_loaded && st.st_mtim.tv_sec == k->token_mtime.tv_sec &&
      st.st_mtim.tv_nsec == k->token_mtime.tv_nsec)
    return CE_OK;
  char *data = NULL;
  size_t n = 0;
  char why[2 * CE__KUBE_SHOWN_MAX];
  int rc = ce_kube_read_file(k->cfg.token_file, 64 * 1024, &data, &n, why, sizeof(why));
  if (rc != CE_OK)
    return ce__kube_efmt(err, errlen, rc, "the token file: %s", why);
  while (n > 0 && (data[n - 1] == '\n' || data[n - 1] == '\r' || data[n - 1] == ' '))
    data[--n] = '\0';
  if (!ce_kube_token_ok(data, n)) {
    OPENSSL_clear_free(data, n + 1);
    return ce__kube_efmt(err, errlen, CE_EINVAL,
                         "the token file \"%s\" holds no token (one line of printable ASCII "
                         "without spaces)",
                         ce__kube_shown(s, k->cfg.token_file));
  }
  if (k->token != NULL)
    OPENSSL_clear_free(k->token, strlen(k->token));
  k->token = data;
  k->token_mtime = st.st_mtim;
  k->token_loaded = true;
  return CE_OK;
}

static bool cred_fresh(ce_kube_t *k) {
  if (!k->cred_valid)
    return false;
  return !k->cred.expires || time(NULL) + CRED_SLACK_S < k->cred.expiry;
}

static void plugin_start(ce_kube_t *k);
static void plugin_kill(plugin_t *pl);
static void plugin_close(plugin_t *pl);

/* Credentials are at hand: connect (or fail). */
static void conn_go(conn_t *cn) {
  ce_kube_t *k = cn->k;
  char err[CE_KUBE_MSG_MAX];
  if (k->cfg.auth == CE_KUBE_AUTH_TOKEN_FILE) {
    int rc = load_token_file(k, err, sizeof(err));
    if (rc != CE_OK) {
      ce__kube_conn_fail_early(cn, rc, err);
      return;
    }
  }
  const char *tok = NULL;
  if (k->cfg.auth == CE_KUBE_AUTH_TOKEN)
    tok = k->cfg.token;
  else if (k->cfg.auth == CE_KUBE_AUTH_TOKEN_FILE)
    tok = k->token;
  else if (k->cfg.auth == CE_KUBE_AUTH_EXEC)
    tok = k->cred.token;
  if (tok != NULL) {
    cn->bearer = strdup(tok);
    if (cn->bearer == NULL) {
      ce__kube_conn_fail_early(cn, CE_ENOMEM, "out of memory");
      return;
    }
  }
  ce__kube_connect_start(cn);
}

void ce__kube_conn_start(conn_t *cn) {
  ce_kube_t *k = cn->k;
  ce__kube_conn_arm(cn);
  if (k->cfg.auth != CE_KUBE_AUTH_EXEC || cred_fresh(k)) {
    conn_go(cn);
    return;
  }
  ce__kube_conn_stage(cn, KC_CRED);
  cn->wnext = NULL;
  if (k->waiting_tail != NULL)
    k->waiting_tail->wnext = cn;
  else
    k->waiting = cn;
  k->waiting_tail = cn;
  if (k->plugin == NULL)
    plugin_start(k);
}

/* Runs (or fails) every conn waiting for credentials. */
static void waiting_release(ce_kube_t *k, int code, const char *msg) {
  conn_t *w = k->waiting;
  k->waiting = k->waiting_tail = NULL;
  while (w != NULL) {
    conn_t *nx = w->wnext;
    if (w->finished) /* timed out meanwhile */
      ce__kube_conn_lws_gone(w);
    else if (code == CE_OK)
      conn_go(w);
    else
      ce__kube_conn_fail_early(w, code, msg);
    w = nx;
  }
}

void ce__kube_retry_after_401(conn_t *cn) {
  ce_kube_t *k = cn->k;
  conn_t *nc = ce__kube_conn_new(k, cn->kind);
  if (nc == NULL) {
    ce__kube_conn_finish(cn, CE_ENOMEM, "out of memory");
    return;
  }
  /* The request moves to the new conn; the old one ends silently. */
  nc->try = TRY_RETRY;
  nc->hcb = cn->hcb;
  nc->harg = cn->harg;
  nc->ecb = cn->ecb;
  nc->earg = cn->earg;
  memcpy(nc->method, cn->method, sizeof(nc->method));
  nc->url = cn->url;
  cn->url = NULL;
  nc->body = cn->body;
  nc->body_len = cn->body_len;
  cn->body = NULL;
  nc->ctype = cn->ctype;
  cn->ctype = NULL;
  nc->stdin_data = cn->stdin_data;
  nc->stdin_len = cn->stdin_len;
  nc->stdin_state = cn->stdin_state;
  cn->stdin_data = NULL;
  nc->max_output = cn->max_output;
  nc->timeout_ms = cn->timeout_ms;
  ce__kube_conn_drop(cn);
  /* The credential was refused: run the plugin again, once. */
  if (k->cred_valid) {
    ce_kube_cred_free(&k->cred);
    k->cred_valid = false;
  }
  ce__kube_conn_start(nc);
}

static void on_plugin_closed(uv_handle_t *h) {
  plugin_t *pl = h->data;
  if (--pl->handles == 0) {
    ce__kube_buf_free(&pl->o);
    if (pl->e.p != NULL)
      OPENSSL_cleanse(pl->e.p, pl->e.n);
    ce__kube_buf_free(&pl->e);
    free(pl);
  }
}

/* SIGKILL to the plugin's process group (it runs in a session of its
 * own): what it left running goes too. */
static void plugin_kill(plugin_t *pl) {
  if (pl->spawned && pl->proc.pid > 0)
    kill(-pl->proc.pid, SIGKILL);
}

/* Closes the pipes and the timer; the process handle only once the
 * plugin was reaped (on_plugin_exit closes it otherwise: closing it
 * earlier would leave a zombie). */
static void plugin_close(plugin_t *pl) {
  if (pl->spawned && pl->exited && !uv_is_closing((uv_handle_t *)&pl->proc))
    uv_close((uv_handle_t *)&pl->proc, on_plugin_closed);
  uv_handle_t *hs[] = {(uv_handle_t *)&pl->out, (uv_handle_t *)&pl->err,
                       (uv_handle_t *)&pl->timer};
  for (size_t i = 0; i < 3; i++)
    if (!uv_is_closing(hs[i]))
      uv_close(hs[i], on_plugin_closed);
}

/* Installs a new credential; a client certificate needs a new vhost. */
static int cred_install(ce_kube_t *k, ce_kube_cred_t *cred, char *err, size_t errlen) {
  if (cred->cert_pem != NULL) {
    bool same = k->cred_valid && k->cred.cert_pem != NULL &&
                strcmp(k->cred.cert_pem, cred->cert_pem) == 0 &&
                strcmp(k->cred.key_pem, cred->key_pem) == 0;
    if (!same) {
      vhost_t *old = realloc(k->old_vh, (k->n_old_vh + 1) * sizeof(*old));
      if (old == NULL)
        return ce__kube_efmt(err, errlen, CE_ENOMEM, "out of memory");
      k->old_vh = old;
      vhost_t v;
      int rc = ce__kube_make_vhost(k, cred->cert_pem, cred->cert_len, cred->key_pem,
                                   cred->key_len, &v, err, errlen);
      if (rc != CE_OK)
        return rc;
      /* Connections may still run on the old vhost: it goes at close. */
      k->old_vh[k->n_old_vh++] = k->vh;
      k->vh = v;
    }
  }
  if (k->cred_valid)
    ce_kube_cred_free(&k->cred);
  k->cred = *cred;
  memset(cred, 0, sizeof(*cred));
  k->cred_valid = true;
  return CE_OK;
}

static void plugin_done(plugin_t *pl) {
  ce_kube_t *k = pl->k;
  char err[CE_KUBE_MSG_MAX];
  int rc = CE_OK;
  char s[CE__KUBE_SHOWN_MAX], e[CE__KUBE_SHOWN_MAX];
  ce__kube_shown(s, k->cfg.exec.argv[0]);
  ce_text_sanitize(e, sizeof(e), pl->e.p != NULL ? pl->e.p : "", pl->e.n, 0);
  if (pl->timed_out)
    rc = ce__kube_efmt(err, sizeof(err), CE_ETIMEDOUT, "exec plugin \"%s\" ran over %u ms", s,
                       CE_KUBE_PLUGIN_TIMEOUT_MS);
  else if (pl->too_big)
    rc = ce__kube_efmt(err, sizeof(err), CE_ETOOBIG, "exec plugin \"%s\" wrote over %u bytes", s,
                       CE_KUBE_PLUGIN_OUTPUT_MAX);
  else if (pl->term_signal != 0 || pl->exit_status != 0)
    rc = ce__kube_efmt(err, sizeof(err), CE_EPERM, "exec plugin \"%s\" failed (%s %d): %s", s,
                       pl->term_signal != 0 ? "signal" : "exit status",
                       pl->term_signal != 0 ? pl->term_signal : (int)pl->exit_status, e);
  if (rc == CE_OK) {
    ce_kube_cred_t cred;
    char why[256];
    rc = ce_kube_cred_parse(pl->o.p != NULL ? pl->o.p : "", pl->o.n, k->cfg.exec.api_version,
                            &cred, why, sizeof(why));
    if (rc != CE_OK)
      ce__kube_efmt(err, sizeof(err), rc, "exec plugin \"%s\": %s", s, why);
    else
      rc = cred_install(k, &cred, err, sizeof(err));
    ce_kube_cred_free(&cred);
  }
  if (pl->o.p != NULL)
    OPENSSL_cleanse(pl->o.p, pl->o.n);
  k->plugin = NULL;
  pl->k = NULL;
  plugin_close(pl);
  waiting_release(k, rc, err);
}

static void on_plugin_timeout(uv_timer_t *t);

static void plugin_step(plugin_t *pl) {
  if (--pl->pending == 0 && pl->k != NULL)
    plugin_done(pl);
}

static void on_plugin_exit(uv_process_t *proc, int64_t status, int sig) {
  plugin_t *pl = proc->data;
  pl->exited = true;
  if (pl->k == NULL) {
    /* Abandoned (its handle was closed): reaped now, the handle goes. */
    uv_close((uv_handle_t *)&pl->proc, on_plugin_closed);
    return;
  }
  pl->exit_status = status;
  pl->term_signal = sig;
  /* Something it started may still hold its stdout or stderr: the EOFs
   * get a short grace, then what came is what there is. */
  if (pl->pending > 1)
    uv_timer_start(&pl->timer, on_plugin_timeout, CE_KUBE_PLUGIN_GRACE_MS, 0);
  plugin_step(pl);
}

static void on_plugin_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  static char chunk[65536];
  *b = uv_buf_init(chunk, sizeof(chunk));
}

static void on_plugin_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  plugin_t *pl = s->data;
  bool is_out = s == (uv_stream_t *)&pl->out;
  if (n > 0) {
    buf_t *into = is_out ? &pl->o : &pl->e;
    size_t max = is_out ? CE_KUBE_PLUGIN_OUTPUT_MAX : 4096;
    if (into->n + (size_t)n > max) {
      if (is_out)
        pl->too_big = true;
      n = (ssize_t)(max - into->n);
    }
    if (n > 0 && !ce__kube_buf_add(into, b->base, (size_t)n) && is_out)
      pl->too_big = true;
    return;
  }
  if (n < 0) {
    uv_read_stop(s);
    plugin_step(pl);
  }
}

static void on_plugin_timeout(uv_timer_t *t) {
  plugin_t *pl = t->data;
  if (pl->k == NULL)
    return;
  if (!pl->exited) {
    /* Over its time: the whole group is killed; the exit follows. */
    pl->timed_out = true;
    plugin_kill(pl);
    return;
  }
  /* Exited, and the grace for the EOFs is over: what is left of the
   * group goes, the pipes are closed by plugin_done(). */
  plugin_kill(pl);
  uv_read_stop((uv_stream_t *)&pl->out);
  uv_read_stop((uv_stream_t *)&pl->err);
  pl->pending = 1;
  plugin_step(pl);
}

/* KUBERNETES_EXEC_INFO, as client-go writes it. */
static char *exec_info(ce_kube_t *k) {
  json_t *spec = json_pack("{s:b}", "interactive", 0);
  if (spec != NULL && k->cfg.exec.provide_cluster_info) {
    json_t *cl = json_pack("{s:s, s:b}", "server", k->cfg.server,
                           "insecure-skip-tls-verify", k->cfg.insecure);
    if (cl != NULL && k->cfg.ca_pem != NULL) {
      size_t bl = 4 * ((k->cfg.ca_len + 2) / 3) + 1;
      unsigned char *b = malloc(bl);
      if (b != NULL) {
        EVP_EncodeBlock(b, (const unsigned char *)k->cfg.ca_pem, (int)k->cfg.ca_len);
        json_object_set_new(cl, "certificate-authority-data", json_string((char *)b));
        free(b);
      }
    }
    if (cl != NULL && k->cfg.tls_server_name != NULL)
      json_object_set_new(cl, "tls-server-name", json_string(k->cfg.tls_server_name));
    json_object_set_new(spec, "cluster", cl);
  }
  json_t *root = json_pack("{s:s, s:s, s:o}", "apiVersion", k->cfg.exec.api_version, "kind",
                           "ExecCredential", "spec", spec);
  char *s = root != NULL ? json_dumps(root, JSON_COMPACT) : NULL;
  json_decref(root);
  return s;
}

static void plugin_start(ce_kube_t *k) {
  char err[CE_KUBE_MSG_MAX];
  plugin_t *pl = calloc(1, sizeof(*pl));
  char *info = exec_info(k);
  size_t nenv = 0;
  for (char **e = environ; e != NULL && *e != NULL; e++)
    nenv++;
  char **env = calloc(nenv + k->cfg.exec.envc + 2, sizeof(char *));
  char *info_kv = NULL;
  if (pl == NULL || info == NULL || env == NULL) {
    free(pl);
    free(info);
    free(env);
    waiting_release(k, CE_ENOMEM, "out of memory starting the exec plugin");
    return;
  }
  size_t ie = strlen(info) + sizeof("KUBERNETES_EXEC_INFO=");
  info_kv = malloc(ie);
  if (info_kv != NULL)
    snprintf(info_kv, ie, "KUBERNETES_EXEC_INFO=%s", info);
  free(info);
  /* The configured env wins over ours, which wins over nothing. */
  size_t m = 0;
  for (size_t i = 0; i < nenv; i++) {
    const char *e = environ[i];
    size_t nl = strcspn(e, "=");
    bool overridden = strncmp(e, "KUBERNETES_EXEC_INFO=", 21) == 0;
    for (size_t j = 0; j < k->cfg.exec.envc && !overridden; j++)
      overridden = strncmp(k->cfg.exec.env[j], e, nl + 1) == 0;
    if (!overridden)
      env[m++] = (char *)e;
  }
  for (size_t j = 0; j < k->cfg.exec.envc; j++)
    env[m++] = k->cfg.exec.env[j];
  if (info_kv != NULL)
    env[m++] = info_kv;
  env[m] = NULL;

  pl->k = k;
  uv_pipe_init(k->c->loop, &pl->out, 0);
  uv_pipe_init(k->c->loop, &pl->err, 0);
  uv_timer_init(k->c->loop, &pl->timer);
  pl->out.data = pl->err.data = pl->timer.data = pl->proc.data = pl;
  pl->handles = 3;
  uv_stdio_container_t stdio[3] = {
      {.flags = UV_IGNORE},
      {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&pl->out},
      {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&pl->err},
  };
  uv_process_options_t po;
  memset(&po, 0, sizeof(po));
  po.exit_cb = on_plugin_exit;
  po.file = k->cfg.exec.argv[0];
  po.args = k->cfg.exec.argv;
  po.env = env;
  po.stdio = stdio;
  po.stdio_count = 3;
  /* A session and process group of its own: a timeout or a closed
   * handle kills the group. */
  po.flags = UV_PROCESS_DETACHED;
  int rc = uv_spawn(k->c->loop, &pl->proc, &po);
  /* The process handle is initialised even when the spawn failed, and
   * must be closed either way. */
  pl->spawned = true;
  pl->handles++;
  free(env);
  if (info_kv != NULL)
    OPENSSL_clear_free(info_kv, strlen(info_kv));
  if (rc != 0) {
    char s[CE__KUBE_SHOWN_MAX];
    pl->exited = true; /* nothing to reap */
    ce__kube_efmt(err, sizeof(err), CE_EPERM, "exec plugin \"%s\" cannot run: %s",
                  ce__kube_shown(s, k->cfg.exec.argv[0]), uv_strerror(rc));
    pl->k = NULL;
    plugin_close(pl);
    waiting_release(k, CE_EPERM, err);
    return;
  }
  pl->pending = 3;
  k->plugin = pl;
  uv_read_start((uv_stream_t *)&pl->out, on_plugin_alloc, on_plugin_read);
  uv_read_start((uv_stream_t *)&pl->err, on_plugin_alloc, on_plugin_read);
  uv_timer_start(&pl->timer, on_plugin_timeout, CE_KUBE_PLUGIN_TIMEOUT_MS, 0);
}


void ce__kube_creds_close(ce_kube_t *k) {
  if (k->plugin != NULL) {
    plugin_t *pl = k->plugin;
    k->plugin = NULL;
    pl->k = NULL;
    if (!pl->exited)
      plugin_kill(pl);
    plugin_close(pl);
  }
  waiting_release(k, CE_ECLOSED, "kube: the handle was closed");
  if (k->token != NULL)
    OPENSSL_clear_free(k->token, strlen(k->token));
  k->token = NULL;
  if (k->cred_valid)
    ce_kube_cred_free(&k->cred);
  k->cred_valid = false;
}
