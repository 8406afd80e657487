/*
 * kubeconfig loading (config.h). libyaml loads each file as a document
 * (a node graph, so aliases cost nothing and cannot loop: only fixed paths
 * are walked); the named clusters, users and contexts of every file are
 * merged first-wins, as kubectl merges $KUBECONFIG, and only the chosen
 * context, cluster and user are then read field by field.
 */
#include "kube/config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "common/error.h"
#include "common/text.h"

/* Named entries of one kind over all files. */
#define ENTRIES_MAX 4096u
#define YPATH_MAX 160
#define SHOWN_MAX (4 * CE_TEXT_QUOTE_MAX + 8)
#define DEFAULT_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

typedef struct {
  yaml_document_t doc;
  bool loaded;
  const char *name;  /* as given (for messages) */
  char *dir;         /* relative paths start here */
} kfile_t;

typedef struct {
  const char *name;  /* points into the document */
  size_t file;
  size_t index;      /* in the file's list, for paths */
  yaml_node_t *body; /* the "cluster" / "user" / "context" mapping */
} entry_t;

typedef struct {
  entry_t *v;
  size_t n;
} entries_t;

typedef struct {
  kfile_t *files;
  size_t nfiles;
  entries_t clusters, users, contexts;
  const char *current;
  char *err;
  size_t errlen;
} loader_t;

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return code;
}

static const char *shown(char *dst, const char *s) {
  ce_text_sanitize(dst, SHOWN_MAX, s, strlen(s), 1);
  return dst;
}

const char *ce_kube_auth_name(ce_kube_auth_t a) {
  switch (a) {
  case CE_KUBE_AUTH_TOKEN:
    return "token";
  case CE_KUBE_AUTH_TOKEN_FILE:
    return "token_file";
  case CE_KUBE_AUTH_CLIENT_CERT:
    return "client_cert";
  case CE_KUBE_AUTH_EXEC:
    return "exec";
  default:
    return "none";
  }
}

static void free_secret(char **s, size_t len) {
  if (*s != NULL) {
    OPENSSL_clear_free(*s, len != 0 ? len : strlen(*s));
    *s = NULL;
  }
}

static void free_strv(char **v) {
  if (v == NULL)
    return;
  for (char **q = v; *q != NULL; q++)
    free(*q);
  free(v);
}

void ce_kube_config_free(ce_kube_config_t *c) {
  if (c == NULL)
    return;
  free(c->server);
  free(c->path_prefix);
  free(c->ca_pem);
  free(c->tls_server_name);
  free(c->context);
  free(c->namespace_);
  free(c->user);
  free_secret(&c->token, 0);
  free(c->token_file);
  free(c->cert_pem);
  free_secret(&c->key_pem, c->key_len);
  free(c->exec.api_version);
  free_strv(c->exec.argv);
  if (c->exec.env != NULL) {
    for (char **q = c->exec.env; *q != NULL; q++)
      OPENSSL_clear_free(*q, strlen(*q));
    free(c->exec.env);
  }
  memset(c, 0, sizeof(*c));
}

/* ---- files and base64 ---------------------------------------------------------------- */

int ce_kube_read_file(const char *path, size_t max, char **data, size_t *len, char *err,
                      size_t errlen) {
  char s[SHOWN_MAX];
  *data = NULL;
  *len = 0;
  /* Non-blocking: a FIFO (or a device) must not hold the loop in open();
   * only a regular file is read, blocking again. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    return fail(err, errlen, e == ENOENT ? CE_ENOENT : CE_EIO, "cannot open \"%s\": %s",
                shown(s, path), strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return fail(err, errlen, CE_EIO, "\"%s\" is not a regular file", shown(s, path));
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    int e = errno;
    close(fd);
    return fail(err, errlen, CE_EIO, "cannot read \"%s\": %s", shown(s, path), strerror(e));
  }
  if ((uint64_t)st.st_size > max) {
    close(fd);
    return fail(err, errlen, CE_ETOOBIG, "\"%s\" is larger than %zu bytes", shown(s, path),
                max);
  }
  size_t cap = (size_t)st.st_size + 1;
  char *buf = malloc(cap);
  if (buf == NULL) {
    close(fd);
    return fail(err, errlen, CE_ENOMEM, "out of memory reading \"%s\"", shown(s, path));
  }
  size_t have = 0;
  for (;;) {
    if (have == cap - 1) {
      /* The file grew since fstat: read one more byte to tell. */
      char extra;
      ssize_t r = read(fd, &extra, 1);
      if (r > 0) {
        close(fd);
        free(buf);
        return fail(err, errlen, CE_ETOOBIG, "\"%s\" changed while it was read",
                    shown(s, path));
      }
      break;
    }
    ssize_t r = read(fd, buf + have, cap - 1 - have);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      free(buf);
      return fail(err, errlen, CE_EIO, "cannot read \"%s\": %s", shown(s, path),
                  strerror(e));
    }
    if (r == 0)
      break;
    have += (size_t)r;
  }
  close(fd);
  buf[have] = '\0';
  *data = buf;
  *len = have;
  return CE_OK;
}

