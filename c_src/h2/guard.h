/*
 * Frame-level defences for an HTTP/2 connection from the workspace
 * (docs/http2.md §5). The guard reads the raw plaintext stream the client
 * sends, before nghttp2 does: it skips the client preface, then walks the
 * 9-byte frame headers and counts what floods are made of. The only
 * payload byte it reads is the pad length of a PADDED DATA frame. It
 * allocates nothing, and is a pure function of the bytes and of the times
 * (milliseconds of a monotonic clock) the caller passes.
 *
 * Counters are sliding windows of CE_H2G_WINDOW_S one-second buckets.
 */
#ifndef CE_H2_GUARD_H
#define CE_H2_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CE_H2G_WINDOW_S 10u

/* Limits per window (docs/http2.md §5). */
#define CE_H2G_MAX_RST 200u
/* HEADERS frames (new streams, trailers): a ceiling on one connection's
 * request rate, not a defence of its own (each stream is a request that
 * costs the proxy what an HTTP/1.1 keep-alive request costs, and those have
 * no rate bound; the asymmetric stream attacks, rapid reset and
 * MadeYouReset, are CE_H2G_MAX_RST). 10000 per 10 s, as it once was, ended
 * a busy keep-alive client after ten seconds at 1000 requests/s
 * (h2load -c 4 -m 4 died in the benchmark); 100000 per 10 s is 10000
 * requests/s sustained on one connection, above what one proxy core
 * serves over all its connections. */
#define CE_H2G_MAX_STREAMS 100000u
#define CE_H2G_MAX_SETTINGS 100u
#define CE_H2G_MAX_PING 100u
#define CE_H2G_MAX_EMPTY 10000u
/* WINDOW_UPDATE frames: CE_H2G_MAX_EMPTY per window, plus a credit for what
 * the proxy sent the client in the same window (each DATA frame earns
 * CE_H2G_WU_PER_FRAME, each CE_H2G_WU_BYTES bytes of it one more), so a
 * client that acknowledges every frame of a fast download stays within. */
#define CE_H2G_WU_PER_FRAME 2u
#define CE_H2G_WU_BYTES 1024u
/* One header block: HEADERS + CONTINUATION frames, and its encoded bytes. */
#define CE_H2G_MAX_CONTINUATIONS 16u
#define CE_H2G_MAX_BLOCK_BYTES (80u * 1024u)

typedef enum {
  CE_H2G_OK = 0,
  CE_H2G_RAPID_RESET,
  CE_H2G_STREAM_FLOOD,
  CE_H2G_CONTINUATION_FLOOD,
  CE_H2G_SETTINGS_FLOOD,
  CE_H2G_PING_FLOOD,
  CE_H2G_CONTROL_FLOOD,
  CE_H2G_BAD_PREFACE,
} ce_h2g_verdict_t;

typedef struct {
  uint32_t counts[CE_H2G_WINDOW_S];
  uint64_t second[CE_H2G_WINDOW_S]; /* which second each bucket holds */
} ce_h2g_window_t;

typedef struct {
  size_t preface_seen;      /* bytes of the 24-byte client preface matched */
  uint8_t hdr[9];           /* the frame header being read */
  size_t hdr_len;
  uint64_t payload_left;    /* bytes of the current frame's payload to skip */
  bool want_pad;            /* next payload byte is a PADDED DATA pad length */
  uint32_t data_len;        /* payload length of that DATA frame */
  bool in_block;            /* inside a header block (END_HEADERS not seen) */
  uint32_t block_frames;
  uint64_t block_bytes;
  ce_h2g_verdict_t verdict; /* sticky */
  ce_h2g_window_t rst, streams, settings, ping, empty, wupdate, wu_credit;
} ce_h2_guard_t;

void ce_h2_guard_init(ce_h2_guard_t *g);

/* Scans len more bytes received at now_ms. Returns CE_H2G_OK or the first
 * limit crossed (sticky: later calls return it again). */
ce_h2g_verdict_t ce_h2_guard_feed(ce_h2_guard_t *g, const uint8_t *data, size_t len, uint64_t now_ms);

/* The proxy itself reset one of the client's streams at now_ms (a stream
 * error the client provoked: MadeYouReset). Counted with the client's own
 * RST_STREAM frames; returns the (sticky) verdict. */
ce_h2g_verdict_t ce_h2_guard_note_reset(ce_h2_guard_t *g, uint64_t now_ms);

/* The proxy sent the client a DATA frame of len payload bytes at now_ms:
 * earns WINDOW_UPDATE credit (see CE_H2G_WU_PER_FRAME). */
void ce_h2_guard_note_sent(ce_h2_guard_t *g, size_t len, uint64_t now_ms);

/* The event reason of a verdict: "h2_rapid_reset", ... */
const char *ce_h2_guard_reason(ce_h2g_verdict_t v);

/* Adds n events at now_ms to a window; returns the sum over the window. */
uint32_t ce_h2g_window_add(ce_h2g_window_t *w, uint64_t now_ms, uint32_t n);

#endif
