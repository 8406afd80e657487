/*
 * The buffer statistics of stats.h: a walk over the live connections.
 */
#include "proxy/stats.h"

#include <stdio.h>
#include <string.h>

#include "proxy/conn_internal.h"

void ce_proxy_buffer_stats(const ce_proxy_t *p, ce_buffer_stats_t *out) {
  memset(out, 0, sizeof(*out));
  out->connections = p->conn_count;
  out->input = p->inbufs.out * p->inbufs.size;
  for (const ce_conn_t *c = p->conns; c != NULL; c = c->next) {
    out->queued += c->c.queued + c->u.queued;
    out->tls += ce_tlsconn_held(c->c.tls) + ce_tlsconn_held(c->u.tls);
    out->upstreams += c->u.open;
    if (c->h2 != NULL) {
      size_t queued = 0, streams = 0, upstreams = 0, tls = 0;
      ce_h2conn_held(c->h2, &queued, &streams, &upstreams, &tls);
      out->tls += tls;
      out->queued += queued;
      out->h2_streams += streams;
      out->upstreams += upstreams;
    }
  }
  out->held = out->input + out->queued + out->h2_streams;
}

void ce_proxy_buffer_stats_text(const ce_buffer_stats_t *s, char *out, size_t cap) {
  snprintf(out, cap, "buffers: connections=%zu held=%zu input=%zu queued=%zu h2_streams=%zu tls=%zu upstreams=%zu",
           s->connections, s->held, s->input, s->queued, s->h2_streams, s->tls, s->upstreams);
}