bool ce_kube_token_ok(const char *s, size_t n) {
  if (n == 0)
    return false;
  for (size_t k = 0; k < n; k++)
    if ((unsigned char)s[k] < 0x21 || (unsigned char)s[k] > 0x7e)
      return false;
  return true;
}

static int b64val(unsigned char c) {
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+')
    return 62;
  if (c == '/')
    return 63;
  return -1;
}

int ce_kube_base64_decode(const char *s, size_t n, char **out, size_t *outlen) {
  *out = NULL;
  *outlen = 0;
  char *buf = malloc(n / 4 * 3 + 4);
  if (buf == NULL)
    return CE_ENOMEM;
  size_t o = 0;
  uint32_t acc = 0;
  int bits = 0, digits = 0, pad = 0;
  for (size_t k = 0; k < n; k++) {
    unsigned char c = (unsigned char)s[k];
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t')
      continue;
    if (c == '=') {
      pad++;
      continue;
    }
    int v = b64val(c);
    if (v < 0 || pad > 0) {
      free(buf);
      return CE_EINVAL;
    }
    acc = acc << 6 | (uint32_t)v;
    bits += 6;
    digits++;
    if (bits >= 8) {
      bits -= 8;
      buf[o++] = (char)(acc >> bits & 0xff);
    }
  }
  /* A lone digit carries no byte; padding must complete the last group;
   * the unused low bits must be zero (one encoding per input). */
  if (digits % 4 == 1 || (pad != 0 && (digits + pad) % 4 != 0) || pad > 2 ||
      (acc & ((1u << bits) - 1)) != 0) {
    free(buf);
    return CE_EINVAL;
  }
  buf[o] = '\0';
  *out = buf;
  *outlen = o;
  return CE_OK;
}

/* ---- URL ----------------------------------------------------------------------------- */

int ce_kube_config_set_server(ce_kube_config_t *out, const char *url, char *err,
                              size_t errlen) {
  char s[SHOWN_MAX];
  if (strncmp(url, "https://", 8) != 0)
    return fail(err, errlen, CE_EINVAL, "server \"%s\" must be an https:// URL",
                shown(s, url));
  const char *h = url + 8;
  const char *end = h + strcspn(h, "/?#");
  if (strpbrk(h, "?#") != NULL)
    return fail(err, errlen, CE_EINVAL, "server \"%s\" must not have a query or fragment",
                shown(s, url));
  const char *host = h, *hend, *portp = NULL;
  if (*h == '[') {
    host = h + 1;
    hend = memchr(host, ']', (size_t)(end - host));
    if (hend == NULL)
      return fail(err, errlen, CE_EINVAL, "server \"%s\": unclosed '['", shown(s, url));
    if (hend + 1 < end) {
      if (hend[1] != ':')
        return fail(err, errlen, CE_EINVAL, "server \"%s\": bad port", shown(s, url));
      portp = hend + 2;
    }
  } else {
    hend = memchr(h, ':', (size_t)(end - h));
    if (hend != NULL)
      portp = hend + 1;
    else
      hend = end;
  }
  size_t hl = (size_t)(hend - host);
  if (hl == 0 || hl >= CE_KUBE_HOST_MAX)
    return fail(err, errlen, CE_EINVAL, "server \"%s\": the host must be 1 to %u bytes",
                shown(s, url), CE_KUBE_HOST_MAX - 1);
  for (size_t k = 0; k < hl; k++) {
    unsigned char c = (unsigned char)host[k];
    if (c <= ' ' || c >= 0x7f || c == '@' || c == '%' || c == '\\')
      return fail(err, errlen, CE_EINVAL, "server \"%s\": bad character in the host",
                  shown(s, url));
  }
  unsigned port = 443;
  if (portp != NULL) {
    if (portp == end || end - portp > 5)
      return fail(err, errlen, CE_EINVAL, "server \"%s\": bad port", shown(s, url));
    port = 0;
    for (const char *q = portp; q < end; q++) {
      if (*q < '0' || *q > '9')
        return fail(err, errlen, CE_EINVAL, "server \"%s\": bad port", shown(s, url));
      port = port * 10 + (unsigned)(*q - '0');
    }
    if (port < 1 || port > 65535)
      return fail(err, errlen, CE_EINVAL, "server \"%s\": bad port", shown(s, url));
  }
  size_t pl = strlen(end);
  while (pl > 0 && end[pl - 1] == '/')
    pl--;
  for (size_t k = 0; k < pl; k++) {
    unsigned char c = (unsigned char)end[k];
    if (c <= ' ' || c >= 0x7f)
      return fail(err, errlen, CE_EINVAL, "server \"%s\": bad character in the path",
                  shown(s, url));
  }
  char *prefix = strndup(end, pl);
  size_t ul = (size_t)(end - url) + pl;
  char *server = strndup(url, ul);
  if (prefix == NULL || server == NULL) {
    free(prefix);
    free(server);
    return fail(err, errlen, CE_ENOMEM, "out of memory");
  }
  free(out->server);
  free(out->path_prefix);
  out->server = server;
  out->path_prefix = prefix;
  memcpy(out->host, host, hl);
  out->host[hl] = '\0';
  out->port = port;
  return CE_OK;
}

/* ---- YAML helpers -------------------------------------------------------------------- */

