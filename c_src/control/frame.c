/*
 * The control channel's frames: the strict parser of what the peer sends
 * (control.h) and the encoder of what the sidecar sends (frame.h).
 *
 * The parser runs on bytes from a socket that any process in the pod can
 * reach before it authenticates, so it is written to be fuzzed: it bounds
 * the size and the nesting depth before jansson sees the text, refuses
 * duplicate members (two "proof" members must not let the checker and a
 * later reader disagree), and copies what it keeps into fixed buffers.
 */
#include "control/frame.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/json.h"
#include "common/jsonw.h"
#include "control/control.h"
#include "control/handshake.h"

/* Frames are flat objects; unknown members may nest a little for future
 * extensions, but nothing this protocol will ever need goes deeper. The
 * bound keeps jansson's recursive parser far from the stack's end. */
#define FRAME_MAX_DEPTH 16
/* A uint64 has at most 20 decimal digits (18446744073709551615). */
#define ID_MAX_DIGITS 20

/* ---- parsing -------------------------------------------------------------- */

/* Counts nesting outside strings. jansson parses the text again anyway, so
 * this scan only has to be right about valid JSON; on anything else it
 * either refuses early or lets jansson refuse. */
static bool depth_within(const char *s, size_t n, int max) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max)
        return false;
    } else if (c == '}' || c == ']') {
      depth--;
    }
  }
  return true;
}

/* A member that may be absent: JSON null counts as absent, because
 * encoders (Elixir's Jason among them) write nil as null. */
static json_t *optional(json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  return json_is_null(v) ? NULL : v;
}

bool ce__frame_hex(json_t *obj, const char *key, uint8_t *out, size_t n) {
  json_t *v = json_object_get(obj, key);
  return json_is_string(v) &&
         ce_control_unhex(json_string_value(v), json_string_length(v), out, n);
}

/* The canonical decimal form of a uint64: digits only, no sign, no leading
 * zero (other than "0" itself), no overflow. One spelling per id means the
 * sidecar and the peer cannot disagree about which ask an answer is for. */
