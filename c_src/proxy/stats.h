/*
 * What the proxy holds in the buffers it accounts for (docs/proxy.md
 * "Signals", "Limits"): the input buffers of its pool, the bytes queued
 * towards every socket, and on h2 connections the streams' buffers and
 * request heads; apart from these, the room OpenSSL's memory BIOs keep
 * for the connections' TLS (not bounded by a limit, only trimmed at the
 * end of an exchange). SIGUSR1 writes one line of them on stderr. These are the
 * quantities the limits bound, whatever the allocator does with the
 * memory (RSS is the benchmark's measure, bench/README.md).
 */
#ifndef CE_PROXY_STATS_H
#define CE_PROXY_STATS_H

#include <stddef.h>

#include "proxy/proxy.h"

typedef struct {
  size_t connections;  /* live workspace connections */
  size_t input;        /* input buffers handed out by the pool, in bytes */
  size_t queued;       /* bytes given to uv_write and not yet written, every socket */
  size_t h2_streams;   /* h2: stream data buffers and request heads held */
  size_t held;         /* input + queued + h2_streams */
  size_t tls;          /* room of the memory BIOs of the workspace and
                          upstream TLS connections (ce_tlsconn_held); an h2
                          workspace connection's own upstream sessions are
                          not counted */
  size_t upstreams;    /* upstream connections open (or opening), every
                          connection's: an idle keep-alive connection
                          keeps none past --idle-release-ms */
} ce_buffer_stats_t;

/* Adds up what the live connections hold now. */
void ce_proxy_buffer_stats(const ce_proxy_t *p, ce_buffer_stats_t *out);

/* "buffers: connections=N held=B input=B queued=B h2_streams=B tls=B upstreams=N" into out
 * (cap bytes, always NUL-terminated). */
void ce_proxy_buffer_stats_text(const ce_buffer_stats_t *s, char *out, size_t cap);

#endif