static yaml_node_t *map_get(yaml_document_t *d, yaml_node_t *map, const char *key) {
  if (map == NULL || map->type != YAML_MAPPING_NODE)
    return NULL;
  for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
       pr++) {
    yaml_node_t *k = yaml_document_get_node(d, pr->key);
    if (k != NULL && k->type == YAML_SCALAR_NODE &&
        k->data.scalar.length == strlen(key) &&
        memcmp(k->data.scalar.value, key, k->data.scalar.length) == 0)
      return yaml_document_get_node(d, pr->value);
  }
  return NULL;
}

/* A plain null (~, null, empty) counts as absent. */
static bool is_null(yaml_node_t *n) {
  if (n == NULL)
    return true;
  if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
    return false;
  const char *v = (const char *)n->data.scalar.value;
  return n->data.scalar.length == 0 || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 ||
         strcmp(v, "Null") == 0 || strcmp(v, "NULL") == 0;
}

typedef struct {
  loader_t *l;
  kfile_t *f;
  char path[YPATH_MAX];
} at_t;

static int bad(at_t *a, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad(at_t *a, int code, const char *field, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  char s[SHOWN_MAX];
  snprintf(a->l->err, a->l->errlen, "kubeconfig \"%s\": %s%s%s: %s", shown(s, a->f->name),
           a->path, field != NULL && a->path[0] != '\0' ? "." : "",
           field != NULL ? field : "", msg);
  return code;
}

/* Reads a string field (NULL, CE_OK when absent or null). Strings hold no
 * NUL byte (libyaml refuses one) and are at most max bytes. */
static int get_str(at_t *a, yaml_node_t *map, const char *key, size_t max, char **out) {
  *out = NULL;
  yaml_node_t *n = map_get(&a->f->doc, map, key);
  if (is_null(n))
    return CE_OK;
  if (n->type != YAML_SCALAR_NODE)
    return bad(a, CE_EINVAL, key, "must be a string");
  if (n->data.scalar.length > max)
    return bad(a, CE_EINVAL, key, "is longer than %zu bytes", max);
  if (memchr(n->data.scalar.value, '\0', n->data.scalar.length) != NULL)
    return bad(a, CE_EINVAL, key, "contains a NUL byte");
  *out = strndup((const char *)n->data.scalar.value, n->data.scalar.length);
  if (*out == NULL)
    return bad(a, CE_ENOMEM, key, "out of memory");
  return CE_OK;
}

static int get_bool(at_t *a, yaml_node_t *map, const char *key, bool *out) {
  *out = false;
  yaml_node_t *n = map_get(&a->f->doc, map, key);
  if (is_null(n))
    return CE_OK;
  if (n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
    const char *v = (const char *)n->data.scalar.value;
    if (strcasecmp(v, "true") == 0) {
      *out = true;
      return CE_OK;
    }
    if (strcasecmp(v, "false") == 0)
      return CE_OK;
  }
  return bad(a, CE_EINVAL, key, "must be true or false");
}

/* A path from the file: absolute, or relative to the file's directory. */
static int get_path(at_t *a, yaml_node_t *map, const char *key, char **out) {
  char *v = NULL;
  int rc = get_str(a, map, key, PATH_MAX, &v);
  if (rc != CE_OK || v == NULL) {
    *out = NULL;
    return rc;
  }
  if (v[0] == '/' || a->f->dir == NULL) {
    *out = v;
    return CE_OK;
  }
  size_t n = strlen(a->f->dir) + strlen(v) + 2;
  *out = malloc(n);
  if (*out == NULL) {
    free(v);
    return bad(a, CE_ENOMEM, key, "out of memory");
  }
  snprintf(*out, n, "%s/%s", a->f->dir, v);
  free(v);
  return CE_OK;
}

/* field-data (base64) or field (a file); both set is an error, as kubectl
 * says. */
static int get_data_or_file(at_t *a, yaml_node_t *map, const char *data_key,
                            const char *file_key, char **out, size_t *outlen) {
  *out = NULL;
  *outlen = 0;
  char *b64 = NULL, *path = NULL;
  int rc = get_str(a, map, data_key, CE_KUBE_SECRET_FILE_MAX * 2, &b64);
  if (rc == CE_OK)
    rc = get_path(a, map, file_key, &path);
  if (rc != CE_OK)
    goto done;
  if (b64 != NULL && path != NULL) {
    rc = bad(a, CE_EINVAL, data_key, "and %s are both set; keep one", file_key);
    goto done;
  }
  if (b64 != NULL) {
    rc = ce_kube_base64_decode(b64, strlen(b64), out, outlen);
    if (rc == CE_EINVAL)
      rc = bad(a, CE_EINVAL, data_key, "is not base64");
    else if (rc != CE_OK)
      rc = bad(a, rc, data_key, "out of memory");
    else if (*outlen == 0)
      rc = bad(a, CE_EINVAL, data_key, "is empty");
  } else if (path != NULL) {
    char why[CE_KUBE_HOST_MAX + 2 * SHOWN_MAX];
    rc = ce_kube_read_file(path, CE_KUBE_SECRET_FILE_MAX, out, outlen, why, sizeof(why));
    if (rc != CE_OK)
      rc = bad(a, rc, file_key, "%s", why);
  }
done:
  if (rc != CE_OK && *out != NULL) {
    OPENSSL_clear_free(*out, *outlen);
    *out = NULL;
    *outlen = 0;
  }
  if (b64 != NULL)
    OPENSSL_clear_free(b64, strlen(b64));
  free(path);
  return rc;
}

/* ---- merging ------------------------------------------------------------------------- */

static entry_t *find(entries_t *e, const char *name) {
  for (size_t k = 0; k < e->n; k++)
    if (strcmp(e->v[k].name, name) == 0)
      return &e->v[k];
  return NULL;
}

/* Adds the named entries of one list ("clusters": [{name, cluster}]). */
static int collect(loader_t *l, size_t fi, yaml_node_t *root, const char *list,
                   const char *body_key, entries_t *into) {
  at_t a = {.l = l, .f = &l->files[fi]};
  yaml_document_t *d = &a.f->doc;
  yaml_node_t *seq = map_get(d, root, list);
  if (is_null(seq))
    return CE_OK;
  if (seq->type != YAML_SEQUENCE_NODE)
    return bad(&a, CE_EINVAL, list, "must be a list");
  size_t idx = 0;
  for (yaml_node_item_t *it = seq->data.sequence.items.start;
       it < seq->data.sequence.items.top; it++, idx++) {
    yaml_node_t *item = yaml_document_get_node(d, *it);
    snprintf(a.path, sizeof(a.path), "%s[%zu]", list, idx);
    if (item == NULL || item->type != YAML_MAPPING_NODE)
      return bad(&a, CE_EINVAL, NULL, "must be a mapping with name and %s", body_key);
    yaml_node_t *nm = map_get(d, item, "name");
    if (nm == NULL || nm->type != YAML_SCALAR_NODE || nm->data.scalar.length == 0)
      return bad(&a, CE_EINVAL, "name", "must be a non-empty string");
    if (memchr(nm->data.scalar.value, '\0', nm->data.scalar.length) != NULL)
      return bad(&a, CE_EINVAL, "name", "contains a NUL byte");
    yaml_node_t *body = map_get(d, item, body_key);
    if (body != NULL && !is_null(body) && body->type != YAML_MAPPING_NODE)
      return bad(&a, CE_EINVAL, body_key, "must be a mapping");
    const char *name = (const char *)nm->data.scalar.value;
    if (find(into, name) != NULL)
      continue; /* the first file that defines a name wins */
    if (into->n >= ENTRIES_MAX)
      return bad(&a, CE_ETOOBIG, NULL, "more than %u entries", ENTRIES_MAX);
    entry_t *v = realloc(into->v, (into->n + 1) * sizeof(*v));
    if (v == NULL)
      return bad(&a, CE_ENOMEM, NULL, "out of memory");
    into->v = v;
    v[into->n++] = (entry_t){.name = name, .file = fi, .index = idx,
                             .body = is_null(body) ? NULL : body};
  }
  return CE_OK;
}

/* A key twice in one mapping is refused (YAML says keys are unique; a
 * reader taking the first and another taking the last would disagree). */
static int no_duplicate_keys(at_t *a) {
  yaml_document_t *d = &a->f->doc;
  for (yaml_node_t *n = d->nodes.start; n < d->nodes.top; n++) {
    if (n->type != YAML_MAPPING_NODE)
      continue;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
         p++) {
      yaml_node_t *k = yaml_document_get_node(d, p->key);
      if (k == NULL || k->type != YAML_SCALAR_NODE)
        continue;
      for (yaml_node_pair_t *q = n->data.mapping.pairs.start; q < p; q++) {
        yaml_node_t *k2 = yaml_document_get_node(d, q->key);
        if (k2 != NULL && k2->type == YAML_SCALAR_NODE &&
            k2->data.scalar.length == k->data.scalar.length &&
            memcmp(k2->data.scalar.value, k->data.scalar.value, k->data.scalar.length) == 0) {
          char s[SHOWN_MAX];
          ce_text_sanitize(s, sizeof(s), (const char *)k->data.scalar.value,
                           k->data.scalar.length, 1);
          snprintf(a->path, sizeof(a->path), "line %lu",
                   (unsigned long)k->start_mark.line + 1);
          return bad(a, CE_EINVAL, NULL, "the key \"%s\" appears twice in one mapping", s);
        }
      }
    }
  }
  return CE_OK;
}

