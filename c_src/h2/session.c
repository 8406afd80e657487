/* nghttp2 sessions with the proxy's options (h2/session.h). */
#include "h2/session.h"

#include <stddef.h>

#include "common/error.h"
#include "h2/guard.h"

/* A header block we send is at most twice the list we accept: a
 * translated head can grow (cookies split, host added). */
static nghttp2_option *session_options(const ce_h2_session_params_t *p) {
  nghttp2_option *opt = NULL;
  if (nghttp2_option_new(&opt) != 0)
    return NULL;
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_option_set_max_outbound_ack(opt, CE_H2_SESSION_MAX_OUTBOUND_ACK);
  nghttp2_option_set_max_settings(opt, CE_H2_SESSION_MAX_SETTINGS);
  nghttp2_option_set_max_continuations(opt, CE_H2G_MAX_CONTINUATIONS);
  nghttp2_option_set_stream_reset_rate_limit(opt, CE_H2G_MAX_RST, CE_H2G_MAX_RST / CE_H2G_WINDOW_S);
  nghttp2_option_set_max_deflate_dynamic_table_size(opt, CE_H2_SESSION_MAX_DYNAMIC_TABLE);
  nghttp2_option_set_max_send_header_block_length(opt, 2u * (size_t)p->max_header_list);
  /* A server session would otherwise keep up to its stream limit of
   * closed streams (about 180 bytes each) for RFC 7540's priority tree,
   * which RFC 9113 deprecates and the proxy does not use: ~18 KB per
   * workspace connection once it served 100 streams, idle or not. */
  nghttp2_option_set_no_closed_streams(opt, 1);
  return opt;
}

static void set_callbacks(nghttp2_session_callbacks *cb, const ce_h2_session_callbacks_t *c) {
  if (c->begin_headers != NULL)
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, c->begin_headers);
  if (c->header != NULL)
    nghttp2_session_callbacks_set_on_header_callback(cb, c->header);
  if (c->frame_recv != NULL)
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, c->frame_recv);
  if (c->data_chunk_recv != NULL)
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, c->data_chunk_recv);
  if (c->frame_send != NULL)
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, c->frame_send);
  if (c->stream_close != NULL)
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, c->stream_close);
  if (c->send_data != NULL)
    nghttp2_session_callbacks_set_send_data_callback(cb, c->send_data);
  if (c->data_length != NULL)
    nghttp2_session_callbacks_set_data_source_read_length_callback(cb, c->data_length);
}

int ce_h2_session_new(const ce_h2_session_params_t *p, const ce_h2_session_callbacks_t *cbs, void *user_data,
                      nghttp2_session **out) {
  nghttp2_session_callbacks *cb = NULL;
  nghttp2_option *opt = NULL;
  nghttp2_session *sess = NULL;
  int rc = CE_ENOMEM;
  if (nghttp2_session_callbacks_new(&cb) != 0)
    goto fail_callbacks;
  set_callbacks(cb, cbs);
  opt = session_options(p);
  if (opt == NULL)
    goto fail_options;
  int made = p->role == CE_H2_SESSION_SERVER ? nghttp2_session_server_new2(&sess, cb, user_data, opt)
                                             : nghttp2_session_client_new2(&sess, cb, user_data, opt);
  if (made != 0)
    goto fail_session;
  nghttp2_settings_entry set[4];
  size_t n = 0;
  if (p->role == CE_H2_SESSION_SERVER && p->max_streams > 0)
    set[n++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, p->max_streams};
  set[n++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, p->stream_window};
  set[n++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_ENABLE_PUSH, 0};
  set[n++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, p->max_header_list};
  if (nghttp2_submit_settings(sess, NGHTTP2_FLAG_NONE, set, n) != 0 ||
      nghttp2_session_set_local_window_size(sess, NGHTTP2_FLAG_NONE, 0, p->conn_window) != 0)
    goto fail_settings;
  *out = sess;
  rc = CE_OK;
  goto done;
fail_settings:
  nghttp2_session_del(sess);
fail_session:
done:
  nghttp2_option_del(opt);
fail_options:
  nghttp2_session_callbacks_del(cb);
fail_callbacks:
  return rc;
}
