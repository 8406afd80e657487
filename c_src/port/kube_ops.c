/*
 * The Kubernetes operations (kube_ops.h): term decoding and replies.
 * badarg answers a term of the wrong type or shape (a missing key, an
 * unknown key, a binary where a list belongs), inval a value out of range
 * or refused by the loader (a bad kubeconfig, a non-loopback listener).
 */
#include "port/kube_ops.h"

#include <ei.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/text.h"
#include "control/listen.h"
#include "kube/client.h"
#include "kube/config.h"
#include "port/etf.h"
#include "port/json_term.h"

#define BADARG(...) ce__port_reply_error(p, id, CE__PORT_BADARG, __VA_ARGS__)
#define INVAL(...) ce__port_reply_error(p, id, CE_EINVAL, __VA_ARGS__)
#define KEY_MAX 32
#define PATH_MAX_ 4000u
#define NAME_MAX_ 253u
#define ARGV_MAX 1024u
#define SHOWN_MAX (4 * CE_TEXT_QUOTE_MAX + 8)

static const char *shown(char *dst, const char *s, size_t n) {
  ce_text_sanitize(dst, SHOWN_MAX, s, n, 1);
  return dst;
}

static ce_kube_client_t *client(ce_port_t *p) {
  if (p->kube_stopped)
    return NULL;
  if (p->kube == NULL)
    p->kube = ce_kube_client_new(p->loop);
  return p->kube;
}

void ce__kube_stop(ce_port_t *p) {
  if (p->kube != NULL && !p->kube_stopped)
    ce_kube_client_destroy(p->kube);
  p->kube_stopped = true;
}

void ce__kube_free(ce_port_t *p) {
  ce_kube_client_free(p->kube);
  p->kube = NULL;
}

/* ---- readers -------------------------------------------------------------------------- */

