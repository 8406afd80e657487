/*
 * The one place an nghttp2 session is made (docs/http2.md §4, §5): the
 * server session towards the workspace, and the client sessions towards
 * an h2 upstream (for h2 streams and for an HTTP/1.1 workspace's
 * exchanges alike). Every session gets the same options: windows open
 * again only as bytes leave (no automatic WINDOW_UPDATE), and the
 * library's own flood limits, set explicitly as a second layer behind
 * the frame guard (h2/guard.h). What differs between the roles (the
 * windows, the header list bound, the stream limit) is a field of
 * ce_h2_session_params_t, so no caller sets an option of its own.
 */
#ifndef CE_H2_SESSION_H
#define CE_H2_SESSION_H

#include <nghttp2/nghttp2.h>
#include <stdint.h>

typedef enum {
  CE_H2_SESSION_SERVER = 0, /* towards the workspace */
  CE_H2_SESSION_CLIENT,     /* towards an h2 upstream */
} ce_h2_session_role_t;

/* The callbacks a session may have; NULL ones are not set. */
typedef struct {
  nghttp2_on_begin_headers_callback begin_headers;
  nghttp2_on_header_callback header;
  nghttp2_on_frame_recv_callback frame_recv;
  nghttp2_on_data_chunk_recv_callback data_chunk_recv;
  nghttp2_on_frame_send_callback frame_send;
  nghttp2_on_stream_close_callback stream_close;
  nghttp2_send_data_callback send_data;                      /* DATA sent with NGHTTP2_DATA_FLAG_NO_COPY */
  nghttp2_data_source_read_length_callback data_length;      /* the payload size of each DATA frame */
} ce_h2_session_callbacks_t;

typedef struct {
  ce_h2_session_role_t role;
  uint32_t stream_window;   /* SETTINGS_INITIAL_WINDOW_SIZE we announce */
  int32_t conn_window;      /* our receive window of the whole connection */
  uint32_t max_header_list; /* SETTINGS_MAX_HEADER_LIST_SIZE we announce */
  uint32_t max_streams;     /* SETTINGS_MAX_CONCURRENT_STREAMS (server only; 0: not sent) */
} ce_h2_session_params_t;

/* Options of every session, whatever its role. */
#define CE_H2_SESSION_MAX_OUTBOUND_ACK 1000u
#define CE_H2_SESSION_MAX_SETTINGS 32u
#define CE_H2_SESSION_MAX_DYNAMIC_TABLE 4096u

/* Makes a session with the options above, its SETTINGS (push disabled)
 * submitted and its connection window set. Returns CE_OK with *out set
 * (the caller owns it: nghttp2_session_del), or CE_ENOMEM with *out
 * untouched and nothing held. */
int ce_h2_session_new(const ce_h2_session_params_t *p, const ce_h2_session_callbacks_t *cbs, void *user_data,
                      nghttp2_session **out);

#endif
