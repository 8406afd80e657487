/* Tests for c_src/h2/session.c: every session the proxy makes announces
 * the limits it was given, in its first bytes on the wire, whatever its
 * role. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "common/error.h"
#include "h2/session.h"

typedef struct {
  uint32_t values[8]; /* by settings id; 0xffffffff = not sent */
  uint32_t conn_window_increment;
} announced_t;

/* Reads the SETTINGS and WINDOW_UPDATE frames a fresh session sends. */
static void announced(nghttp2_session *s, bool client, announced_t *out) {
  memset(out->values, 0xff, sizeof(out->values));
  out->conn_window_increment = 0;
  uint8_t wire[512];
  size_t n = 0;
  const uint8_t *data;
  ssize_t got;
  while ((got = nghttp2_session_mem_send(s, &data)) > 0) {
    cr_assert_leq(n + (size_t)got, sizeof(wire));
    memcpy(wire + n, data, (size_t)got);
    n += (size_t)got;
  }
  size_t off = client ? 24 : 0; /* the client preface */
  if (client)
    cr_assert_eq(memcmp(wire, NGHTTP2_CLIENT_MAGIC, 24), 0);
  while (off + 9 <= n) {
    uint32_t len = (uint32_t)wire[off] << 16 | (uint32_t)wire[off + 1] << 8 | wire[off + 2];
    uint8_t type = wire[off + 3];
    const uint8_t *p = wire + off + 9;
    cr_assert_leq(off + 9 + len, n);
    if (type == NGHTTP2_SETTINGS)
      for (uint32_t i = 0; i + 6 <= len; i += 6) {
        uint16_t id = (uint16_t)(p[i] << 8 | p[i + 1]);
        uint32_t v = (uint32_t)p[i + 2] << 24 | (uint32_t)p[i + 3] << 16 | (uint32_t)p[i + 4] << 8 | p[i + 5];
        if (id < 8)
          out->values[id] = v;
      }
    if (type == NGHTTP2_WINDOW_UPDATE && len == 4)
      out->conn_window_increment = ((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]) &
                                   0x7fffffffu;
    off += 9 + len;
  }
}

static const ce_h2_session_callbacks_t no_callbacks = {0};

/* A workspace-side session's parameters, as the proxy sets them. */
static ce_h2_session_params_t server_params(void) {
  return (ce_h2_session_params_t){.role = CE_H2_SESSION_SERVER,
                                  .stream_window = 65535,
                                  .conn_window = 1024 * 1024,
                                  .max_header_list = 65536,
                                  .max_streams = 100};
}

Test(h2_session, a_server_session_announces_its_limits_and_no_push) {
  ce_h2_session_params_t p = server_params();
  nghttp2_session *s = NULL;
  cr_assert_eq(ce_h2_session_new(&p, &no_callbacks, NULL, &s), CE_OK);
  announced_t a;
  announced(s, false, &a);
  cr_assert_eq(a.values[NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS], 100);
  cr_assert_eq(a.values[NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE], 65535);
  cr_assert_eq(a.values[NGHTTP2_SETTINGS_ENABLE_PUSH], 0);
  cr_assert_eq(a.values[NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE], 65536);
  cr_assert_eq(a.conn_window_increment, 1024 * 1024 - 65535);
  nghttp2_session_del(s);
}

Test(h2_session, a_client_session_sends_the_preface_and_no_stream_limit) {
  ce_h2_session_params_t p = {.role = CE_H2_SESSION_CLIENT,
                              .stream_window = 32768,
                              .conn_window = 65535 * 4,
                              .max_header_list = 8192,
                              .max_streams = 7 /* a server's setting: not sent */};
  nghttp2_session *s = NULL;
  cr_assert_eq(ce_h2_session_new(&p, &no_callbacks, NULL, &s), CE_OK);
  announced_t a;
  announced(s, true, &a);
  cr_assert_eq(a.values[NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS], 0xffffffffu);
  cr_assert_eq(a.values[NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE], 32768);
  cr_assert_eq(a.values[NGHTTP2_SETTINGS_ENABLE_PUSH], 0);
  cr_assert_eq(a.values[NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE], 8192);
  cr_assert_eq(a.conn_window_increment, 65535 * 3);
  nghttp2_session_del(s);
}

/* A body of 2,500 bytes sent with NGHTTP2_DATA_FLAG_NO_COPY. */
typedef struct {
  size_t body_left;
  size_t frames[8];
  size_t nframes;
  size_t mem_send_data_bytes; /* DATA payload seen in mem_send's output: none */
} nocopy_t;

static ssize_t nocopy_read(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                           uint32_t *data_flags, nghttp2_data_source *source, void *user_data) {
  nocopy_t *t = source->ptr;
  size_t n = t->body_left < length ? t->body_left : length;
  t->body_left -= n;
  *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
  if (t->body_left == 0)
    *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)n;
}

static int nocopy_send(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                       nghttp2_data_source *source, void *user_data) {
  nocopy_t *t = user_data;
  uint32_t hdlen = (uint32_t)framehd[0] << 16 | (uint32_t)framehd[1] << 8 | framehd[2];
  cr_assert_eq(framehd[3], NGHTTP2_DATA);
  cr_assert_eq(hdlen, length, "the header announces the payload the callback writes");
  cr_assert_lt(t->nframes, 8);
  t->frames[t->nframes++] = length;
  return 0;
}

static ssize_t nocopy_length(nghttp2_session *session, uint8_t frame_type, int32_t stream_id,
                             int32_t session_remote_window_size, int32_t stream_remote_window_size,
                             uint32_t remote_max_frame_size, void *user_data) {
  return 1000;
}

