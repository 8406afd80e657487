/*
 * The operations (ops.h). Arguments are decoded from a packet that
 * ce_etf_check() accepted, so the readers cannot leave it; what they
 * refuse is the caller's mistake and is answered with badarg (a term of
 * the wrong type or shape) or inval (the right type, a value out of
 * range), with a message naming the argument.
 */
#include "port/ops.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/text.h"
#include "control/listen.h"
#include "policy/policy.h"
#include "port/channel.h"
#include "port/etf.h"
#include "port/json_term.h"
#include "port/kube_ops.h"
#include "tls/ca.h"

#ifndef CE_VERSION
#define CE_VERSION "0.0.0-dev"
#endif

/* Longest option name in CaOpts and AttachOpts, NUL included. */
#define OPT_NAME_MAX 32
/* Longest host in {tcp, Host, Port}: an IPv6 literal with brackets. */
#define HOST_MAX 64

#define BADARG(...) ce__port_reply_error(p, id, CE__PORT_BADARG, __VA_ARGS__)

/* Shows user text in a message: one line, no control bytes, shortened. */
static const char *shown(char *dst, size_t cap, const char *s, size_t n) {
  ce_text_sanitize(dst, cap, s, n, 1);
  return dst;
}

/* ---- version ------------------------------------------------------------------ */

static void op_version(ce_port_t *p, const char *buf, int i, uint64_t id) {
  ei_x_buff x;
  if (ce__port_reply_begin(&x, id) != 0 || ei_x_encode_tuple_header(&x, 2) != 0 ||
      ei_x_encode_atom(&x, "ok") != 0 || ei_x_encode_map_header(&x, 2) != 0 ||
      ei_x_encode_atom(&x, "version") != 0 || ce_etf_encode_text(&x, CE_VERSION) != 0 ||
      ei_x_encode_atom(&x, "protocol") != 0 || ei_x_encode_long(&x, CE_PORT_PROTOCOL) != 0) {
    ei_x_free(&x);
    ce__port_reply_error(p, id, CE_ENOMEM, "version: out of memory");
    return;
  }
  ce__port_send(p, &x);
}

/* ---- token_new ------------------------------------------------------------------ */

static void op_token_new(ce_port_t *p, const char *buf, int i, uint64_t id) {
  uint64_t bytes = 0;
  if (!ce_etf_u64(buf, &i, &bytes)) {
    BADARG("token_new: Bytes must be an integer from %u to %u", CE_PORT_TOKEN_MIN,
           CE_PORT_TOKEN_MAX);
    return;
  }
  if (bytes < CE_PORT_TOKEN_MIN || bytes > CE_PORT_TOKEN_MAX) {
    ce__port_reply_error(p, id, CE_EINVAL,
                         "token_new: Bytes must be %u to %u, not %llu",
                         CE_PORT_TOKEN_MIN, CE_PORT_TOKEN_MAX,
                         (unsigned long long)bytes);
    return;
  }
  unsigned char raw[CE_PORT_TOKEN_MAX];
  char hex[2 * CE_PORT_TOKEN_MAX + 1];
  if (RAND_bytes(raw, (int)bytes) != 1) {
    ce__port_reply_error(p, id, CE_ETLS,
                         "token_new: OpenSSL's random generator failed");
    return;
  }
  static const char digits[] = "0123456789abcdef";
  for (size_t k = 0; k < bytes; k++) {
    hex[2 * k] = digits[raw[k] >> 4];
    hex[2 * k + 1] = digits[raw[k] & 15];
  }
  hex[2 * bytes] = '\0';
  OPENSSL_cleanse(raw, sizeof(raw));
  ei_x_buff x;
  if (ce__port_reply_begin(&x, id) != 0 || ei_x_encode_tuple_header(&x, 2) != 0 ||
      ei_x_encode_atom(&x, "ok") != 0 || ce_etf_encode_text(&x, hex) != 0) {
    ei_x_free(&x);
    OPENSSL_cleanse(hex, sizeof(hex));
    ce__port_reply_error(p, id, CE_ENOMEM, "token_new: out of memory");
    return;
  }
  OPENSSL_cleanse(hex, sizeof(hex));
  ce__port_send(p, &x);
}

/* ---- files ----------------------------------------------------------------------- */

