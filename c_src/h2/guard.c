/* Frame-level HTTP/2 defences: see guard.h and docs/http2.md §5. */
#include "h2/guard.h"

#include <string.h>

/* RFC 9113 §3.4. */
static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define PREFACE_LEN 24u

/* RFC 9113 §6: frame types and flags the guard looks at. */
enum { T_DATA = 0, T_HEADERS = 1, T_PRIORITY = 2, T_RST = 3, T_SETTINGS = 4, T_PUSH = 5,
       T_PING = 6, T_GOAWAY = 7, T_WINDOW = 8, T_CONTINUATION = 9 };
#define F_ACK 0x1u
#define F_END_HEADERS 0x4u
#define F_PADDED 0x8u

void ce_h2_guard_init(ce_h2_guard_t *g) { memset(g, 0, sizeof(*g)); }

uint32_t ce_h2g_window_add(ce_h2g_window_t *w, uint64_t now_ms, uint32_t n) {
  uint64_t sec = now_ms / 1000u;
  size_t i = (size_t)(sec % CE_H2G_WINDOW_S);
  /* Second numbers start at 1 in the buckets so that 0 means empty. */
  if (w->second[i] != sec + 1) {
    w->second[i] = sec + 1;
    w->counts[i] = 0;
  }
  if (w->counts[i] <= UINT32_MAX - n)
    w->counts[i] += n;
  uint64_t sum = 0;
  for (size_t k = 0; k < CE_H2G_WINDOW_S; k++)
    if (w->second[k] != 0 && w->second[k] + CE_H2G_WINDOW_S > sec + 1)
      sum += w->counts[k];
  return sum > UINT32_MAX ? UINT32_MAX : (uint32_t)sum;
}

/* DATA without payload, and frames that make the proxy work without
 * carrying a request: counted together. */
static ce_h2g_verdict_t empty(ce_h2_guard_t *g, uint64_t now_ms) {
  return ce_h2g_window_add(&g->empty, now_ms, 1) > CE_H2G_MAX_EMPTY ? CE_H2G_CONTROL_FLOOD : CE_H2G_OK;
}

static ce_h2g_verdict_t frame(ce_h2_guard_t *g, uint64_t now_ms) {
  uint32_t len = ((uint32_t)g->hdr[0] << 16) | ((uint32_t)g->hdr[1] << 8) | g->hdr[2];
  uint8_t type = g->hdr[3], flags = g->hdr[4];
  g->payload_left = len;
  /* RFC 9113 §6.10: inside a header block only CONTINUATION may come;
   * anything else is a connection error nghttp2 reports. The guard only
   * counts the block. */
  if (type == T_HEADERS || (type == T_CONTINUATION && g->in_block)) {
    if (type == T_HEADERS) {
      g->block_frames = 0;
      g->block_bytes = 0;
      if (ce_h2g_window_add(&g->streams, now_ms, 1) > CE_H2G_MAX_STREAMS)
        return CE_H2G_STREAM_FLOOD;
    }
    g->block_frames++;
    g->block_bytes += len;
    if (g->block_frames > CE_H2G_MAX_CONTINUATIONS + 1u || g->block_bytes > CE_H2G_MAX_BLOCK_BYTES)
      return CE_H2G_CONTINUATION_FLOOD;
    g->in_block = (flags & F_END_HEADERS) == 0;
    return CE_H2G_OK;
  }
  g->in_block = false;
  if (type == T_DATA && (flags & F_PADDED) != 0 && len > 0) {
    /* Empty or not depends on the pad length, the payload's first byte. */
    g->want_pad = true;
    g->data_len = len;
    return CE_H2G_OK;
  }
  switch (type) {
  case T_RST:
    if (ce_h2g_window_add(&g->rst, now_ms, 1) > CE_H2G_MAX_RST)
      return CE_H2G_RAPID_RESET;
    break;
  case T_SETTINGS:
    if ((flags & F_ACK) == 0 && ce_h2g_window_add(&g->settings, now_ms, 1) > CE_H2G_MAX_SETTINGS)
      return CE_H2G_SETTINGS_FLOOD;
    break;
  case T_PING:
    if ((flags & F_ACK) == 0 && ce_h2g_window_add(&g->ping, now_ms, 1) > CE_H2G_MAX_PING)
      return CE_H2G_PING_FLOOD;
    break;
  case T_WINDOW: {
    /* A legitimate client acknowledges what it receives: the allowance
     * grows with what the proxy sent (ce_h2_guard_note_sent). */
    uint64_t credit = ce_h2g_window_add(&g->wu_credit, now_ms, 0);
    if (ce_h2g_window_add(&g->wupdate, now_ms, 1) > CE_H2G_MAX_EMPTY + credit)
      return CE_H2G_CONTROL_FLOOD;
    break;
  }
  case T_DATA:
    if (len == 0)
      return empty(g, now_ms);
    break;
  case T_PUSH:
  case T_GOAWAY:
    break;
  default:
    /* PRIORITY, a CONTINUATION outside a block, and frame types nghttp2
     * ignores (RFC 9113 §5.5): work for the proxy without a request. */
    return empty(g, now_ms);
  }
  return CE_H2G_OK;
}