static int load_doc(loader_t *l, size_t fi, const char *yaml, size_t len) {
  kfile_t *f = &l->files[fi];
  at_t a = {.l = l, .f = f};
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser))
    return bad(&a, CE_ENOMEM, NULL, "out of memory");
  yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
  int rc = CE_OK;
  if (!yaml_parser_load(&parser, &f->doc)) {
    snprintf(a.path, sizeof(a.path), "line %lu column %lu",
             (unsigned long)parser.problem_mark.line + 1,
             (unsigned long)parser.problem_mark.column + 1);
    rc = bad(&a, parser.error == YAML_MEMORY_ERROR ? CE_ENOMEM : CE_EINVAL, NULL,
             "not YAML: %s", parser.problem != NULL ? parser.problem : "syntax error");
    yaml_parser_delete(&parser);
    return rc;
  }
  f->loaded = true;
  /* One document per file, as kubectl reads it. */
  yaml_document_t extra;
  if (yaml_document_get_root_node(&f->doc) != NULL && yaml_parser_load(&parser, &extra)) {
    bool more = yaml_document_get_root_node(&extra) != NULL;
    yaml_document_delete(&extra);
    if (more)
      rc = bad(&a, CE_EINVAL, NULL, "holds more than one YAML document");
  }
  yaml_parser_delete(&parser);
  if (rc != CE_OK)
    return rc;
  if ((rc = no_duplicate_keys(&a)) != CE_OK)
    return rc;
  yaml_node_t *root = yaml_document_get_root_node(&f->doc);
  if (root == NULL || is_null(root))
    return CE_OK; /* an empty file defines nothing */
  if (root->type != YAML_MAPPING_NODE)
    return bad(&a, CE_EINVAL, NULL, "the document must be a mapping");
  yaml_node_t *cur = map_get(&f->doc, root, "current-context");
  if (!is_null(cur)) {
    if (cur->type != YAML_SCALAR_NODE)
      return bad(&a, CE_EINVAL, "current-context", "must be a string");
    if (l->current == NULL)
      l->current = (const char *)cur->data.scalar.value;
  }
  if ((rc = collect(l, fi, root, "clusters", "cluster", &l->clusters)) != CE_OK ||
      (rc = collect(l, fi, root, "users", "user", &l->users)) != CE_OK ||
      (rc = collect(l, fi, root, "contexts", "context", &l->contexts)) != CE_OK)
    return rc;
  return CE_OK;
}