Test(h2_session, data_without_a_copy_goes_through_send_data_in_frames_of_the_length_asked) {
  ce_h2_session_params_t p = {.role = CE_H2_SESSION_CLIENT,
                              .stream_window = 65535,
                              .conn_window = 1024 * 1024,
                              .max_header_list = 65536};
  ce_h2_session_callbacks_t cbs = {.send_data = nocopy_send, .data_length = nocopy_length};
  nocopy_t t = {.body_left = 2500};
  nghttp2_session *s = NULL;
  cr_assert_eq(ce_h2_session_new(&p, &cbs, &t, &s), CE_OK);
  const nghttp2_nv nva[] = {
      {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, NGHTTP2_NV_FLAG_NONE},
      {(uint8_t *)":scheme", (uint8_t *)"https", 7, 5, NGHTTP2_NV_FLAG_NONE},
      {(uint8_t *)":authority", (uint8_t *)"a.test", 10, 6, NGHTTP2_NV_FLAG_NONE},
      {(uint8_t *)":path", (uint8_t *)"/", 5, 1, NGHTTP2_NV_FLAG_NONE},
  };
  nghttp2_data_provider prd = {.source.ptr = &t, .read_callback = nocopy_read};
  cr_assert_gt(nghttp2_submit_request(s, NULL, nva, 4, &prd, NULL), 0);
  const uint8_t *data;
  ssize_t got;
  size_t total = 0;
  while ((got = nghttp2_session_mem_send(s, &data)) > 0)
    total += (size_t)got;
  cr_assert_lt(total, 500, "mem_send gave only the preface, SETTINGS and HEADERS (%zu bytes)", total);
  cr_assert_eq(t.nframes, 3);
  cr_assert_eq(t.frames[0], 1000);
  cr_assert_eq(t.frames[1], 1000);
  cr_assert_eq(t.frames[2], 500);
  nghttp2_session_del(s);
}

/* The bytes the sanitizer's allocator holds (the tests run under ASan;
 * <sanitizer/allocator_interface.h> is not installed with gcc here). */
size_t __sanitizer_get_current_allocated_bytes(void);

/* A server session answers every stream at once (HEADERS, no body). */
static int answer_at_once(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
  if (frame->hd.type == NGHTTP2_HEADERS && (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
    const nghttp2_nv st = {(uint8_t *)":status", (uint8_t *)"204", 7, 3, NGHTTP2_NV_FLAG_NONE};
    cr_assert_eq(nghttp2_submit_response(session, frame->hd.stream_id, &st, 1, NULL), 0);
  }
  return 0;
}

/* Moves what `from` has to send into `to`. */
static void pass(nghttp2_session *from, nghttp2_session *to) {
  const uint8_t *data;
  ssize_t got;
  while ((got = nghttp2_session_mem_send(from, &data)) > 0)
    cr_assert_eq(nghttp2_session_mem_recv(to, data, (size_t)got), got);
  cr_assert_geq(got, 0);
}

/* Runs `n` GET streams one after the other from client to server. */
static void run_streams(nghttp2_session *client, nghttp2_session *server, int n) {
  const nghttp2_nv nva[] = {
      {(uint8_t *)":method", (uint8_t *)"GET", 7, 3, NGHTTP2_NV_FLAG_NONE},
      {(uint8_t *)":scheme", (uint8_t *)"https", 7, 5, NGHTTP2_NV_FLAG_NONE},
      {(uint8_t *)":authority", (uint8_t *)"a.test", 10, 6, NGHTTP2_NV_FLAG_NONE},
      {(uint8_t *)":path", (uint8_t *)"/", 5, 1, NGHTTP2_NV_FLAG_NONE},
  };
  for (int i = 0; i < n; i++) {
    cr_assert_gt(nghttp2_submit_request(client, NULL, nva, 4, NULL, NULL), 0);
    pass(client, server);
    pass(server, client);
    pass(client, server); /* WINDOW_UPDATEs, SETTINGS ACKs */
  }
}

Test(h2_session, a_server_session_keeps_no_closed_streams) {
  ce_h2_session_params_t p = server_params();
  ce_h2_session_callbacks_t cbs = {.frame_recv = answer_at_once};
  nghttp2_session *server = NULL, *client = NULL;
  cr_assert_eq(ce_h2_session_new(&p, &cbs, NULL, &server), CE_OK);
  nghttp2_session_callbacks *ccb;
  cr_assert_eq(nghttp2_session_callbacks_new(&ccb), 0);
  cr_assert_eq(nghttp2_session_client_new(&client, ccb, NULL), 0);
  nghttp2_session_callbacks_del(ccb);
  cr_assert_eq(nghttp2_submit_settings(client, NGHTTP2_FLAG_NONE, NULL, 0), 0);

  /* The HPACK tables and the sessions' buffers settle in the first streams. */
  run_streams(client, server, 20);
  size_t before = __sanitizer_get_current_allocated_bytes();
  run_streams(client, server, 200);
  size_t after = __sanitizer_get_current_allocated_bytes();
  cr_assert_eq(nghttp2_session_get_next_stream_id(client), 2 * 220 + 1);
  /* Keeping closed streams would add ~100 stream objects (> 20 KB). */
  cr_assert_lt(after, before + 4096, "the server session grew from %zu to %zu bytes over 200 finished streams",
               before, after);
  nghttp2_session_del(client);
  nghttp2_session_del(server);
}