static bool alnum_lower(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

/* A DNS-1123 label of s[0..n): 1..63 of [a-z0-9-], alphanumeric at both
 * ends. */
static bool dns_label(const char *s, size_t n) {
  if (n == 0 || n > 63 || !alnum_lower(s[0]) || !alnum_lower(s[n - 1]))
    return false;
  for (size_t k = 0; k < n; k++)
    if (!alnum_lower(s[k]) && s[k] != '-')
      return false;
  return true;
}

/* Namespaces and containers are DNS-1123 labels; pods DNS-1123
 * subdomains (labels joined by '.', at most 253): never "." or "..", so
 * a name cannot climb the URL path. */
static bool k8s_name(const char *s, bool subdomain) {
  size_t n = strlen(s);
  if (!subdomain)
    return dns_label(s, n);
  if (n == 0 || n > NAME_MAX_)
    return false;
  for (const char *p = s;;) {
    const char *dot = strchr(p, '.');
    size_t l = dot != NULL ? (size_t)(dot - p) : strlen(p);
    if (!dns_label(p, l))
      return false;
    if (dot == NULL)
      return true;
    p = dot + 1;
  }
}

static bool read_kube(ce_port_t *p, const char *buf, int *i, uint64_t id, const char *op,
                      ce_kube_t **k) {
  uint64_t h = 0;
  if (!ce_etf_u64(buf, i, &h) || h == 0) {
    BADARG("%s: Kube must be a positive integer", op);
    return false;
  }
  *k = p->kube != NULL && !p->kube_stopped ? ce_kube_find(p->kube, h) : NULL;
  if (*k == NULL) {
    ce__port_reply_error(p, id, CE_ECLOSED, "%s: no open Kubernetes handle %llu", op,
                         (unsigned long long)h);
    return false;
  }
  return true;
}

static int enc_opt_text(ei_x_buff *x, const char *s) {
  return s != NULL ? ce_etf_encode_text(x, s) : ei_x_encode_atom(x, "nil");
}

/* A reply over the port's packet limit would be dropped by
 * ce__port_send() and the caller left waiting: it is toobig instead. */
static void send_reply(ce_port_t *p, uint64_t id, ei_x_buff *x, const char *op) {
  if ((size_t)x->index > CE_PORT_MAX_PACKET) {
    long n = x->index;
    ei_x_free(x);
    ce__port_reply_error(p, id, CE_ETOOBIG,
                         "%s: the reply would be %ld bytes, over the port's %u-byte packet "
                         "limit",
                         op, n, CE_PORT_MAX_PACKET);
    return;
  }
  ce__port_send(p, x);
}

/* ---- kube_open ------------------------------------------------------------------------ */

typedef struct {
  char source[16];
  char *paths[CE_KUBE_CONFIG_PATHS_MAX];
  size_t npaths;
  bool has_paths;
  char *context, *dir, *host, *server, *token, *token_file;
  char *ca_pem, *cert_pem, *key_pem;
  size_t ca_len, cert_len, key_len;
  uint64_t port;
  bool has_port, insecure;
} open_opts_t;

static void open_opts_free(open_opts_t *o) {
  for (size_t k = 0; k < o->npaths; k++)
    free(o->paths[k]);
  free(o->context);
  free(o->dir);
  free(o->host);
  free(o->server);
  if (o->token != NULL)
    OPENSSL_clear_free(o->token, strlen(o->token));
  free(o->token_file);
  free(o->ca_pem);
  free(o->cert_pem);
  if (o->key_pem != NULL)
    OPENSSL_clear_free(o->key_pem, o->key_len);
}

/* A binary copied with its length (PEM may be anything but empty). */
static char *read_blob(const char *buf, int *i, size_t *len) {
  const char *s = NULL;
  size_t n = 0;
  if (!ce_etf_binary(buf, i, &s, &n) || n == 0 || n > CE_KUBE_SECRET_FILE_MAX)
    return NULL;
  char *c = malloc(n + 1);
  if (c == NULL)
    return NULL;
  memcpy(c, s, n);
  c[n] = '\0';
  *len = n;
  return c;
}

static bool open_decode(ce_port_t *p, const char *buf, int i, uint64_t id, open_opts_t *o) {
  int pairs = 0;
  if (!ce_etf_map(buf, &i, &pairs)) {
    BADARG("kube_open: KubeOpts must be a map");
    return false;
  }
  for (int k = 0; k < pairs; k++) {
    char name[KEY_MAX];
    if (!ce_etf_key(buf, &i, name, sizeof name)) {
      BADARG("kube_open: KubeOpts keys must be atoms or binaries naming an option");
      return false;
    }
    char **str = NULL;
    size_t max = PATH_MAX_;
    if (strcmp(name, "source") == 0) {
      char atom[CE_ETF_ATOM_MAX];
      if (!ce_etf_atom(buf, &i, atom) ||
          (strcmp(atom, "kubeconfig") != 0 && strcmp(atom, "in_cluster") != 0 &&
           strcmp(atom, "explicit") != 0)) {
        BADARG("kube_open: source must be kubeconfig, in_cluster or explicit");
        return false;
      }
      snprintf(o->source, sizeof(o->source), "%.15s", atom);
      continue;
    } else if (strcmp(name, "paths") == 0) {
      int arity = 0;
      if (ei_decode_list_header(buf, &i, &arity) != 0 || arity < 1 ||
          (size_t)arity > CE_KUBE_CONFIG_PATHS_MAX) {
        BADARG("kube_open: paths must be a list of 1 to %u binaries",
               CE_KUBE_CONFIG_PATHS_MAX);
        return false;
      }
      for (size_t j = 0; j < o->npaths; j++)
        free(o->paths[j]);
      o->npaths = 0;
      for (int j = 0; j < arity; j++) {
        char *s = ce_etf_string(buf, &i, PATH_MAX_, NULL);
        if (s == NULL) {
          BADARG("kube_open: paths[%d] must be a binary of 1 to %u bytes without NUL", j,
                 PATH_MAX_);
          return false;
        }
        o->paths[o->npaths++] = s;
      }
      if ((unsigned char)buf[i] != ERL_NIL_EXT) {
        BADARG("kube_open: paths must be a proper list");
        return false;
      }
      i++;
      o->has_paths = true;
      continue;
    } else if (strcmp(name, "insecure") == 0) {
      if (!ce_etf_bool(buf, &i, &o->insecure)) {
        BADARG("kube_open: insecure must be true or false");
        return false;
      }
      continue;
    } else if (strcmp(name, "port") == 0) {
      if (!ce_etf_u64(buf, &i, &o->port)) {
        BADARG("kube_open: port must be an integer from 1 to 65535");
        return false;
      }
      o->has_port = true;
      continue;
    } else if (strcmp(name, "ca_pem") == 0 || strcmp(name, "client_cert_pem") == 0 ||
               strcmp(name, "client_key_pem") == 0) {
      char **slot = name[0] == 'c' && name[1] == 'a'
                        ? &o->ca_pem
                        : (strcmp(name, "client_cert_pem") == 0 ? &o->cert_pem : &o->key_pem);
      size_t *len = slot == &o->ca_pem ? &o->ca_len
                                       : (slot == &o->cert_pem ? &o->cert_len : &o->key_len);
      free(*slot);
      *slot = read_blob(buf, &i, len);
      if (*slot == NULL) {
        BADARG("kube_open: %s must be a non-empty binary of at most %u bytes", name,
               CE_KUBE_SECRET_FILE_MAX);
        return false;
      }
      continue;
    } else if (strcmp(name, "context") == 0) {
      str = &o->context;
      max = 1024;
    } else if (strcmp(name, "dir") == 0) {
      str = &o->dir;
    } else if (strcmp(name, "host") == 0) {
      str = &o->host;
      max = CE_KUBE_HOST_MAX - 1;
    } else if (strcmp(name, "server") == 0) {
      str = &o->server;
      max = 2048;
    } else if (strcmp(name, "token") == 0) {
      str = &o->token;
      max = 65536;
    } else if (strcmp(name, "token_file") == 0) {
      str = &o->token_file;
    } else {
      char s[SHOWN_MAX];
      BADARG("kube_open: unknown option \"%s\"", shown(s, name, strlen(name)));
      return false;
    }
    free(*str);
    *str = ce_etf_string(buf, &i, max, NULL);
    if (*str == NULL) {
      BADARG("kube_open: %s must be a binary of 1 to %zu bytes without NUL", name, max);
      return false;
    }
  }
  if (o->source[0] == '\0') {
    BADARG("kube_open: source is required (kubeconfig, in_cluster or explicit)");
    return false;
  }
  /* Each source takes its own keys only. */
  bool kc = strcmp(o->source, "kubeconfig") == 0, ic = strcmp(o->source, "in_cluster") == 0;
  bool ex = !kc && !ic;
  const char *stray = NULL;
  if (!kc && (o->has_paths || o->context != NULL))
    stray = o->has_paths ? "paths" : "context";
  else if (!ic && (o->dir != NULL || o->host != NULL || o->has_port))
    stray = o->dir != NULL ? "dir" : o->host != NULL ? "host" : "port";
  else if (!ex && (o->server != NULL || o->ca_pem != NULL || o->insecure || o->token != NULL ||
                   o->token_file != NULL || o->cert_pem != NULL || o->key_pem != NULL))
    stray = "server, ca_pem, insecure, token, token_file or client_cert_pem";
  if (stray != NULL) {
    BADARG("kube_open: %s does not apply to source %s", stray, o->source);
    return false;
  }
  if (kc && !o->has_paths) {
    BADARG("kube_open: source kubeconfig needs paths");
    return false;
  }
  if (ex && o->server == NULL) {
    BADARG("kube_open: source explicit needs server");
    return false;
  }
  return true;
}

static int explicit_config(open_opts_t *o, ce_kube_config_t *c, char *err, size_t errlen) {
  memset(c, 0, sizeof(*c));
  int rc = ce_kube_config_set_server(c, o->server, err, errlen);
  if (rc != CE_OK)
    return rc;
  int ways = (o->token != NULL) + (o->token_file != NULL) + (o->cert_pem != NULL);
  if ((o->cert_pem == NULL) != (o->key_pem == NULL)) {
    snprintf(err, errlen, "client_cert_pem and client_key_pem go together");
    return CE_EINVAL;
  }
  if (ways > 1) {
    snprintf(err, errlen, "give one of token, token_file, client_cert_pem");
    return CE_EINVAL;
  }
  if (o->insecure && o->ca_pem != NULL) {
    snprintf(err, errlen, "insecure and ca_pem are both set; keep one");
    return CE_EINVAL;
  }
  if (o->token != NULL && !ce_kube_token_ok(o->token, strlen(o->token))) {
    snprintf(err, errlen, "token must be printable ASCII without spaces or line breaks");
    return CE_EINVAL;
  }
  c->insecure = o->insecure;
  c->ca_pem = o->ca_pem, c->ca_len = o->ca_len, o->ca_pem = NULL;
  c->cert_pem = o->cert_pem, c->cert_len = o->cert_len, o->cert_pem = NULL;
  c->key_pem = o->key_pem, c->key_len = o->key_len, o->key_pem = NULL;
  c->token = o->token, o->token = NULL;
  c->token_file = o->token_file, o->token_file = NULL;
  c->auth = c->token != NULL        ? CE_KUBE_AUTH_TOKEN
            : c->token_file != NULL ? CE_KUBE_AUTH_TOKEN_FILE
            : c->cert_pem != NULL   ? CE_KUBE_AUTH_CLIENT_CERT
                                    : CE_KUBE_AUTH_NONE;
  return CE_OK;
}

void ce__op_kube_open(ce_port_t *p, const char *buf, int i, uint64_t id) {
  open_opts_t o;
  memset(&o, 0, sizeof(o));
  ce_kube_config_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  char err[CE_PORT_MSG_MAX - 16];
  int rc;
  if (!open_decode(p, buf, i, id, &o))
    goto done;
  if (strcmp(o.source, "kubeconfig") == 0) {
    rc = ce_kube_config_load((const char *const *)o.paths, o.npaths, o.context, &cfg, err,
                             sizeof(err));
  } else if (strcmp(o.source, "in_cluster") == 0) {
    if (o.has_port && (o.port < 1 || o.port > 65535)) {
      INVAL("kube_open: port must be 1 to 65535");
      goto done;
    }
    rc = ce_kube_config_in_cluster(o.dir, o.host, (unsigned)o.port, &cfg, err, sizeof(err));
  } else {
    rc = explicit_config(&o, &cfg, err, sizeof(err));
    if (rc != CE_OK)
      ce_kube_config_free(&cfg);
  }
  if (rc != CE_OK) {
    ce__port_reply_error(p, id, rc, "kube_open: %s", err);
    goto done;
  }
  ce_kube_client_t *c = client(p);
  if (c == NULL) {
    ce_kube_config_free(&cfg);
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_open: out of memory");
    goto done;
  }
  ce_kube_t *k = NULL;
  rc = ce_kube_open(c, &cfg, &k, err, sizeof(err));
  if (rc != CE_OK) {
    ce__port_reply_error(p, id, rc, "%s", err);
    goto done;
  }
  const ce_kube_config_t *kc = ce_kube_config(k);
  ei_x_buff x;
  if (ce__port_reply_begin(&x, id) != 0) {
    ce_kube_close(k);
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_open: out of memory");
    goto done;
  }
  if (ei_x_encode_tuple_header(&x, 2) != 0 || ei_x_encode_atom(&x, "ok") != 0 ||
      ei_x_encode_map_header(&x, 6) != 0 || ei_x_encode_atom(&x, "kube") != 0 ||
      ei_x_encode_ulonglong(&x, (EI_ULONGLONG)ce_kube_id(k)) != 0 ||
      ei_x_encode_atom(&x, "server") != 0 || ce_etf_encode_text(&x, kc->server) != 0 ||
      ei_x_encode_atom(&x, "context") != 0 || enc_opt_text(&x, kc->context) != 0 ||
      ei_x_encode_atom(&x, "namespace") != 0 || enc_opt_text(&x, kc->namespace_) != 0 ||
      ei_x_encode_atom(&x, "user") != 0 || enc_opt_text(&x, kc->user) != 0 ||
      ei_x_encode_atom(&x, "auth") != 0 ||
      ei_x_encode_atom(&x, ce_kube_auth_name(kc->auth)) != 0) {
    ei_x_free(&x);
    ce_kube_close(k);
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_open: out of memory");
    goto done;
  }
  ce__port_send(p, &x);
done:
  open_opts_free(&o);
}

void ce__op_kube_close(ce_port_t *p, const char *buf, int i, uint64_t id) {
  uint64_t h = 0;
  if (!ce_etf_u64(buf, &i, &h) || h == 0) {
    BADARG("kube_close: Kube must be a positive integer");
    return;
  }
  ce_kube_t *k = p->kube != NULL ? ce_kube_find(p->kube, h) : NULL;
  if (k != NULL)
    ce_kube_close(k);
  ce__port_reply_ok(p, id);
}

/* ---- kube_request --------------------------------------------------------------------- */

typedef struct {
  ce_port_t *p;
  uint64_t id;
} pending_t;

static bool is_json_type(const char *ct) {
  if (strncmp(ct, "application/json", 16) == 0)
    return ct[16] == '\0' || ct[16] == ';' || ct[16] == ' ';
  const char *semi = strchr(ct, ';');
  size_t n = semi != NULL ? (size_t)(semi - ct) : strlen(ct);
  return n > 5 && strncmp(ct + n - 5, "+json", 5) == 0 && strncmp(ct, "application/", 12) == 0;
}

/* ei grows a buffer a few hundred bytes at a time, copying it each time
 * (quadratic for a big body): the term gets its room at once. JSON as
 * terms is at most about 2.5 times its text ("1e1," is 4 bytes, a float
 * 9), and the body at most CE_KUBE_BODY_MAX. */
static void x_reserve(ei_x_buff *x, size_t n) {
  if (n <= (size_t)x->buffsz)
    return;
  char *b = realloc(x->buff, n);
  if (b != NULL) {
    x->buff = b;
    x->buffsz = (int)n;
  }
}

static void on_request_done(void *arg, const ce_kube_http_res_t *r) {
  pending_t *pe = arg;
  ce_port_t *p = pe->p;
  uint64_t id = pe->id;
  free(pe);
  if (r->err != CE_OK) {
    ce__port_reply_error(p, id, r->err, "%s", r->msg);
    return;
  }
  ei_x_buff body;
  bool as_term = false;
  if (ei_x_new(&body) != 0) {
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_request: out of memory");
    return;
  }
  if (is_json_type(r->content_type) && r->body_len > 0) {
    x_reserve(&body, 3 * r->body_len + 1024);
    json_t *j = json_loadb(r->body, r->body_len, JSON_DECODE_ANY, NULL);
    char err[128];
    if (j != NULL && ce_json_to_term(j, &body, err, sizeof(err)) == CE_OK)
      as_term = true;
    json_decref(j);
    if (!as_term) {
      /* Not JSON after all (or too deep): the bytes as they came. */
      ei_x_free(&body);
      ei_x_new(&body);
    }
  }
  if (!as_term && ei_x_encode_binary(&body, r->body, (long)r->body_len) != 0) {
    ei_x_free(&body);
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_request: out of memory");
    return;
  }
  ei_x_buff x;
  if (ce__port_reply_begin(&x, id) != 0 || ei_x_encode_tuple_header(&x, 2) != 0 ||
      ei_x_encode_atom(&x, "ok") != 0 || ei_x_encode_map_header(&x, 2) != 0 ||
      ei_x_encode_atom(&x, "status") != 0 || ei_x_encode_long(&x, r->status) != 0 ||
      ei_x_encode_atom(&x, "body") != 0 || ei_x_append(&x, &body) != 0) {
    ei_x_free(&x);
    ei_x_free(&body);
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_request: out of memory");
    return;
  }
  ei_x_free(&body);
  send_reply(p, id, &x, "kube_request");
}

static bool path_ok(const char *s, size_t n) {
  if (n == 0 || s[0] != '/')
    return false;
  for (size_t k = 0; k < n; k++) {
    unsigned char c = (unsigned char)s[k];
    if (c <= ' ' || c >= 0x7f || c == '#')
      return false;
  }
  return true;
}

void ce__op_kube_request(ce_port_t *p, const char *buf, int i, uint64_t id) {
  ce_kube_t *k = NULL;
  if (!read_kube(p, buf, &i, id, "kube_request", &k))
    return;
  int pairs = 0;
  if (!ce_etf_map(buf, &i, &pairs)) {
    BADARG("kube_request: Req must be a map");
    return;
  }
  char method[8] = "";
  char *path = NULL, *ctype = NULL, *body = NULL;
  size_t body_len = 0;
  uint64_t timeout = CE_KUBE_REQUEST_TIMEOUT_DEFAULT;
  char err[CE_PORT_MSG_MAX - 16];
  for (int k2 = 0; k2 < pairs; k2++) {
    char name[KEY_MAX];
    if (!ce_etf_key(buf, &i, name, sizeof name)) {
      BADARG("kube_request: Req keys must be atoms or binaries");
      goto done;
    }
    if (strcmp(name, "method") == 0) {
      char atom[CE_ETF_ATOM_MAX];
      static const char *const M[] = {"get", "post", "put", "patch", "delete"};
      static const char *const U[] = {"GET", "POST", "PUT", "PATCH", "DELETE"};
      method[0] = '\0';
      if (ce_etf_atom(buf, &i, atom))
        for (size_t m = 0; m < 5; m++)
          if (strcmp(atom, M[m]) == 0)
            snprintf(method, sizeof(method), "%s", U[m]);
      if (method[0] == '\0') {
        BADARG("kube_request: method must be get, post, put, patch or delete");
        goto done;
      }
    } else if (strcmp(name, "path") == 0) {
      const char *s = NULL;
      size_t n = 0;
      if (!ce_etf_binary(buf, &i, &s, &n)) {
        BADARG("kube_request: path must be a binary");
        goto done;
      }
      if (!path_ok(s, n) || n > 16384) {
        char sh[SHOWN_MAX];
        INVAL("kube_request: path \"%s\" must start with '/' and hold printable ASCII "
              "without spaces (escape the query), at most 16384 bytes",
              shown(sh, s, n));
        goto done;
      }
      free(path);
      path = strndup(s, n);
    } else if (strcmp(name, "content_type") == 0) {
      free(ctype);
      ctype = ce_etf_string(buf, &i, 200, NULL);
      if (ctype == NULL || strpbrk(ctype, "\r\n") != NULL) {
        BADARG("kube_request: content_type must be a binary of 1 to 200 bytes on one line");
        goto done;
      }
    } else if (strcmp(name, "timeout") == 0) {
      if (!ce_etf_u64(buf, &i, &timeout)) {
        BADARG("kube_request: timeout must be a positive integer");
        goto done;
      }
    } else if (strcmp(name, "body") == 0) {
      const char *s = NULL;
      size_t n = 0;
      int j = i;
      free(body);
      body = NULL;
      if (ce_etf_binary(buf, &j, &s, &n)) {
        /* A binary goes as it is (a JSON Patch, pre-encoded JSON). */
        body = malloc(n + 1);
        if (body == NULL) {
          ce__port_reply_error(p, id, CE_ENOMEM, "kube_request: out of memory");
          goto done;
        }
        memcpy(body, s, n);
        body_len = n;
        i = j;
      } else {
        json_t *jv = NULL;
        int rc = ce_term_to_json(buf, &i, "body", &jv, err, sizeof(err));
        if (rc != CE_OK) {
          ce__port_reply_error(p, id, rc == CE_EINVAL ? CE__PORT_BADARG : rc,
                               "kube_request: %s", err);
          goto done;
        }
        body = json_dumps(jv, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(jv);
        if (body == NULL) {
          ce__port_reply_error(p, id, CE_ENOMEM, "kube_request: out of memory");
          goto done;
        }
        body_len = strlen(body);
      }
    } else {
      char sh[SHOWN_MAX];
      BADARG("kube_request: unknown key \"%s\" (expected method, path, body, "
             "content_type, timeout)",
             shown(sh, name, strlen(name)));
      goto done;
    }
  }
  if (method[0] == '\0' || path == NULL) {
    BADARG("kube_request: method and path are required");
    goto done;
  }
  if (timeout < 1 || timeout > CE_KUBE_TIMEOUT_MAX) {
    INVAL("kube_request: timeout must be 1 to %u ms", CE_KUBE_TIMEOUT_MAX);
    goto done;
  }
  pending_t *pe = malloc(sizeof(*pe));
  if (pe == NULL) {
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_request: out of memory");
    goto done;
  }
  pe->p = p;
  pe->id = id;
  const char *ct = ctype;
  if (ct == NULL)
    ct = strcmp(method, "PATCH") == 0 ? "application/merge-patch+json" : "application/json";
  ce_kube_http_req_t req = {.method = method, .path = path, .body = body,
                            .body_len = body_len, .content_type = ct,
                            .timeout_ms = (uint32_t)timeout};
  int rc = ce_kube_request(k, &req, on_request_done, pe, err, sizeof(err));
  if (rc != CE_OK) {
    free(pe);
    ce__port_reply_error(p, id, rc, "%s", err);
  }
done:
  free(path);
  free(ctype);
  free(body);
}

/* ---- kube_exec ------------------------------------------------------------------------ */

static void on_exec_done(void *arg, const ce_kube_exec_res_t *r) {
  pending_t *pe = arg;
  ce_port_t *p = pe->p;
  uint64_t id = pe->id;
  free(pe);
  if (r->err != CE_OK) {
    ce__port_reply_error(p, id, r->err, "%s", r->msg);
    return;
  }
  ei_x_buff st;
  char err[128];
  if (ei_x_new(&st) != 0) {
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_exec: out of memory");
    return;
  }
  int rc = r->status != NULL ? ce_json_to_term(r->status, &st, err, sizeof(err))
                             : (ei_x_encode_atom(&st, "nil") == 0 ? CE_OK : CE_ENOMEM);
  ei_x_buff x;
  if (rc != CE_OK || ce__port_reply_begin(&x, id) != 0) {
    ei_x_free(&st);
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_exec: out of memory");
    return;
  }
  if (ei_x_encode_tuple_header(&x, 2) != 0 || ei_x_encode_atom(&x, "ok") != 0 ||
      ei_x_encode_map_header(&x, 7) != 0 || ei_x_encode_atom(&x, "exit_code") != 0 ||
      (r->has_exit ? ei_x_encode_long(&x, r->exit_code) : ei_x_encode_atom(&x, "nil")) != 0 ||
      ei_x_encode_atom(&x, "status") != 0 || ei_x_append(&x, &st) != 0 ||
      ei_x_encode_atom(&x, "stdout") != 0 ||
      ei_x_encode_binary(&x, r->out, (long)r->out_len) != 0 ||
      ei_x_encode_atom(&x, "stderr") != 0 ||
      ei_x_encode_binary(&x, r->errout, (long)r->err_len) != 0 ||
      ei_x_encode_atom(&x, "stdout_dropped") != 0 ||
      ei_x_encode_ulonglong(&x, r->out_dropped) != 0 ||
      ei_x_encode_atom(&x, "stderr_dropped") != 0 ||
      ei_x_encode_ulonglong(&x, r->err_dropped) != 0 ||
      ei_x_encode_atom(&x, "protocol") != 0 || ce_etf_encode_text(&x, r->protocol) != 0) {
    ei_x_free(&x);
    ei_x_free(&st);
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_exec: out of memory");
    return;
  }
  ei_x_free(&st);
  send_reply(p, id, &x, "kube_exec");
}

void ce__op_kube_exec(ce_port_t *p, const char *buf, int i, uint64_t id) {
  ce_kube_t *k = NULL;
  if (!read_kube(p, buf, &i, id, "kube_exec", &k))
    return;
  int pairs = 0;
  if (!ce_etf_map(buf, &i, &pairs)) {
    BADARG("kube_exec: ExecReq must be a map");
    return;
  }
  char *ns = NULL, *pod = NULL, *container = NULL;
  char **argv = NULL;
  size_t argc = 0;
  const char *in = NULL;
  size_t in_len = 0;
  bool has_stdin = false;
  uint64_t timeout = CE_KUBE_EXEC_TIMEOUT_DEFAULT, max_output = CE_KUBE_EXEC_OUTPUT_DEFAULT;
  char err[CE_PORT_MSG_MAX - 16];
  for (int k2 = 0; k2 < pairs; k2++) {
    char name[KEY_MAX];
    if (!ce_etf_key(buf, &i, name, sizeof name)) {
      BADARG("kube_exec: ExecReq keys must be atoms or binaries");
      goto done;
    }
    char **slot = strcmp(name, "namespace") == 0   ? &ns
                  : strcmp(name, "pod") == 0       ? &pod
                  : strcmp(name, "container") == 0 ? &container
                                                   : NULL;
    if (slot != NULL) {
      free(*slot);
      *slot = ce_etf_string(buf, &i, NAME_MAX_, NULL);
      if (*slot == NULL) {
        BADARG("kube_exec: %s must be a binary of 1 to %u bytes", name, NAME_MAX_);
        goto done;
      }
      if (!k8s_name(*slot, slot == &pod)) {
        char sh[SHOWN_MAX];
        INVAL("kube_exec: %s \"%s\" is not a Kubernetes name (a DNS-1123 %s)", name,
              shown(sh, *slot, strlen(*slot)), slot == &pod ? "subdomain" : "label");
        goto done;
      }
    } else if (strcmp(name, "command") == 0) {
      int arity = 0;
      if (ei_decode_list_header(buf, &i, &arity) != 0 || arity < 1 ||
          (size_t)arity > ARGV_MAX) {
        BADARG("kube_exec: command must be a list of 1 to %u binaries", ARGV_MAX);
        goto done;
      }
      if (argv != NULL) {
        for (size_t a = 0; a < argc; a++)
          free(argv[a]);
        free(argv);
      }
      argc = 0;
      argv = calloc((size_t)arity + 1, sizeof(char *));
      if (argv == NULL) {
        ce__port_reply_error(p, id, CE_ENOMEM, "kube_exec: out of memory");
        goto done;
      }
      for (int a = 0; a < arity; a++) {
        const char *s = NULL;
        size_t n = 0;
        if (!ce_etf_binary(buf, &i, &s, &n) || memchr(s, '\0', n) != NULL ||
            (argv[argc] = strndup(s, n)) == NULL) {
          BADARG("kube_exec: command[%d] must be a binary without NUL", a);
          goto done;
        }
        argc++;
      }
      if ((unsigned char)buf[i] != ERL_NIL_EXT) {
        BADARG("kube_exec: command must be a proper list");
        goto done;
      }
      i++;
    } else if (strcmp(name, "stdin") == 0) {
      if (!ce_etf_binary(buf, &i, &in, &in_len)) {
        BADARG("kube_exec: stdin must be a binary");
        goto done;
      }
      has_stdin = true;
    } else if (strcmp(name, "timeout") == 0 || strcmp(name, "max_output") == 0) {
      uint64_t *v = name[0] == 't' ? &timeout : &max_output;
      if (!ce_etf_u64(buf, &i, v)) {
        BADARG("kube_exec: %s must be a positive integer", name);
        goto done;
      }
    } else {
      char sh[SHOWN_MAX];
      BADARG("kube_exec: unknown key \"%s\" (expected namespace, pod, container, command, "
             "stdin, timeout, max_output)",
             shown(sh, name, strlen(name)));
      goto done;
    }
  }
  if (ns == NULL || pod == NULL || container == NULL || argv == NULL) {
    BADARG("kube_exec: namespace, pod, container and command are required");
    goto done;
  }
  if (timeout < 1 || timeout > CE_KUBE_TIMEOUT_MAX) {
    INVAL("kube_exec: timeout must be 1 to %u ms", CE_KUBE_TIMEOUT_MAX);
    goto done;
  }
  if (max_output < 1 || max_output > CE_KUBE_EXEC_OUTPUT_TOTAL) {
    INVAL("kube_exec: max_output must be 1 to %u bytes", CE_KUBE_EXEC_OUTPUT_TOTAL);
    goto done;
  }
  pending_t *pe = malloc(sizeof(*pe));
  if (pe == NULL) {
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_exec: out of memory");
    goto done;
  }
  pe->p = p;
  pe->id = id;
  ce_kube_exec_req_t req = {.ns = ns, .pod = pod, .container = container,
                            .argv = (const char *const *)argv, .argc = argc,
                            .has_stdin = has_stdin, .stdin_data = in, .stdin_len = in_len,
                            .timeout_ms = (uint32_t)timeout, .max_output = max_output};
  int rc = ce_kube_exec(k, &req, on_exec_done, pe, err, sizeof(err));
  if (rc != CE_OK) {
    free(pe);
    ce__port_reply_error(p, id, rc, "%s", err);
  }
done:
  free(ns);
  free(pod);
  free(container);
  if (argv != NULL) {
    for (size_t a = 0; a < argc; a++)
      free(argv[a]);
    free(argv);
  }
}

/* ---- kube_forward --------------------------------------------------------------------- */

static void on_forward_error(void *arg, uint64_t fchan, const char *msg) {
  ce_port_t *p = arg;
  ei_x_buff x;
  if (ei_x_new_with_version(&x) != 0)
    return;
  if (ei_x_encode_tuple_header(&x, 3) != 0 || ei_x_encode_atom(&x, "kube_forward") != 0 ||
      ei_x_encode_ulonglong(&x, fchan) != 0 || ei_x_encode_tuple_header(&x, 2) != 0 ||
      ei_x_encode_atom(&x, "error") != 0 || ce_etf_encode_text(&x, msg) != 0) {
    ei_x_free(&x);
    return;
  }
  ce__port_send(p, &x);
}

void ce__op_kube_forward(ce_port_t *p, const char *buf, int i, uint64_t id) {
  ce_kube_t *k = NULL;
  if (!read_kube(p, buf, &i, id, "kube_forward", &k))
    return;
  int pairs = 0;
  if (!ce_etf_map(buf, &i, &pairs)) {
    BADARG("kube_forward: FwdReq must be a map");
    return;
  }
  char *ns = NULL, *pod = NULL;
  uint64_t port = 0;
  char listen[CE__LISTEN_PATH_MAX + 16] = "";
  char host_shown[80] = "";
  bool is_unix = false;
  char err[CE_PORT_MSG_MAX - 16];
  for (int k2 = 0; k2 < pairs; k2++) {
    char name[KEY_MAX];
    if (!ce_etf_key(buf, &i, name, sizeof name)) {
      BADARG("kube_forward: FwdReq keys must be atoms or binaries");
      goto done;
    }
    if (strcmp(name, "namespace") == 0 || strcmp(name, "pod") == 0) {
      char **slot = name[0] == 'n' ? &ns : &pod;
      free(*slot);
      *slot = ce_etf_string(buf, &i, NAME_MAX_, NULL);
      if (*slot == NULL) {
        BADARG("kube_forward: %s must be a binary of 1 to %u bytes", name, NAME_MAX_);
        goto done;
      }
      if (!k8s_name(*slot, slot == &pod)) {
        char sh[SHOWN_MAX];
        INVAL("kube_forward: %s \"%s\" is not a Kubernetes name (a DNS-1123 %s)", name,
              shown(sh, *slot, strlen(*slot)), slot == &pod ? "subdomain" : "label");
        goto done;
      }
    } else if (strcmp(name, "port") == 0) {
      if (!ce_etf_u64(buf, &i, &port)) {
        BADARG("kube_forward: port must be an integer from 1 to 65535");
        goto done;
      }
    } else if (strcmp(name, "listen") == 0) {
      int arity = 0;
      char kind[CE_ETF_ATOM_MAX];
      if (!ce_etf_tuple(buf, &i, &arity) || arity < 2 || !ce_etf_atom(buf, &i, kind) ||
          !((strcmp(kind, "unix") == 0 && arity == 2) ||
            (strcmp(kind, "tcp") == 0 && arity == 3))) {
        BADARG("kube_forward: listen must be {unix, Path} or {tcp, Host, Port}");
        goto done;
      }
      const char *s = NULL;
      size_t n = 0;
      if (!ce_etf_binary(buf, &i, &s, &n) || n == 0 || memchr(s, '\0', n) != NULL) {
        BADARG("kube_forward: the listen %s must be a non-empty binary without NUL",
               kind[0] == 'u' ? "path" : "host");
        goto done;
      }
      if (kind[0] == 'u') {
        if (n >= CE__LISTEN_PATH_MAX) {
          INVAL("kube_forward: the Unix socket path is longer than %d bytes",
                CE__LISTEN_PATH_MAX - 1);
          goto done;
        }
        is_unix = true;
        snprintf(listen, sizeof(listen), "unix:%.*s", (int)n, s);
      } else {
        uint64_t lport = 0;
        if (n >= 64 || !ce_etf_u64(buf, &i, &lport) || lport > 65535) {
          BADARG("kube_forward: {tcp, Host, Port} takes a host of 1 to 63 bytes and a port "
                 "from 0 to 65535");
          goto done;
        }
        char host[64];
        memcpy(host, s, n);
        host[n] = '\0';
        if (strcmp(host, "localhost") == 0) {
          strcpy(host, "127.0.0.1");
        } else if (host[0] == '[' && n > 2 && host[n - 1] == ']') {
          memmove(host, host + 1, n - 2);
          host[n - 2] = '\0';
        }
        is_unix = false;
        snprintf(host_shown, sizeof(host_shown), "%s", host);
        snprintf(listen, sizeof(listen), strchr(host, ':') != NULL ? "[%s]:%u" : "%s:%u",
                 host, (unsigned)lport);
      }
    } else {
      char sh[SHOWN_MAX];
      BADARG("kube_forward: unknown key \"%s\" (expected namespace, pod, port, listen)",
             shown(sh, name, strlen(name)));
      goto done;
    }
  }
  if (ns == NULL || pod == NULL || port == 0 || listen[0] == '\0') {
    BADARG("kube_forward: namespace, pod, port (1 to 65535) and listen are required");
    goto done;
  }
  if (port > 65535) {
    INVAL("kube_forward: port must be 1 to 65535");
    goto done;
  }
  ce_kube_fwd_req_t req = {.ns = ns, .pod = pod, .port = (uint16_t)port, .listen = listen};
  uint64_t fchan = 0;
  uint16_t bound = 0;
  int rc = ce_kube_forward(k, &req, on_forward_error, p, &fchan, &bound, err, sizeof(err));
  if (rc != CE_OK) {
    ce__port_reply_error(p, id, rc, "%s", err);
    goto done;
  }
  ei_x_buff x;
  bool ok = ce__port_reply_begin(&x, id) == 0;
  ok = ok && ei_x_encode_tuple_header(&x, 2) == 0 && ei_x_encode_atom(&x, "ok") == 0 &&
       ei_x_encode_tuple_header(&x, 2) == 0 && ei_x_encode_ulonglong(&x, fchan) == 0 &&
       ei_x_encode_map_header(&x, 1) == 0 && ei_x_encode_atom(&x, "address") == 0;
  if (ok && is_unix)
    ok = ei_x_encode_tuple_header(&x, 2) == 0 && ei_x_encode_atom(&x, "unix") == 0 &&
         ce_etf_encode_text(&x, listen + 5) == 0;
  else if (ok)
    ok = ei_x_encode_tuple_header(&x, 3) == 0 && ei_x_encode_atom(&x, "tcp") == 0 &&
         ce_etf_encode_text(&x, host_shown) == 0 && ei_x_encode_ulong(&x, bound) == 0;
  if (!ok) {
    ei_x_free(&x);
    ce_kube_forward_close(p->kube, fchan);
    ce__port_reply_error(p, id, CE_ENOMEM, "kube_forward: out of memory");
    goto done;
  }
  ce__port_send(p, &x);
done:
  free(ns);
  free(pod);
}

void ce__op_kube_forward_close(ce_port_t *p, const char *buf, int i, uint64_t id) {
  uint64_t f = 0;
  if (!ce_etf_u64(buf, &i, &f) || f == 0) {
    BADARG("kube_forward_close: FChan must be a positive integer");
    return;
  }
  if (p->kube != NULL)
    ce_kube_forward_close(p->kube, f);
  ce__port_reply_ok(p, id);
}