/* ---- the chosen entries ---------------------------------------------------------------- */

static void at_entry(at_t *a, loader_t *l, const entry_t *e, const char *list,
                     const char *body) {
  a->l = l;
  a->f = &l->files[e->file];
  snprintf(a->path, sizeof(a->path), "%s[%zu].%s", list, e->index, body);
}

static int read_cluster(loader_t *l, const entry_t *e, ce_kube_config_t *c) {
  at_t a;
  at_entry(&a, l, e, "clusters", "cluster");
  char *server = NULL;
  int rc = get_str(&a, e->body, "server", 2048, &server);
  if (rc != CE_OK)
    return rc;
  if (server == NULL)
    return bad(&a, CE_EINVAL, "server", "is required");
  char why[256];
  rc = ce_kube_config_set_server(c, server, why, sizeof(why));
  free(server);
  if (rc != CE_OK)
    return bad(&a, rc, "server", "%s", why);
  if ((rc = get_data_or_file(&a, e->body, "certificate-authority-data",
                             "certificate-authority", &c->ca_pem, &c->ca_len)) != CE_OK ||
      (rc = get_bool(&a, e->body, "insecure-skip-tls-verify", &c->insecure)) != CE_OK ||
      (rc = get_str(&a, e->body, "tls-server-name", CE_KUBE_HOST_MAX - 1,
                    &c->tls_server_name)) != CE_OK)
    return rc;
  if (c->insecure && c->ca_pem != NULL)
    return bad(&a, CE_EINVAL, "insecure-skip-tls-verify",
               "and a certificate authority are both set; keep one");
  /* Going direct when a proxy was asked for could reach another network
   * or bypass an audit point: refused. */
  if (!is_null(map_get(&a.f->doc, e->body, "proxy-url")))
    return bad(&a, CE_EINVAL, "proxy-url",
               "is not supported (the port would connect directly)");
  return CE_OK;
}

