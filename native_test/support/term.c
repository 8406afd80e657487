#include "support/term.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- text -> term ------------------------------------------------------------ */

typedef struct {
  const char *s;
  const char *text;
} parser_t;

static void ws(parser_t *p) {
  while (isspace((unsigned char)*p->s))
    p->s++;
}

static void expect(parser_t *p, const char *tok) {
  ws(p);
  size_t n = strlen(tok);
  cr_assert(strncmp(p->s, tok, n) == 0, "term text: expected '%s' at '%s' in %s", tok, p->s,
            p->text);
  p->s += n;
}

static bool peek(parser_t *p, const char *tok) {
  ws(p);
  return strncmp(p->s, tok, strlen(tok)) == 0;
}

static void value(parser_t *p, ei_x_buff *x);

/* Counts the elements of a sequence ending at `close` without encoding. */
static long count_elements(parser_t *p, const char *close, bool is_map, ei_x_buff *scratch) {
  parser_t q = *p;
  long n = 0;
  if (peek(&q, close))
    return 0;
  for (;;) {
    value(&q, scratch);
    if (is_map) {
      expect(&q, "=>");
      value(&q, scratch);
    }
    n++;
    if (peek(&q, ","))
      expect(&q, ",");
    else
      return n;
  }
}

static void escaped_bytes(parser_t *p, char *out, size_t *n, char quote) {
  *n = 0;
  while (*p->s != quote) {
    cr_assert(*p->s != '\0', "term text: unterminated quote in %s", p->text);
    char c = *p->s++;
    if (c == '\\') {
      char e = *p->s++;
      if (e == 'n')
        c = '\n';
      else if (e == 'x') {
        char hex[3] = {p->s[0], p->s[1], 0};
        c = (char)strtol(hex, NULL, 16);
        p->s += 2;
      } else
        c = e;
    }
    out[(*n)++] = c;
  }
  p->s++;
}

static void value(parser_t *p, ei_x_buff *x) {
  ws(p);
  const char *s = p->s;
  if (*s == '{') {
    p->s++;
    ei_x_buff scratch;
    ei_x_new(&scratch);
    long n = count_elements(p, "}", false, &scratch);
    ei_x_free(&scratch);
    ei_x_encode_tuple_header(x, n);
    for (long k = 0; k < n; k++) {
      value(p, x);
      if (k + 1 < n)
        expect(p, ",");
    }
    expect(p, "}");
  } else if (*s == '#' && s[1] == '{') {
    p->s += 2;
    ei_x_buff scratch;
    ei_x_new(&scratch);
    long n = count_elements(p, "}", true, &scratch);
    ei_x_free(&scratch);
    ei_x_encode_map_header(x, n);
    for (long k = 0; k < n; k++) {
      value(p, x);
      expect(p, "=>");
      value(p, x);
      if (k + 1 < n)
        expect(p, ",");
    }
    expect(p, "}");
  } else if (*s == '[') {
    p->s++;
    ei_x_buff scratch;
    ei_x_new(&scratch);
    long n = count_elements(p, "]", false, &scratch);
    ei_x_free(&scratch);
    if (n > 0)
      ei_x_encode_list_header(x, n);
    for (long k = 0; k < n; k++) {
      value(p, x);
      if (k + 1 < n)
        expect(p, ",");
    }
    expect(p, "]");
    ei_x_encode_empty_list(x);
  } else if (s[0] == '<' && s[1] == '<') {
    p->s += 2;
    ws(p);
    size_t cap = strlen(p->s) + 1, n = 0;
    char *bytes = malloc(cap);
    if (*p->s == '"') {
      p->s++;
      escaped_bytes(p, bytes, &n, '"');
    } else {
      while (!peek(p, ">>")) {
        char *end;
        bytes[n++] = (char)strtol(p->s, &end, 10);
        cr_assert(end != p->s, "term text: bad byte in %s", p->text);
        p->s = end;
        if (peek(p, ","))
          expect(p, ",");
      }
    }
    expect(p, ">>");
    ei_x_encode_binary(x, bytes, (int)n);
    free(bytes);
  } else if (*s == '"') {
    p->s++;
    size_t cap = strlen(p->s) + 1, n = 0;
    char *bytes = malloc(cap);
    escaped_bytes(p, bytes, &n, '"');
    ei_x_encode_string_len(x, bytes, (int)n);
    free(bytes);
  } else if (*s == '\'') {
    p->s++;
    char atom[1024];
    size_t n = 0;
    escaped_bytes(p, atom, &n, '\'');
    ei_x_encode_atom_len_as(x, atom, (int)n, ERLANG_UTF8, ERLANG_UTF8);
  } else if (*s == '-' || isdigit((unsigned char)*s)) {
    const char *e = s + (*s == '-');
    while (isdigit((unsigned char)*e))
      e++;
    if (*e == '.') {
      char *end;
      ei_x_encode_double(x, strtod(s, &end));
      p->s = end;
    } else if (*s == '-') {
      char *end;
      ei_x_encode_longlong(x, strtoll(s, &end, 10));
      p->s = end;
    } else {
      char *end;
      ei_x_encode_ulonglong(x, strtoull(s, &end, 10));
      p->s = end;
    }
  } else if (islower((unsigned char)*s)) {
    const char *e = s;
    while (isalnum((unsigned char)*e) || *e == '_')
      e++;
    ei_x_encode_atom_len(x, s, (int)(e - s));
    p->s = e;
  } else {
    cr_assert_fail("term text: unexpected '%s' in %s", s, p->text);
  }
}