/* Writes data to path with mode, then flushes it to disk. With excl the
 * file must not exist (O_EXCL, which also refuses a symbolic link, so
 * nothing is written through a link planted at the path); without, an
 * existing regular file is truncated and given the mode. O_NOFOLLOW
 * refuses a link in either case. On failure a file this call created is
 * removed. Returns CE_OK or CE_EIO with err naming the path. */
static int write_file(const char *path, mode_t mode, bool excl, const char *data, size_t len,
                      char *err, size_t errlen) {
  char where[4 * CE_TEXT_QUOTE_MAX + 8];
  shown(where, sizeof(where), path, strlen(path));
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (excl ? O_EXCL : O_TRUNC);
  int fd = open(path, flags, mode);
  if (fd < 0) {
    if (errno == EEXIST)
      snprintf(err, errlen, "\"%s\" already exists; refusing to overwrite it", where);
    else
      snprintf(err, errlen, "cannot create \"%s\": %s", where, strerror(errno));
    return CE_EIO;
  }
  int e = 0;
  if (!excl && fchmod(fd, mode) != 0)
    e = errno;
  size_t done = 0;
  while (e == 0 && done < len) {
    ssize_t n = write(fd, data + done, len - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      e = n < 0 ? errno : EIO;
    else
      done += (size_t)n;
  }
  if (e == 0 && fsync(fd) != 0)
    e = errno;
  if (close(fd) != 0 && e == 0)
    e = errno;
  if (e != 0) {
    unlink(path);
    snprintf(err, errlen, "cannot write \"%s\": %s", where, strerror(e));
    return CE_EIO;
  }
  return CE_OK;
}

/* ---- ca_new ---------------------------------------------------------------------- */

typedef struct {
  char *common_name;
  uint64_t days;
  bool has_days;
  char *cert_path;
  char *key_path;
} ca_opts_t;

static void ca_opts_free(ca_opts_t *o) {
  free(o->common_name);
  free(o->cert_path);
  free(o->key_path);
}

/* Decodes CaOpts; on failure replies and returns false. */
static bool ca_opts_decode(ce_port_t *p, const char *buf, int i, uint64_t id, ca_opts_t *o) {
  int pairs = 0;
  if (!ce_etf_map(buf, &i, &pairs)) {
    BADARG("ca_new: CaOpts must be a map");
    return false;
  }
  for (int k = 0; k < pairs; k++) {
    char name[OPT_NAME_MAX];
    if (!ce_etf_key(buf, &i, name, sizeof name)) {
      BADARG("ca_new: CaOpts keys must be atoms or binaries naming an option");
      return false;
    }
    const char *why = NULL;
    char **slot = NULL;
    if (strcmp(name, "common_name") == 0)
      slot = &o->common_name;
    else if (strcmp(name, "cert_path") == 0)
      slot = &o->cert_path;
    else if (strcmp(name, "key_path") == 0)
      slot = &o->key_path;
    if (slot != NULL) {
      /* A common name of 64 characters is at most 256 bytes of UTF-8. */
      size_t max = slot == &o->common_name ? 4 * CE_CA_COMMON_NAME_MAX : CE_PORT_PATH_MAX;
      free(*slot);
      *slot = ce_etf_string(buf, &i, max, &why);
      if (*slot == NULL) {
        if (slot == &o->common_name)
          BADARG("ca_new: common_name %s (1 to %u characters, no NUL)", why,
                 CE_CA_COMMON_NAME_MAX);
        else
          BADARG("ca_new: %s %s (1 to %u bytes, no NUL)", name, why, CE_PORT_PATH_MAX);
        return false;
      }
    } else if (strcmp(name, "days") == 0) {
      if (!ce_etf_u64(buf, &i, &o->days)) {
        BADARG("ca_new: days must be an integer from 1 to %u", CE_CA_MAX_DAYS);
        return false;
      }
      o->has_days = true;
    } else {
      char s[4 * OPT_NAME_MAX];
      BADARG("ca_new: unknown option \"%s\" (expected common_name, days, cert_path, "
             "key_path)",
             shown(s, sizeof(s), name, strlen(name)));
      return false;
    }
  }
  if (o->common_name == NULL) {
    BADARG("ca_new: common_name is required");
    return false;
  }
  if (!o->has_days) {
    BADARG("ca_new: days is required");
    return false;
  }
  return true;
}

static void op_ca_new(ce_port_t *p, const char *buf, int i, uint64_t id) {
  ca_opts_t o = {0};
  char err[CE_PORT_MSG_MAX];
  char *cert_pem = NULL, *key_pem = NULL;
  size_t cert_len = 0, key_len = 0;
  bool key_written = false;
  if (!ca_opts_decode(p, buf, i, id, &o))
    goto done;
  if (!ce_ca_common_name_ok(o.common_name)) {
    char s[4 * CE_TEXT_QUOTE_MAX + 8];
    ce__port_reply_error(p, id, CE_EINVAL,
                         "ca_new: common_name \"%s\" must be 1 to %u printable UTF-8 "
                         "characters",
                         shown(s, sizeof(s), o.common_name, strlen(o.common_name)),
                         CE_CA_COMMON_NAME_MAX);
    goto done;
  }
  if (o.days < 1 || o.days > CE_CA_MAX_DAYS) {
    ce__port_reply_error(p, id, CE_EINVAL, "ca_new: days must be 1 to %u, not %llu",
                         CE_CA_MAX_DAYS, (unsigned long long)o.days);
    goto done;
  }
  if (o.cert_path != NULL && o.key_path != NULL && strcmp(o.cert_path, o.key_path) == 0) {
    ce__port_reply_error(p, id, CE_EINVAL,
                         "ca_new: cert_path and key_path name the same file");
    goto done;
  }
  int rc = ce_ca_generate_pem(o.common_name, (unsigned)o.days, &cert_pem, &cert_len,
                              &key_pem, &key_len, err, sizeof(err));
  if (rc != CE_OK) {
    ce__port_reply_error(p, id, rc, "ca_new: %s", err);
    goto done;
  }
  /* The key first, as `ca new` does: a certificate never exists without
   * its key, and the key is removed again if the certificate fails. */
  if (o.key_path != NULL) {
    rc = write_file(o.key_path, 0600, true, key_pem, key_len, err, sizeof(err));
    if (rc != CE_OK) {
      ce__port_reply_error(p, id, rc, "ca_new: key_path: %s", err);
      goto done;
    }
    key_written = true;
  }
  if (o.cert_path != NULL) {
    rc = write_file(o.cert_path, 0644, true, cert_pem, cert_len, err, sizeof(err));
    if (rc != CE_OK) {
      /* Removed before the reply goes out: the BEAM may look at once. */
      if (key_written)
        unlink(o.key_path);
      ce__port_reply_error(p, id, rc, "ca_new: cert_path: %s", err);
      goto done;
    }
  }
  ei_x_buff x;
  if (ce__port_reply_begin(&x, id) != 0 || ei_x_encode_tuple_header(&x, 2) != 0 ||
      ei_x_encode_atom(&x, "ok") != 0 || ei_x_encode_map_header(&x, 2) != 0 ||
      ei_x_encode_atom(&x, "cert_pem") != 0 ||
      ei_x_encode_binary(&x, cert_pem, (int)cert_len) != 0 ||
      ei_x_encode_atom(&x, "key_pem") != 0 ||
      ei_x_encode_binary(&x, key_pem, (int)key_len) != 0) {
    ei_x_free(&x);
    ce__port_reply_error(p, id, CE_ENOMEM, "ca_new: out of memory");
    goto done;
  }
  ce__port_send(p, &x);
done:
  if (key_pem != NULL)
    OPENSSL_clear_free(key_pem, key_len);
  free(cert_pem);
  ca_opts_free(&o);
}

/* ---- policy_write ------------------------------------------------------------------ */

static void op_policy_write(ce_port_t *p, const char *buf, int i, uint64_t id) {
  const char *why = NULL;
  char *path = ce_etf_string(buf, &i, CE_PORT_PATH_MAX, &why);
  if (path == NULL) {
    BADARG("policy_write: Path %s (1 to %u bytes, no NUL)", why, CE_PORT_PATH_MAX);
    return;
  }
  const char *json = NULL;
  size_t json_len = 0;
  char *tmp = NULL;
  if (!ce_etf_binary(buf, &i, &json, &json_len)) {
    BADARG("policy_write: Json must be a binary");
    goto done;
  }
  /* The sidecar's own loader decides: a policy it would refuse at start-up
   * is refused now, with its message, while the BEAM can still say so. */
  ce_policy_t *policy = NULL;
  ce_policy_error_t perr;
  int rc = ce_policy_load_buffer(json, json_len, &policy, &perr);
  ce_policy_free(policy);
  if (rc != CE_OK) {
    ce__port_reply_error(p, id, rc == CE_ENOMEM ? CE_ENOMEM : CE_EINVAL, "policy: %s",
                         perr.message);
    goto done;
  }
  size_t n = strlen(path);
  tmp = malloc(n + sizeof(".tmp"));
  if (tmp == NULL) {
    ce__port_reply_error(p, id, CE_ENOMEM, "policy_write: out of memory");
    goto done;
  }
  memcpy(tmp, path, n);
  memcpy(tmp + n, ".tmp", sizeof(".tmp"));
  char err[CE_PORT_MSG_MAX];
  /* Written aside and renamed, so a sidecar that reads the path sees the
   * old policy or the new one, never half of one. */
  rc = write_file(tmp, 0600, false, json, json_len, err, sizeof(err));
  if (rc != CE_OK) {
    ce__port_reply_error(p, id, rc, "policy_write: %s", err);
    goto done;
  }
  if (rename(tmp, path) != 0) {
    int e = errno;
    char where[4 * CE_TEXT_QUOTE_MAX + 8];
    /* Removed before the reply goes out: the BEAM may look at once. */
    unlink(tmp);
    ce__port_reply_error(p, id, CE_EIO, "policy_write: cannot rename to \"%s\": %s",
                         shown(where, sizeof(where), path, n), strerror(e));
    goto done;
  }
  ce__port_reply_ok(p, id);
done:
  free(tmp);
  free(path);
}

/* ---- control_attach / control_send / control_detach ---------------------------------- */

/* Decodes Address into a->listen (control/listen.h's grammar, which also
 * enforces loopback) and a->shown. On failure replies and returns false. */
static bool address_decode(ce_port_t *p, const char *buf, int *i, uint64_t id,
                           ce__attach_t *a) {
  int arity = 0;
  char kind[CE_ETF_ATOM_MAX];
  if (!ce_etf_tuple(buf, i, &arity) || arity < 2 || !ce_etf_atom(buf, i, kind) ||
      !((strcmp(kind, "unix") == 0 && arity == 2) || (strcmp(kind, "tcp") == 0 && arity == 3))) {
    BADARG("control_attach: Address must be {unix, Path} or {tcp, Host, PortNumber}");
    return false;
  }
  const char *s = NULL;
  size_t n = 0;
  char text[4 * CE_TEXT_QUOTE_MAX + 8];
  if (strcmp(kind, "unix") == 0) {
    if (!ce_etf_binary(buf, i, &s, &n) || n == 0 || memchr(s, '\0', n) != NULL) {
      BADARG("control_attach: the Unix socket Path must be a non-empty binary without NUL");
      return false;
    }
    if (n >= CE__LISTEN_PATH_MAX) {
      ce__port_reply_error(p, id, CE_EINVAL,
                           "control_attach: the Unix socket path is longer than %d bytes",
                           CE__LISTEN_PATH_MAX - 1);
      return false;
    }
    snprintf(a->listen, sizeof(a->listen), "unix:%.*s", (int)n, s);
    snprintf(a->shown, sizeof(a->shown), "unix:%s", shown(text, sizeof(text), s, n));
  } else {
    uint64_t port = 0;
    if (!ce_etf_binary(buf, i, &s, &n) || n == 0 || n >= HOST_MAX ||
        memchr(s, '\0', n) != NULL) {
      BADARG("control_attach: Host must be a binary of 1 to %d bytes", HOST_MAX - 1);
      return false;
    }
    if (!ce_etf_u64(buf, i, &port) || port < 1 || port > 65535) {
      BADARG("control_attach: PortNumber must be an integer from 1 to 65535");
      return false;
    }
    char host[HOST_MAX];
    memcpy(host, s, n);
    host[n] = '\0';
    if (strcmp(host, "localhost") == 0) {
      /* Not resolved: "localhost" means the IPv4 loopback, as the
       * sidecar's default listen address does. */
      strcpy(host, "127.0.0.1");
    } else if (host[0] == '[' && n > 2 && host[n - 1] == ']') {
      memmove(host, host + 1, n - 2);
      host[n - 2] = '\0';
    }
    if (strchr(host, ':') != NULL)
      snprintf(a->listen, sizeof(a->listen), "[%s]:%u", host, (unsigned)port);
    else
      snprintf(a->listen, sizeof(a->listen), "%s:%u", host, (unsigned)port);
    snprintf(a->shown, sizeof(a->shown), "%s:%u", shown(text, sizeof(text), s, n),
             (unsigned)port);
  }
  /* The same grammar and loopback rule as the sidecar's listener: the
   * token travels in clear text, so the port never sends it off the
   * machine (DESIGN §5). */
  ce__listen_addr_t parsed;
  char why[160];
  if (ce__listen_parse(a->listen, &parsed, why, sizeof(why)) != CE_OK) {
    const char *msg = strncmp(why, "listen: ", 8) == 0 ? why + 8 : why;
    ce__port_reply_error(p, id, CE_EINVAL, "control_attach: address %s: %s", a->shown, msg);
    return false;
  }
  return true;
}

static bool is_lower_hex(const char *s, size_t n) {
  for (size_t k = 0; k < n; k++)
    if (!((s[k] >= '0' && s[k] <= '9') || (s[k] >= 'a' && s[k] <= 'f')))
      return false;
  return true;
}

static void op_attach(ce_port_t *p, const char *buf, int i, uint64_t id) {
  ce__attach_t a;
  memset(&a, 0, sizeof(a));
  a.timeout_ms = CE_PORT_ATTACH_TIMEOUT_DEFAULT;
  a.window = CE_PORT_WINDOW_DEFAULT;
  if (!address_decode(p, buf, &i, id, &a))
    return;
  const char *s = NULL;
  size_t n = 0;
  if (!ce_etf_binary(buf, &i, &s, &n)) {
    BADARG("control_attach: Token must be a binary");
    return;
  }
  if (n < 2 * CE_PORT_TOKEN_MIN || n > 2 * CE_PORT_TOKEN_MAX || n % 2 != 0 ||
      !is_lower_hex(s, n)) {
    ce__port_reply_error(p, id, CE_EINVAL,
                         "control_attach: Token must be %u to %u lowercase hex "
                         "digits (%u to %u bytes)",
                         2 * CE_PORT_TOKEN_MIN, 2 * CE_PORT_TOKEN_MAX,
                         CE_PORT_TOKEN_MIN, CE_PORT_TOKEN_MAX);
    return;
  }
  memcpy(a.token, s, n);
  a.token[n] = '\0';
  int pairs = 0;
  if (!ce_etf_map(buf, &i, &pairs)) {
    BADARG("control_attach: AttachOpts must be a map");
    return;
  }
  for (int k = 0; k < pairs; k++) {
    char name[OPT_NAME_MAX];
    uint64_t v = 0;
    if (!ce_etf_key(buf, &i, name, sizeof name)) {
      BADARG("control_attach: AttachOpts keys must be atoms or binaries");
      return;
    }
    if (strcmp(name, "session_id") == 0) {
      /* The session the sidecar must prove it gates; part of both proofs. */
      if (!ce_etf_binary(buf, &i, &s, &n) || n == 0 || n > CE_CONTROL_SESSION_ID_MAX ||
          memchr(s, '\0', n) != NULL) {
        BADARG("control_attach: session_id must be a binary of 1 to %u bytes without NUL",
               CE_CONTROL_SESSION_ID_MAX);
        return;
      }
      memcpy(a.session_id, s, n);
      a.session_id[n] = '\0';
      continue;
    }
    bool is_timeout = strcmp(name, "timeout") == 0;
    if (!is_timeout && strcmp(name, "window") != 0) {
      char t[4 * OPT_NAME_MAX];
      BADARG("control_attach: unknown option \"%s\" (expected session_id, timeout, window)",
             shown(t, sizeof(t), name, strlen(name)));
      return;
    }
    if (!ce_etf_u64(buf, &i, &v)) {
      BADARG("control_attach: %s must be a positive integer", name);
      return;
    }
    uint32_t max = is_timeout ? CE_PORT_ATTACH_TIMEOUT_MAX : CE_PORT_WINDOW_MAX;
    if (v < 1 || v > max) {
      ce__port_reply_error(p, id, CE_EINVAL,
                           "control_attach: %s must be 1 to %u, not %llu", name, max,
                           (unsigned long long)v);
      return;
    }
    if (is_timeout)
      a.timeout_ms = (uint32_t)v;
    else
      a.window = (uint32_t)v;
  }
  if (a.session_id[0] == '\0') {
    BADARG("control_attach: AttachOpts must name the session_id");
    OPENSSL_cleanse(a.token, sizeof(a.token));
    return;
  }
  ce__chan_attach(p, id, &a);
  OPENSSL_cleanse(a.token, sizeof(a.token));
}

/* The Frame of control_send or post, at buf[i], converted and sent. */
static void send_frame(ce_port_t *p, const ce__send_to_t *to, uint64_t chan, const char *buf,
                       int i, const char *name) {
  if ((unsigned char)buf[i] != ERL_MAP_EXT) {
    ce__chan_send_error(p, to, chan, CE__PORT_BADARG, "%s: Frame must be a map", name);
    return;
  }
  char err[CE_PORT_MSG_MAX];
  json_t *frame = NULL;
  int rc = ce_term_to_json(buf, &i, "frame", &frame, err, sizeof(err));
  if (rc != CE_OK) {
    ce__chan_send_error(p, to, chan, rc == CE_EINVAL ? CE__PORT_BADARG : rc, "%s: %s", name,
                        err);
    return;
  }
  ce__chan_send(p, to, chan, frame);
}

static void op_send(ce_port_t *p, const char *buf, int i, uint64_t id) {
  uint64_t chan = 0;
  if (!ce_etf_u64(buf, &i, &chan) || chan == 0) {
    BADARG("control_send: Chan must be a positive integer");
    return;
  }
  ce__send_to_t to = {.post = false, .id = id};
  send_frame(p, &to, chan, buf, i, "control_send");
}

void ce__port_post(ce_port_t *p, const char *buf, const ce_port_request_t *req) {
  ce__send_to_t to = {.post = true,
                      .tag = buf + req->args,
                      .tag_len = (size_t)(req->frame - req->args)};
  send_frame(p, &to, req->chan, buf, req->frame, "post");
}

static void op_detach(ce_port_t *p, const char *buf, int i, uint64_t id) {
  uint64_t chan = 0;
  if (!ce_etf_u64(buf, &i, &chan) || chan == 0) {
    BADARG("control_detach: Chan must be a positive integer");
    return;
  }
  ce__chan_detach(p, id, chan);
}

/* ---- dispatch --------------------------------------------------------------------- */

typedef void (*op_fn)(ce_port_t *p, const char *buf, int i, uint64_t id);

static const struct {
  const char *name;
  int argc;
  const char *args; /* for the arity message */
  op_fn run;
} OPS[] = {
    {"version", 0, "{version}", op_version},
    {"token_new", 1, "{token_new, Bytes}", op_token_new},
    {"ca_new", 1, "{ca_new, CaOpts}", op_ca_new},
    {"policy_write", 2, "{policy_write, Path, Json}", op_policy_write},
    {"control_attach", 3, "{control_attach, Address, Token, AttachOpts}", op_attach},
    {"control_send", 2, "{control_send, Chan, Frame}", op_send},
    {"control_detach", 1, "{control_detach, Chan}", op_detach},
    {"kube_open", 1, "{kube_open, KubeOpts}", ce__op_kube_open},
    {"kube_close", 1, "{kube_close, Kube}", ce__op_kube_close},
    {"kube_request", 2, "{kube_request, Kube, Req}", ce__op_kube_request},
    {"kube_exec", 2, "{kube_exec, Kube, ExecReq}", ce__op_kube_exec},
    {"kube_forward", 2, "{kube_forward, Kube, FwdReq}", ce__op_kube_forward},
    {"kube_forward_close", 1, "{kube_forward_close, FChan}", ce__op_kube_forward_close},
};

void ce__port_call(ce_port_t *p, const char *buf, const ce_port_request_t *req) {
  uint64_t id = req->id;
  for (size_t k = 0; k < sizeof(OPS) / sizeof(OPS[0]); k++) {
    if (strcmp(OPS[k].name, req->op) != 0)
      continue;
    if (req->argc != OPS[k].argc) {
      BADARG("%s takes %d argument%s: %s", OPS[k].name, OPS[k].argc,
             OPS[k].argc == 1 ? "" : "s", OPS[k].args);
      return;
    }
    OPS[k].run(p, buf, req->args, id);
    return;
  }
  char s[4 * CE_TEXT_QUOTE_MAX + 8];
  BADARG("unknown operation \"%s\"", shown(s, sizeof(s), req->op, strlen(req->op)));
}