static int read_exec(at_t *a, yaml_node_t *ex, ce_kube_config_t *c) {
  yaml_document_t *d = &a->f->doc;
  size_t base = strlen(a->path);
  snprintf(a->path + base, sizeof(a->path) - base, ".exec");
  if (ex->type != YAML_MAPPING_NODE)
    return bad(a, CE_EINVAL, NULL, "must be a mapping");
  int rc = get_str(a, ex, "apiVersion", 128, &c->exec.api_version);
  if (rc != CE_OK)
    return rc;
  if (c->exec.api_version == NULL)
    return bad(a, CE_EINVAL, "apiVersion", "is required");
  if (strcmp(c->exec.api_version, "client.authentication.k8s.io/v1") != 0 &&
      strcmp(c->exec.api_version, "client.authentication.k8s.io/v1beta1") != 0) {
    char s[SHOWN_MAX];
    return bad(a, CE_EINVAL, "apiVersion",
               "\"%s\" is not supported (client.authentication.k8s.io/v1 or v1beta1)",
               shown(s, c->exec.api_version));
  }
  char *command = NULL;
  if ((rc = get_str(a, ex, "command", PATH_MAX, &command)) != CE_OK)
    return rc;
  if (command == NULL)
    return bad(a, CE_EINVAL, "command", "is required");
  /* A relative command with a '/' is relative to the kubeconfig's
   * directory; a bare name is looked up in PATH (client-go's rule). */
  if (command[0] != '/' && strchr(command, '/') != NULL && a->f->dir != NULL) {
    size_t n = strlen(a->f->dir) + strlen(command) + 2;
    char *abs = malloc(n);
    if (abs == NULL) {
      free(command);
      return bad(a, CE_ENOMEM, "command", "out of memory");
    }
    snprintf(abs, n, "%s/%s", a->f->dir, command);
    free(command);
    command = abs;
  }
  yaml_node_t *args = map_get(d, ex, "args");
  size_t nargs = 0;
  if (!is_null(args)) {
    if (args->type != YAML_SEQUENCE_NODE) {
      free(command);
      return bad(a, CE_EINVAL, "args", "must be a list of strings");
    }
    nargs = (size_t)(args->data.sequence.items.top - args->data.sequence.items.start);
    if (nargs > CE_KUBE_EXEC_ARGS_MAX) {
      free(command);
      return bad(a, CE_EINVAL, "args", "has more than %u entries", CE_KUBE_EXEC_ARGS_MAX);
    }
  }
  c->exec.argv = calloc(nargs + 2, sizeof(char *));
  if (c->exec.argv == NULL) {
    free(command);
    return bad(a, CE_ENOMEM, "args", "out of memory");
  }
  c->exec.argv[0] = command;
  c->exec.argc = 1;
  for (size_t k = 0; k < nargs; k++) {
    yaml_node_t *v = yaml_document_get_node(d, args->data.sequence.items.start[k]);
    char field[32];
    snprintf(field, sizeof(field), "args[%zu]", k);
    if (v == NULL || v->type != YAML_SCALAR_NODE ||
        memchr(v->data.scalar.value, '\0', v->data.scalar.length) != NULL)
      return bad(a, CE_EINVAL, field, "must be a string");
    c->exec.argv[c->exec.argc] = strndup((const char *)v->data.scalar.value,
                                         v->data.scalar.length);
    if (c->exec.argv[c->exec.argc] == NULL)
      return bad(a, CE_ENOMEM, field, "out of memory");
    c->exec.argc++;
  }
  yaml_node_t *env = map_get(d, ex, "env");
  size_t nenv = 0;
  if (!is_null(env)) {
    if (env->type != YAML_SEQUENCE_NODE)
      return bad(a, CE_EINVAL, "env", "must be a list of {name, value}");
    nenv = (size_t)(env->data.sequence.items.top - env->data.sequence.items.start);
    if (nenv > CE_KUBE_EXEC_ENV_MAX)
      return bad(a, CE_EINVAL, "env", "has more than %u entries", CE_KUBE_EXEC_ENV_MAX);
  }
  c->exec.env = calloc(nenv + 1, sizeof(char *));
  if (c->exec.env == NULL)
    return bad(a, CE_ENOMEM, "env", "out of memory");
  for (size_t k = 0; k < nenv; k++) {
    yaml_node_t *v = yaml_document_get_node(d, env->data.sequence.items.start[k]);
    size_t b = strlen(a->path);
    snprintf(a->path + b, sizeof(a->path) - b, ".env[%zu]", k);
    if (v == NULL || v->type != YAML_MAPPING_NODE)
      return bad(a, CE_EINVAL, NULL, "must be a mapping with name and value");
    char *name = NULL, *value = NULL;
    rc = get_str(a, v, "name", 256, &name);
    if (rc == CE_OK)
      rc = get_str(a, v, "value", 65536, &value);
    if (rc == CE_OK && (name == NULL || name[0] == '\0' || strchr(name, '=') != NULL))
      rc = bad(a, CE_EINVAL, "name", "must be a non-empty string without '='");
    if (rc == CE_OK) {
      size_t n = strlen(name) + (value != NULL ? strlen(value) : 0) + 2;
      char *kv = malloc(n);
      if (kv == NULL)
        rc = bad(a, CE_ENOMEM, NULL, "out of memory");
      else {
        snprintf(kv, n, "%s=%s", name, value != NULL ? value : "");
        c->exec.env[c->exec.envc++] = kv;
      }
    }
    free(name);
    if (value != NULL)
      OPENSSL_clear_free(value, strlen(value));
    if (rc != CE_OK)
      return rc;
    a->path[b] = '\0';
  }
  if ((rc = get_bool(a, ex, "provideClusterInfo", &c->exec.provide_cluster_info)) != CE_OK)
    return rc;
  a->path[base] = '\0';
  return CE_OK;
}