void ce_test_term(ei_x_buff *x, const char *text) {
  parser_t p = {text, text};
  ei_x_new_with_version(x);
  value(&p, x);
  ws(&p);
  cr_assert(*p.s == '\0', "term text: trailing '%s' in %s", p.s, text);
}

/* ---- term -> text ---------------------------------------------------------------- */

typedef struct {
  char *s;
  size_t len, cap;
} out_t;

static void put(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(out_t *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (o->len + (size_t)n + 1 > o->cap) {
    o->cap = (o->len + (size_t)n + 1) * 2;
    o->s = realloc(o->s, o->cap);
  }
  va_start(ap, fmt);
  vsnprintf(o->s + o->len, o->cap - o->len, fmt, ap);
  va_end(ap);
  o->len += (size_t)n;
}

static void print(out_t *o, const char *buf, int *i) {
  int type = 0, size = 0;
  ei_get_type(buf, i, &type, &size);
  switch (type) {
  case ERL_SMALL_INTEGER_EXT:
  case ERL_INTEGER_EXT:
  case ERL_SMALL_BIG_EXT:
  case ERL_LARGE_BIG_EXT: {
    EI_LONGLONG v;
    EI_ULONGLONG u;
    int j = *i;
    if (ei_decode_longlong(buf, &j, &v) == 0) {
      put(o, "%lld", (long long)v);
      *i = j;
    } else if (ei_decode_ulonglong(buf, i, &u) == 0) {
      put(o, "%llu", (unsigned long long)u);
    } else {
      put(o, "#Big");
      ei_skip_term(buf, i);
    }
    break;
  }
  case ERL_FLOAT_EXT:
  case NEW_FLOAT_EXT: {
    double d;
    ei_decode_double(buf, i, &d);
    put(o, "%g", d);
    break;
  }
  case ERL_ATOM_EXT:
  case ERL_SMALL_ATOM_EXT:
  case ERL_ATOM_UTF8_EXT:
  case ERL_SMALL_ATOM_UTF8_EXT: {
    char a[MAXATOMLEN_UTF8];
    ei_decode_atom_as(buf, i, a, sizeof(a), ERLANG_UTF8, NULL, NULL);
    put(o, "%s", a);
    break;
  }
  case ERL_BINARY_EXT: {
    char *b = malloc((size_t)size + 1);
    long n = 0;
    ei_decode_binary(buf, i, b, &n);
    bool text = true;
    for (long k = 0; k < n; k++)
      if ((unsigned char)b[k] < 0x20 && b[k] != '\n')
        text = false;
    if (text) {
      put(o, "<<\"");
      for (long k = 0; k < n; k++) {
        if (b[k] == '"' || b[k] == '\\')
          put(o, "\\%c", b[k]);
        else if (b[k] == '\n')
          put(o, "\\n");
        else
          put(o, "%c", b[k]);
      }
      put(o, "\">>");
    } else {
      put(o, "<<");
      for (long k = 0; k < n; k++)
        put(o, "%s%u", k ? "," : "", (unsigned char)b[k]);
      put(o, ">>");
    }
    free(b);
    break;
  }
  case ERL_SMALL_TUPLE_EXT:
  case ERL_LARGE_TUPLE_EXT: {
    int n;
    ei_decode_tuple_header(buf, i, &n);
    put(o, "{");
    for (int k = 0; k < n; k++) {
      if (k)
        put(o, ",");
      print(o, buf, i);
    }
    put(o, "}");
    break;
  }
  case ERL_NIL_EXT:
  case ERL_LIST_EXT: {
    int n;
    ei_decode_list_header(buf, i, &n);
    put(o, "[");
    for (int k = 0; k < n; k++) {
      if (k)
        put(o, ",");
      print(o, buf, i);
    }
    if (n > 0) {
      int t, s2;
      ei_get_type(buf, i, &t, &s2);
      if (t == ERL_NIL_EXT) {
        (*i)++;
      } else {
        put(o, "|");
        print(o, buf, i);
      }
    }
    put(o, "]");
    break;
  }
  case ERL_STRING_EXT: {
    char *b = malloc((size_t)size + 1);
    ei_decode_string(buf, i, b);
    put(o, "\"%s\"", b);
    free(b);
    break;
  }
  case ERL_MAP_EXT: {
    int n;
    ei_decode_map_header(buf, i, &n);
    put(o, "#{");
    for (int k = 0; k < n; k++) {
      if (k)
        put(o, ",");
      print(o, buf, i);
      put(o, " => ");
      print(o, buf, i);
    }
    put(o, "}");
    break;
  }
  default:
    put(o, "#Other");
    ei_skip_term(buf, i);
  }
}

char *ce_test_term_str(const char *buf, size_t len) {
  out_t o = {NULL, 0, 0};
  put(&o, "%s", "");
  int i = 0, version = 0;
  cr_assert(len > 0 && ei_decode_version(buf, &i, &version) == 0, "not a term");
  print(&o, buf, &i);
  cr_assert((size_t)i == len, "trailing bytes after the term (%d of %zu)", i, len);
  return o.s;
}
