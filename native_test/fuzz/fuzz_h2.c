/*
 * libFuzzer target for the workspace side of the HTTP/2 path
 * (docs/http2.md §5, §8): the bytes after the client preface go through
 * the frame guard (c_src/h2/guard.c) and, while it lets them through, to an
 * nghttp2 server session set up with the proxy's options and settings
 * (h2/session.c, with the parameters of proxy/http2/server.c), whose every complete request is answered
 * with a short body the way the proxy answers a refusal.
 *
 * The first input byte picks the size of the pieces the rest is fed in
 * (1..64 bytes, or all at once for 0). Invariants (any failure aborts):
 *   - the guard's verdict is the same whether the bytes come whole or in
 *     pieces (it is a pure function of the bytes and the time);
 *   - a decoded header list never exceeds its bound in the stream record;
 *   - every stream record the callbacks create is freed by a close
 *     callback or at the end, and nothing leaks (LSan);
 *   - the session never asks to write more than it was given room for.
 */
#include <nghttp2/nghttp2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h2/guard.h"
#include "h2/session.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "fuzz_h2: %s:%d: %s\n", __FILE__, __LINE__, #cond);    \
      abort();                                                               \
    }                                                                        \
  } while (0)

#define MAX_LIST 65536u
#define MAX_FIELDS 128u

typedef struct fz_stream {
  struct fz_stream *next, *prev;
  size_t list_bytes, fields;
  int over;
} fz_stream_t;

typedef struct {
  long live;
  fz_stream_t *streams;
  size_t out_bytes;
} fz_t;

static void unlink_stream(fz_t *z, fz_stream_t *st) {
  if (st->prev != NULL)
    st->prev->next = st->next;
  else
    z->streams = st->next;
  if (st->next != NULL)
    st->next->prev = st->prev;
  z->live--;
  free(st);
}

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

static int on_begin(nghttp2_session *s, const nghttp2_frame *f, void *u) {
  fz_t *z = u;
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0;
  fz_stream_t *st = calloc(1, sizeof(*st));
  if (st == NULL)
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  z->live++;
  st->next = z->streams;
  if (z->streams != NULL)
    z->streams->prev = st;
  z->streams = st;
  nghttp2_session_set_stream_user_data(s, f->hd.stream_id, st);
  return 0;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *n, size_t nl, const uint8_t *v,
                     size_t vl, uint8_t flags, void *u) {
  fz_stream_t *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
  if (st == NULL || st->over)
    return 0;
  size_t cost = nl + vl + 32u;
  if (st->fields == MAX_FIELDS || st->list_bytes + cost > MAX_LIST) {
    st->over = 1;
    return 0;
  }
  st->fields++;
  st->list_bytes += cost;
  CHECK(st->list_bytes <= MAX_LIST && st->fields <= MAX_FIELDS);
  return 0;
}

static ssize_t body_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                         nghttp2_data_source *src, void *u) {
  static const char text[] = "condukt: refused\n";
  size_t n = sizeof(text) - 1 < len ? sizeof(text) - 1 : len;
  memcpy(buf, text, n);
  *flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)n;
}

static int on_frame(nghttp2_session *s, const nghttp2_frame *f, void *u) {
  fz_stream_t *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
  if (st == NULL || f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0;
  nghttp2_nv nva[] = {{(uint8_t *)":status", (uint8_t *)(st->over ? "431" : "403"), 7, 3, NGHTTP2_NV_FLAG_NONE}};
  nghttp2_data_provider prd = {.source.ptr = NULL, .read_callback = body_read};
  nghttp2_submit_response(s, f->hd.stream_id, nva, 1, &prd);
  return 0;
}

static int on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *d, size_t len, void *u) {
  /* The proxy hands the bytes on, then opens the window again. */
  nghttp2_session_consume(s, id, len);
  return 0;
}

static int on_close(nghttp2_session *s, int32_t id, uint32_t code, void *u) {
  fz_t *z = u;
  fz_stream_t *st = nghttp2_session_get_stream_user_data(s, id);
  if (st != NULL) {
    nghttp2_session_set_stream_user_data(s, id, NULL);
    unlink_stream(z, st);
  }
  return 0;
}

/* The proxy's own session builder, with the workspace session's
 * parameters (proxy/http2/server.c new_sessions). */
static nghttp2_session *new_session(fz_t *z) {
  static const ce_h2_session_params_t params = {
      .role = CE_H2_SESSION_SERVER,
      .stream_window = 65535,
      .conn_window = 1024 * 1024,
      .max_header_list = MAX_LIST,
      .max_streams = 100,
  };
  static const ce_h2_session_callbacks_t cbs = {
      .begin_headers = on_begin,
      .header = on_header,
      .frame_recv = on_frame,
      .data_chunk_recv = on_data,
      .stream_close = on_close,
  };
  nghttp2_session *s = NULL;
  CHECK(ce_h2_session_new(&params, &cbs, z, &s) == 0);
  return s;
}

static void drain(nghttp2_session *s, fz_t *z) {
  /* The proxy writes while under its high-water mark; here, everything. */
  for (int i = 0; i < 10000; i++) {
    const uint8_t *out;
    ssize_t n = nghttp2_session_mem_send(s, &out);
    if (n <= 0)
      return;
    z->out_bytes += (size_t)n;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  size_t piece = data[0] % 65u;
  data++;
  size--;
  uint8_t *in = malloc(24 + size);
  CHECK(in != NULL);
  memcpy(in, preface, 24);
  memcpy(in + 24, data, size);
  size_t len = 24 + size;

  /* The guard alone, whole: the reference verdict. */
  ce_h2_guard_t whole;
  ce_h2_guard_init(&whole);
  ce_h2g_verdict_t ref = ce_h2_guard_feed(&whole, in, len, 1000);

  fz_t z = {0};
  nghttp2_session *s = new_session(&z);
  ce_h2_guard_t g;
  ce_h2_guard_init(&g);
  ce_h2g_verdict_t v = CE_H2G_OK;
  int session_failed = 0;
  for (size_t off = 0; off < len;) {
    size_t n = piece == 0 ? len - off : (piece < len - off ? piece : len - off);
    v = ce_h2_guard_feed(&g, in + off, n, 1000);
    if (v != CE_H2G_OK) {
      nghttp2_session_terminate_session(s, NGHTTP2_ENHANCE_YOUR_CALM);
      drain(s, &z);
      break;
    }
    if (!session_failed) {
      ssize_t r = nghttp2_session_mem_recv(s, in + off, n);
      if (r < 0) {
        session_failed = 1;
        nghttp2_session_terminate_session(s, NGHTTP2_PROTOCOL_ERROR);
      } else {
        CHECK((size_t)r == n);
      }
    }
    drain(s, &z);
    off += n;
  }
  /* Fed in pieces, the guard stops at the first failure: the verdict
   * over the whole input must be the same one. */
  if (v != CE_H2G_OK)
    CHECK(ref == v);
  else
    CHECK(ref == CE_H2G_OK);
  nghttp2_session_del(s);
  /* Deleting a session runs no close callbacks: the records still open
   * are freed here, as ce_h2conn_free does; the count must agree. */
  long open = 0;
  for (fz_stream_t *st = z.streams; st != NULL; st = st->next)
    open++;
  CHECK(open == z.live);
  while (z.streams != NULL)
    unlink_stream(&z, z.streams);
  CHECK(z.live == 0);
  free(in);
  return 0;
}