static int read_user(loader_t *l, const entry_t *e, ce_kube_config_t *c) {
  at_t a;
  at_entry(&a, l, e, "users", "user");
  yaml_document_t *d = &a.f->doc;
  yaml_node_t *u = e->body;
  char s[SHOWN_MAX];
  /* Ways we do not support are refused, never ignored: a user that meant
   * to authenticate must not quietly become anonymous. */
  static const char *const refused[] = {"username", "password", "auth-provider",
                                        "as", "as-groups", "as-uid", "as-user-extra"};
  for (size_t k = 0; k < sizeof(refused) / sizeof(refused[0]); k++)
    if (!is_null(map_get(d, u, refused[k])))
      return bad(&a, CE_EINVAL, refused[k], "is not supported (user \"%s\")",
                 shown(s, e->name));
  int rc;
  if ((rc = get_str(&a, u, "token", 64 * 1024, &c->token)) != CE_OK ||
      (rc = get_path(&a, u, "tokenFile", &c->token_file)) != CE_OK ||
      (rc = get_data_or_file(&a, u, "client-certificate-data", "client-certificate",
                             &c->cert_pem, &c->cert_len)) != CE_OK ||
      (rc = get_data_or_file(&a, u, "client-key-data", "client-key", &c->key_pem,
                             &c->key_len)) != CE_OK)
    return rc;
  if ((c->cert_pem == NULL) != (c->key_pem == NULL))
    return bad(&a, CE_EINVAL, c->cert_pem == NULL ? "client-key" : "client-certificate",
               "is set without its %s", c->cert_pem == NULL ? "certificate" : "key");
  yaml_node_t *ex = map_get(d, u, "exec");
  int ways = (c->token != NULL) + (c->token_file != NULL) + (c->cert_pem != NULL) +
             !is_null(ex);
  /* kubectl lets a token win over a certificate; one way is clearer. */
  if (ways > 1)
    return bad(&a, CE_EINVAL, NULL,
               "sets more than one of token, tokenFile, client-certificate, exec (user "
               "\"%s\")",
               shown(s, e->name));
  if (!is_null(ex)) {
    if ((rc = read_exec(&a, ex, c)) != CE_OK)
      return rc;
    c->auth = CE_KUBE_AUTH_EXEC;
  } else if (c->token != NULL) {
    if (c->token[0] == '\0')
      return bad(&a, CE_EINVAL, "token", "is empty");
    if (!ce_kube_token_ok(c->token, strlen(c->token)))
      return bad(&a, CE_EINVAL, "token",
                 "must be printable ASCII without spaces or line breaks");
    c->auth = CE_KUBE_AUTH_TOKEN;
  } else if (c->token_file != NULL) {
    c->auth = CE_KUBE_AUTH_TOKEN_FILE;
  } else if (c->cert_pem != NULL) {
    c->auth = CE_KUBE_AUTH_CLIENT_CERT;
  }
  return CE_OK;
}

static int choose(loader_t *l, const char *context, ce_kube_config_t *c) {
  char s[SHOWN_MAX];
  const char *want = context != NULL ? context : l->current;
  if (want == NULL || want[0] == '\0')
    return fail(l->err, l->errlen, CE_EINVAL,
                "kubeconfig: no context given and no current-context set");
  entry_t *ctx = find(&l->contexts, want);
  if (ctx == NULL)
    return fail(l->err, l->errlen, CE_EINVAL, "kubeconfig: no context named \"%s\"",
                shown(s, want));
  at_t a;
  at_entry(&a, l, ctx, "contexts", "context");
  char *cluster = NULL, *user = NULL;
  int rc = get_str(&a, ctx->body, "cluster", 1024, &cluster);
  if (rc == CE_OK)
    rc = get_str(&a, ctx->body, "user", 1024, &user);
  if (rc == CE_OK)
    rc = get_str(&a, ctx->body, "namespace", 253, &c->namespace_);
  if (rc == CE_OK && cluster == NULL)
    rc = bad(&a, CE_EINVAL, "cluster", "is required");
  entry_t *ce = NULL, *ue = NULL;
  if (rc == CE_OK && (ce = find(&l->clusters, cluster)) == NULL)
    rc = bad(&a, CE_EINVAL, "cluster", "names no cluster (\"%s\")", shown(s, cluster));
  if (rc == CE_OK && user != NULL && (ue = find(&l->users, user)) == NULL)
    rc = bad(&a, CE_EINVAL, "user", "names no user (\"%s\")", shown(s, user));
  if (rc == CE_OK && ce->body == NULL) {
    at_entry(&a, l, ce, "clusters", "cluster");
    rc = bad(&a, CE_EINVAL, NULL, "is required");
  }
  if (rc == CE_OK)
    rc = read_cluster(l, ce, c);
  if (rc == CE_OK && ue != NULL && ue->body != NULL)
    rc = read_user(l, ue, c);
  if (rc == CE_OK) {
    c->context = strdup(want);
    if (c->context == NULL)
      rc = fail(l->err, l->errlen, CE_ENOMEM, "out of memory");
  }
  free(cluster);
  if (rc == CE_OK)
    c->user = user;
  else
    free(user);
  return rc;
}

static void loader_free(loader_t *l) {
  for (size_t k = 0; k < l->nfiles; k++) {
    if (l->files[k].loaded)
      yaml_document_delete(&l->files[k].doc);
    free(l->files[k].dir);
  }
  free(l->files);
  free(l->clusters.v);
  free(l->users.v);
  free(l->contexts.v);
}

static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (slash == NULL)
    return strdup(".");
  if (slash == path)
    return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

static int finish(loader_t *l, const char *context, ce_kube_config_t *out, int rc) {
  if (rc == CE_OK)
    rc = choose(l, context, out);
  loader_free(l);
  if (rc != CE_OK)
    ce_kube_config_free(out);
  return rc;
}

int ce_kube_config_parse(const char *yaml, size_t len, const char *name, const char *dir,
                         const char *context, ce_kube_config_t *out, char *err,
                         size_t errlen) {
  memset(out, 0, sizeof(*out));
  loader_t l = {.err = err, .errlen = errlen};
  l.files = calloc(1, sizeof(kfile_t));
  if (l.files == NULL)
    return fail(err, errlen, CE_ENOMEM, "out of memory");
  l.nfiles = 1;
  l.files[0].name = name;
  l.files[0].dir = dir != NULL ? strdup(dir) : NULL;
  int rc = CE_OK;
  if (dir != NULL && l.files[0].dir == NULL)
    rc = fail(err, errlen, CE_ENOMEM, "out of memory");
  if (rc == CE_OK)
    rc = load_doc(&l, 0, yaml, len);
  return finish(&l, context, out, rc);
}

