#include "support/loopback.h"

#include <criterion/criterion.h>
#include <netinet/in.h>

uint16_t ce_test_bind_loopback(uv_loop_t *loop, uv_tcp_t *t) {
  cr_assert_eq(uv_tcp_init(loop, t), 0);
  struct sockaddr_in sa;
  uv_ip4_addr("127.0.0.1", 0, &sa);
  cr_assert_eq(uv_tcp_bind(t, (const struct sockaddr *)&sa, 0), 0);
  struct sockaddr_storage bound;
  int len = sizeof(bound);
  cr_assert_eq(uv_tcp_getsockname(t, (struct sockaddr *)&bound, &len), 0);
  return ntohs(((struct sockaddr_in *)&bound)->sin_port);
}