static bool parse_id(const char *s, size_t n, uint64_t *out) {
  if (n == 0 || n > ID_MAX_DIGITS || (n > 1 && s[0] == '0'))
    return false;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    uint64_t d = (uint64_t)(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10)
      return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

static int refuse(const char **why, const char *msg) {
  if (why != NULL)
    *why = msg;
  return CE_EPARSE;
}

static int parse_hello(json_t *root, ce_frame_t *f, const char **why) {
  json_t *version = json_object_get(root, "version");
  if (version == NULL)
    return refuse(why, "hello: missing \"version\"");
  if (!json_is_integer(version))
    return refuse(why, "hello: \"version\" must be an integer");
  if (json_integer_value(version) != CE_CONTROL_PROTOCOL_VERSION)
    return refuse(why, "hello: unsupported version");

  json_t *sid = json_object_get(root, "session_id");
  if (sid == NULL)
    return refuse(why, "hello: missing \"session_id\"");
  if (!json_is_string(sid))
    return refuse(why, "hello: \"session_id\" must be a string");
  size_t n = json_string_length(sid);
  if (n == 0 || n > CE_CONTROL_SESSION_ID_MAX)
    return refuse(why, "hello: \"session_id\" must be 1 to 256 bytes");

  if (!ce__frame_hex(root, "nonce", f->nonce, CE_CONTROL_NONCE_LEN))
    return refuse(why, "hello: \"nonce\" must be 64 lowercase hex digits");
  json_t *ticket = json_object_get(root, "ticket");
  f->has_ticket = ticket != NULL && !json_is_null(ticket);
  if (f->has_ticket && !ce__frame_hex(root, "ticket", f->ticket, CE_CONTROL_PROOF_LEN))
    return refuse(why, "hello: \"ticket\" must be 64 lowercase hex digits");

  f->type = CE_FRAME_HELLO;
  f->version = CE_CONTROL_PROTOCOL_VERSION;
  memcpy(f->session_id, json_string_value(sid), n);
  f->session_id[n] = '\0';
  return CE_OK;
}

static int parse_auth(json_t *root, ce_frame_t *f, const char **why) {
  if (!ce__frame_hex(root, "proof", f->proof, CE_CONTROL_PROOF_LEN))
    return refuse(why, "auth: \"proof\" must be 64 lowercase hex digits");
  f->type = CE_FRAME_AUTH;
  return CE_OK;
}

static int parse_decision(json_t *root, ce_frame_t *f, const char **why) {
  json_t *id = json_object_get(root, "id");
  if (id == NULL)
    return refuse(why, "decision: missing \"id\"");
  if (!json_is_string(id) ||
      !parse_id(json_string_value(id), json_string_length(id), &f->id))
    return refuse(why, "decision: \"id\" must be a decimal string of a uint64");

  json_t *decision = json_object_get(root, "decision");
  if (decision == NULL)
    return refuse(why, "decision: missing \"decision\"");
  const char *d = json_string_value(decision); /* NULL unless a string */
  if (d != NULL && strcmp(d, "allow") == 0)
    f->allow = true;
  else if (d != NULL && strcmp(d, "deny") == 0)
    f->allow = false;
  else
    return refuse(why, "decision: \"decision\" must be \"allow\" or \"deny\"");

  f->reason[0] = '\0';
  json_t *reason = optional(root, "reason");
  if (reason != NULL) {
    if (!json_is_string(reason))
      return refuse(why, "decision: \"reason\" must be a string");
    size_t n = json_string_length(reason);
    /* Refused rather than cut: a cut could split a UTF-8 sequence, and a
     * peer that sends a long reason has a bug worth seeing. */
    if (n > CE_CONTROL_MAX_REASON)
      return refuse(why, "decision: \"reason\" is longer than 512 bytes");
    memcpy(f->reason, json_string_value(reason), n);
    f->reason[n] = '\0';
  }

  /* Absent means "do not cache": the sidecar's cache is per rule and host,
   * so only a peer that says an answer covers the whole host may fill it. */
  f->cacheable = false;
  json_t *cache = optional(root, "cache");
  if (cache != NULL) {
    if (!json_is_boolean(cache))
      return refuse(why, "decision: \"cache\" must be a boolean");
    f->cacheable = json_is_true(cache);
  }
  f->type = CE_FRAME_DECISION;
  return CE_OK;
}

/* {"type":"credential","name":..,"value":..}: a rotated secret. The
 * value's bytes are checked by the proxy (policy/credential.h); here only
 * that both are strings of a bounded length. */
static int parse_credential(json_t *root, ce_frame_t *f, const char **why) {
  json_t *name = json_object_get(root, "name");
  json_t *value = json_object_get(root, "value");
  if (name == NULL || !json_is_string(name))
    return refuse(why, "credential: \"name\" must be a string");
  if (value == NULL || !json_is_string(value))
    return refuse(why, "credential: \"value\" must be a string");
  size_t nl = json_string_length(name), vl = json_string_length(value);
  if (nl == 0 || nl > CE_CONTROL_SECRET_NAME_MAX)
    return refuse(why, "credential: \"name\" must be 1 to 128 bytes");
  if (vl == 0 || vl > CE_CONTROL_SECRET_VALUE_MAX)
    return refuse(why, "credential: \"value\" must be 1 to 8192 bytes");
  memcpy(f->secret_name, json_string_value(name), nl + 1);
  memcpy(f->secret_value, json_string_value(value), vl + 1);
  f->secret_value_len = vl;
  f->type = CE_FRAME_CREDENTIAL;
  return CE_OK;
}

int ce__frame_load(const char *line, size_t len, json_t **root, const char **why) {
  if (why != NULL)
    *why = NULL;
  if (len > CE_CONTROL_MAX_FRAME) {
    if (why != NULL)
      *why = "frame longer than 1 MiB";
    return CE_ETOOBIG;
  }
  if (!depth_within(line, len, FRAME_MAX_DEPTH))
    return refuse(why, "frame nested deeper than 16");

  /* jansson refuses "\u0000" inside strings unless told otherwise, so every
   * string copied out is free of NUL bytes and its C length is its JSON
   * length. It also checks UTF-8. */
  json_error_t jerr;
  /* jansson may hide a failed allocation, even behind a successful parse
   * with a byte missing from a string (common/json.h). */
  ce_json_oom_reset();
  json_t *v = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
  if (ce_json_oom()) {
    json_decref(v);
    if (why != NULL)
      *why = "out of memory";
    return CE_ENOMEM;
  }
  if (v == NULL && json_error_code(&jerr) == json_error_duplicate_key)
    return refuse(why, "duplicate member");
  if (v == NULL)
    return refuse(why, "not valid JSON");
  if (!json_is_object(v)) {
    json_decref(v);
    return refuse(why, "frame is not a JSON object");
  }
  *root = v;
  return CE_OK;
}

/* Nesting of a value as depth_within() counts it in the text: each
 * object or array one level, the root's included. */
static bool json_depth_within(const json_t *v, int depth, int max) {
  if (json_is_object(v)) {
    if (++depth > max)
      return false;
    const char *key;
    json_t *member;
    json_object_foreach((json_t *)v, key, member) {
      if (!json_depth_within(member, depth, max))
        return false;
    }
  } else if (json_is_array(v)) {
    if (++depth > max)
      return false;
    for (size_t i = 0; i < json_array_size(v); i++)
      if (!json_depth_within(json_array_get(v, i), depth, max))
        return false;
  }
  return true;
}

static int frame_from_root(json_t *root, ce_frame_t *out, const char **why);

int ce_control_frame_parse(const char *line, size_t len, ce_frame_t *out,
                           const char **why) {
  json_t *root = NULL;
  int rc = ce__frame_load(line, len, &root, why);
  if (rc != CE_OK)
    return rc;
  rc = frame_from_root(root, out, why);
  json_decref(root);
  return rc;
}

int ce_control_frame_check(const json_t *root, ce_frame_t *out, const char **why) {
  if (why != NULL)
    *why = NULL;
  /* In the order ce__frame_load() refuses, so the reasons agree. */
  if (!json_depth_within(root, 0, FRAME_MAX_DEPTH))
    return refuse(why, "frame nested deeper than 16");
  if (!json_is_object(root))
    return refuse(why, "frame is not a JSON object");
  return frame_from_root((json_t *)root, out, why);
}

/* The frame's type and members, from a parsed object (not consumed). */
static int frame_from_root(json_t *root, ce_frame_t *out, const char **why) {
  int rc;
  /* Parsed into a copy so that *out stays untouched on failure. The copy
   * is only as large as what the frame needs. */
  ce_frame_t f;
  f.type = 0;
  f.has_ticket = false;
  f.version = 0;
  f.session_id[0] = '\0';
  f.id = 0;
  f.allow = false;
  f.reason[0] = '\0';
  f.cacheable = false;
  f.secret_name[0] = '\0';
  f.secret_value[0] = '\0';
  f.secret_value_len = 0;

  json_t *type = json_object_get(root, "type");
  const char *t = json_string_value(type);
  if (type == NULL) {
    rc = refuse(why, "missing \"type\"");
  } else if (t == NULL) {
    rc = refuse(why, "\"type\" must be a string");
  } else if (strcmp(t, "hello") == 0) {
    rc = parse_hello(root, &f, why);
  } else if (strcmp(t, "auth") == 0) {
    rc = parse_auth(root, &f, why);
  } else if (strcmp(t, "decision") == 0) {
    rc = parse_decision(root, &f, why);
  } else if (strcmp(t, "credential") == 0) {
    rc = parse_credential(root, &f, why);
  } else if (strcmp(t, "ping") == 0) {
    f.type = CE_FRAME_PING;
    rc = CE_OK;
  } else {
    rc = refuse(why, "unknown type");
  }
  if (rc != CE_OK)
    return rc;

  /* Copy only the used parts of the large buffers. */
  out->type = f.type;
  out->version = f.version;
  memcpy(out->session_id, f.session_id, strlen(f.session_id) + 1);
  out->has_ticket = false;
  if (f.type == CE_FRAME_HELLO) {
    memcpy(out->nonce, f.nonce, sizeof(f.nonce));
    out->has_ticket = f.has_ticket;
    if (f.has_ticket)
      memcpy(out->ticket, f.ticket, sizeof(f.ticket));
  }
  if (f.type == CE_FRAME_AUTH)
    memcpy(out->proof, f.proof, sizeof(f.proof));
  out->id = f.id;
  out->allow = f.allow;
  memcpy(out->reason, f.reason, strlen(f.reason) + 1);
  out->cacheable = f.cacheable;
  memcpy(out->secret_name, f.secret_name, strlen(f.secret_name) + 1);
  memcpy(out->secret_value, f.secret_value, f.secret_value_len + 1);
  out->secret_value_len = f.secret_value_len;
  explicit_bzero(f.secret_value, f.secret_value_len);
  return CE_OK;
}

/* ---- encoding ------------------------------------------------------------- */

/* Lines up to this size are written on the stack and then copied into one
 * exact-size allocation; an event line is typically 1 to 3 KiB. */
#define LINE_INLINE (8u * 1024u)

/* Ends the text with '\n' and turns it into a line; frees the writer. */
static int line_finish(ce_jsonw_t *w, ce__line_t **out) {
  ce_jsonw_raw(w, "\n", 1);
  int rc = ce_jsonw_error(w);
  if (rc == CE_OK) {
    ce__line_t *line = malloc(sizeof(*line) + w->len);
    if (line == NULL) {
      rc = CE_ENOMEM;
    } else {
      memcpy(line->data, w->buf, w->len);
      line->len = w->len;
      line->refs = 1;
      *out = line;
    }
  }
  ce_jsonw_free(w);
  return rc;
}

int ce__line_encode(const json_t *obj, ce__line_t **out) {
  if (!json_is_object(obj) && !json_is_array(obj))
    return CE_EINVAL;
  char inline_buf[LINE_INLINE];
  ce_jsonw_t w;
  ce_jsonw_init(&w, inline_buf, sizeof(inline_buf), CE_CONTROL_MAX_FRAME);
  ce_jsonw_value(&w, obj);
  return line_finish(&w, out);
}

int ce__line_encode_frame_with(const char *type, const char *key, uint64_t num,
                               bool num_as_string, ce_control_write_fn write, const void *arg,
                               ce__line_t **out) {
  char inline_buf[LINE_INLINE];
  ce_jsonw_t w;
  ce_jsonw_init(&w, inline_buf, sizeof(inline_buf), CE_CONTROL_MAX_FRAME);
  ce_jsonw_raw(&w, "{\"type\":", 8);
  ce_jsonw_string(&w, type, strlen(type));
  ce_jsonw_raw(&w, ",", 1);
  ce_jsonw_string(&w, key, strlen(key));
  ce_jsonw_raw(&w, num_as_string ? ":\"" : ":", num_as_string ? 2 : 1);
  ce_jsonw_uint(&w, num);
  if (num_as_string)
    ce_jsonw_raw(&w, "\"", 1);
  if (ce_jsonw_error(&w) == CE_OK)
    write(&w, arg);
  ce_jsonw_raw(&w, "}", 1);
  return line_finish(&w, out);
}

void ce__line_write_json_fields(ce_jsonw_t *w, const void *arg) {
  const ce__json_fields_t *f = arg;
  bool first = false; /* "type" is already written */
  ce_jsonw_members(w, f->obj, "type", f->key, &first);
}

int ce__line_encode_frame(const char *type, const char *key, uint64_t num, bool num_as_string,
                          const json_t *fields, ce__line_t **out) {
  if (!json_is_object(fields))
    return CE_EINVAL;
  ce__json_fields_t f = {fields, key};
  return ce__line_encode_frame_with(type, key, num, num_as_string, ce__line_write_json_fields, &f,
                                    out);
}

ce__line_t *ce__line_ref(ce__line_t *line) {
  line->refs++;
  return line;
}

void ce__line_unref(ce__line_t *line) {
  if (line != NULL && --line->refs == 0)
    free(line);
}