int ce_kube_config_load(const char *const *paths, size_t n, const char *context,
                        ce_kube_config_t *out, char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  if (n == 0 || n > CE_KUBE_CONFIG_PATHS_MAX)
    return fail(err, errlen, CE_EINVAL, "kubeconfig: 1 to %u paths", CE_KUBE_CONFIG_PATHS_MAX);
  loader_t l = {.err = err, .errlen = errlen};
  l.files = calloc(n, sizeof(kfile_t));
  if (l.files == NULL)
    return fail(err, errlen, CE_ENOMEM, "out of memory");
  int rc = CE_OK;
  size_t found = 0;
  for (size_t k = 0; k < n && rc == CE_OK; k++) {
    l.nfiles = k + 1;
    l.files[k].name = paths[k];
    char *data = NULL;
    size_t len = 0;
    char why[2 * SHOWN_MAX];
    rc = ce_kube_read_file(paths[k], CE_KUBE_CONFIG_FILE_MAX, &data, &len, why, sizeof(why));
    if (rc == CE_ENOENT) {
      rc = CE_OK; /* kubectl skips files of $KUBECONFIG that do not exist */
      continue;
    }
    if (rc != CE_OK) {
      fail(err, errlen, rc, "kubeconfig: %s", why);
      break;
    }
    found++;
    l.files[k].dir = dir_of(paths[k]);
    if (l.files[k].dir == NULL)
      rc = fail(err, errlen, CE_ENOMEM, "out of memory");
    else
      rc = load_doc(&l, k, data, len);
    free(data);
  }
  if (rc == CE_OK && found == 0) {
    char s[SHOWN_MAX];
    rc = fail(err, errlen, CE_ENOENT, "kubeconfig: no file exists (first: \"%s\")",
              shown(s, paths[0]));
  }
  return finish(&l, context, out, rc);
}

/* ---- in-cluster ---------------------------------------------------------------------- */

int ce_kube_config_in_cluster(const char *dir, const char *host, unsigned port,
                              ce_kube_config_t *out, char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  if (dir == NULL)
    dir = DEFAULT_SA_DIR;
  if (host == NULL)
    host = getenv("KUBERNETES_SERVICE_HOST");
  if (host == NULL || host[0] == '\0')
    return fail(err, errlen, CE_EINVAL,
                "in_cluster: no host given and KUBERNETES_SERVICE_HOST is not set");
  if (port == 0) {
    const char *ps = getenv("KUBERNETES_SERVICE_PORT");
    char *end = NULL;
    unsigned long v = ps != NULL ? strtoul(ps, &end, 10) : 0;
    if (ps == NULL || *ps == '\0' || *end != '\0' || v < 1 || v > 65535)
      return fail(err, errlen, CE_EINVAL,
                  "in_cluster: no port given and KUBERNETES_SERVICE_PORT is not a port");
    port = (unsigned)v;
  }
  size_t hl = strlen(host);
  if (hl >= CE_KUBE_HOST_MAX)
    return fail(err, errlen, CE_EINVAL, "in_cluster: the host is too long");
  char url[CE_KUBE_HOST_MAX + 32];
  bool v6 = strchr(host, ':') != NULL && host[0] != '[';
  snprintf(url, sizeof(url), "https://%s%s%s:%u", v6 ? "[" : "", host, v6 ? "]" : "", port);
  char why[512];
  int rc = ce_kube_config_set_server(out, url, why, sizeof(why));
  if (rc != CE_OK) {
    fail(err, errlen, rc, "in_cluster: %s", why);
    goto fail;
  }
  size_t dl = strlen(dir) + 16;
  char *path = malloc(dl);
  if (path == NULL) {
    rc = fail(err, errlen, CE_ENOMEM, "out of memory");
    goto fail;
  }
  snprintf(path, dl, "%s/ca.crt", dir);
  rc = ce_kube_read_file(path, CE_KUBE_SECRET_FILE_MAX, &out->ca_pem, &out->ca_len, why,
                         sizeof(why));
  if (rc != CE_OK) {
    free(path);
    fail(err, errlen, rc, "in_cluster: %s", why);
    goto fail;
  }
  snprintf(path, dl, "%s/namespace", dir);
  char *ns = NULL;
  size_t nl = 0;
  if (ce_kube_read_file(path, 256, &ns, &nl, why, sizeof(why)) == CE_OK) {
    while (nl > 0 && (ns[nl - 1] == '\n' || ns[nl - 1] == ' '))
      ns[--nl] = '\0';
    if (nl > 0)
      out->namespace_ = ns;
    else
      free(ns);
  }
  snprintf(path, dl, "%s/token", dir);
  out->token_file = path;
  out->auth = CE_KUBE_AUTH_TOKEN_FILE;
  return CE_OK;
fail:
  ce_kube_config_free(out);
  return rc;
}
