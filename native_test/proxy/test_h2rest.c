/* Tests for ce_h2conn_releasable (c_src/proxy/http2/pool.c): when an h2
 * workspace connection rests for --idle-release-ms and gives back its
 * upstream connections. The records are built by hand (no socket): the
 * connection at rest with its first upstream open is releasable, and each
 * thing that keeps it busy, flipped alone, makes it not. The release
 * itself runs end to end in the netns tier (sidecar_h2_idle_release_test). */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "proxy/http2/h2_internal.h"

typedef struct {
  ce_conn_t c;
  h2_t h;
  h2s_t s;
} rest_t;

static rest_t *rest_new(void) {
  rest_t *r = calloc(1, sizeof(*r));
  cr_assert_not_null(r);
  r->c.state = ST_H2;
  r->c.h2 = &r->h;
  r->h.c = &r->c;
  for (size_t i = 0; i < CE_H2_H1_POOL; i++) {
    h1slot_t *sl = &r->h.slots[i];
    sl->h = &r->h;
    sl->conn_slot = i == 0;
    sl->s = i == 0 ? &r->c.u : &sl->own;
  }
  r->c.u.open = true; /* the first upstream connection */
  return r;
}

Test(h2rest, a_connection_with_no_stream_and_an_open_upstream_is_releasable) {
  rest_t *r = rest_new();
  cr_assert(ce_h2conn_releasable(&r->c));
  /* An own slot's connection, or an h2 session alone, is something to release too. */
  r->c.u.open = false;
  cr_assert_not(ce_h2conn_releasable(&r->c), "nothing to release: no upstream, no TLS room");
  r->h.slots[3].own.open = true;
  cr_assert(ce_h2conn_releasable(&r->c));
  r->h.slots[3].own.open = false;
  r->h.slots[2].sess = (nghttp2_session *)&r->s; /* never dereferenced */
  cr_assert(ce_h2conn_releasable(&r->c));
  r->h.slots[2].sess = NULL;
  r->h.head = (ce_h1_head_t *)&r->s; /* the streams' scratch head, never dereferenced */
  cr_assert(ce_h2conn_releasable(&r->c));
  free(r);
}

/* Each condition alone keeps the upstreams. */
Test(h2rest, anything_in_flight_keeps_the_upstreams) {
  for (int k = 0; k < 13; k++) {
    rest_t *r = rest_new();
    switch (k) {
    case 0: r->h.streams = &r->s; break;                          /* a stream: open, queued, asking, previewing */
    case 1: r->c.c.in_len = 1; break;                             /* input not yet consumed */
    case 2: r->c.up_for = CE_UP_FOR_H2_STREAMS; break;            /* slot 0 connecting */
    case 3: r->c.uk.state = CE_CONNECTOR_HANDSHAKING; break;      /* c->u's connector busy */
    case 4: r->h.slots[4].connecting = true; break;               /* an own slot connecting */
    case 5: r->h.slots[5].k.state = CE_CONNECTOR_RESOLVING; break; /* ... its lookup */
    case 6: r->h.slots[1].cur = &r->s; break;                     /* a slot serving a stream */
    case 7: r->h.failed = true; break;                            /* a connection failure */
    case 8: r->h.closing = true; break;
    case 9: r->h.draining = true; break;                          /* SIGTERM's drain */
    case 10: r->c.hard_deadline = true; break;                    /* the failure's fixed end */
    case 11: r->c.dead = true; break;
    case 12: r->c.state = ST_HEAD; break;                         /* not h2 */
    }
    cr_assert_not(ce_h2conn_releasable(&r->c), "condition %d keeps the connection busy", k);
    free(r);
  }
}

Test(h2rest, a_connection_without_its_h2_record_is_not_releasable) {
  rest_t *r = rest_new();
  r->c.h2 = NULL;
  cr_assert_not(ce_h2conn_releasable(&r->c));
  free(r);
}