ce_h2g_verdict_t ce_h2_guard_feed(ce_h2_guard_t *g, const uint8_t *data, size_t len, uint64_t now_ms) {
  size_t i = 0;
  while (g->verdict == CE_H2G_OK && i < len) {
    if (g->preface_seen < PREFACE_LEN) {
      if (data[i] != (uint8_t)preface[g->preface_seen]) {
        g->verdict = CE_H2G_BAD_PREFACE;
        break;
      }
      g->preface_seen++;
      i++;
      continue;
    }
    if (g->want_pad) {
      /* RFC 9113 §6.1: Pad Length, then data, then padding. All padding (or
       * a pad length nghttp2 will refuse) carries no data: empty. */
      g->want_pad = false;
      uint32_t pad = data[i];
      if (pad + 1u >= g->data_len)
        g->verdict = empty(g, now_ms);
      g->payload_left--;
      i++;
      continue;
    }
    if (g->payload_left > 0) {
      size_t n = len - i;
      if (n > g->payload_left)
        n = (size_t)g->payload_left;
      g->payload_left -= n;
      i += n;
      continue;
    }
    g->hdr[g->hdr_len++] = data[i++];
    if (g->hdr_len == sizeof(g->hdr)) {
      g->hdr_len = 0;
      g->verdict = frame(g, now_ms);
    }
  }
  return g->verdict;
}

ce_h2g_verdict_t ce_h2_guard_note_reset(ce_h2_guard_t *g, uint64_t now_ms) {
  if (g->verdict == CE_H2G_OK && ce_h2g_window_add(&g->rst, now_ms, 1) > CE_H2G_MAX_RST)
    g->verdict = CE_H2G_RAPID_RESET;
  return g->verdict;
}

void ce_h2_guard_note_sent(ce_h2_guard_t *g, size_t len, uint64_t now_ms) {
  size_t credit = CE_H2G_WU_PER_FRAME + len / CE_H2G_WU_BYTES;
  ce_h2g_window_add(&g->wu_credit, now_ms, credit > UINT32_MAX ? UINT32_MAX : (uint32_t)credit);
}

const char *ce_h2_guard_reason(ce_h2g_verdict_t v) {
  switch (v) {
  case CE_H2G_OK: return "ok";
  case CE_H2G_RAPID_RESET: return "h2_rapid_reset";
  case CE_H2G_STREAM_FLOOD: return "h2_stream_flood";
  case CE_H2G_CONTINUATION_FLOOD: return "h2_continuation_flood";
  case CE_H2G_SETTINGS_FLOOD: return "h2_settings_flood";
  case CE_H2G_PING_FLOOD: return "h2_ping_flood";
  case CE_H2G_CONTROL_FLOOD: return "h2_control_flood";
  case CE_H2G_BAD_PREFACE: return "h2_bad_preface";
  }
  return "h2_unknown";
}
