/* Tests for c_src/proxy/stats.c: the buffer statistics SIGUSR1 writes.
 * The walk over live connections is exercised end to end
 * (test/condukt/netns/sidecar_h2_test.exs, "memory"). */
#include <criterion/criterion.h>
#include <string.h>

#include "proxy/conn.h"
#include "proxy/stats.h"

Test(stats, no_connection_holds_only_the_pool_buffers_handed_out) {
  ce_proxy_t p;
  memset(&p, 0, sizeof(p));
  ce_bufpool_init(&p.inbufs, CE_CONN_INPUT_MAX, 2);
  void *a = ce_bufpool_get(&p.inbufs), *b = ce_bufpool_get(&p.inbufs);
  cr_assert(a != NULL && b != NULL);

  ce_buffer_stats_t st;
  ce_proxy_buffer_stats(&p, &st);
  cr_expect_eq(st.connections, 0);
  cr_expect_eq(st.input, 2 * CE_CONN_INPUT_MAX);
  cr_expect_eq(st.queued, 0);
  cr_expect_eq(st.h2_streams, 0);
  cr_expect_eq(st.held, 2 * CE_CONN_INPUT_MAX);
  cr_expect_eq(st.tls, 0);
  cr_expect_eq(st.upstreams, 0);

  /* Spares kept by the pool are not held by anyone. */
  ce_bufpool_put(&p.inbufs, a);
  ce_bufpool_put(&p.inbufs, b);
  ce_proxy_buffer_stats(&p, &st);
  cr_expect_eq(st.held, 0);
  ce_bufpool_clear(&p.inbufs);
}

Test(stats, the_line) {
  ce_buffer_stats_t st = {.connections = 3, .input = 131072, .queued = 70000, .h2_streams = 65536, .tls = 9000,
                         .upstreams = 2};
  st.held = st.input + st.queued + st.h2_streams;
  char line[256];
  ce_proxy_buffer_stats_text(&st, line, sizeof(line));
  cr_expect_str_eq(line, "buffers: connections=3 held=266608 input=131072 queued=70000 h2_streams=65536 tls=9000 upstreams=2");
  /* A short buffer cuts, never overflows. */
  char tiny[9];
  ce_proxy_buffer_stats_text(&st, tiny, sizeof(tiny));
  cr_expect_str_eq(tiny, "buffers:");
}
