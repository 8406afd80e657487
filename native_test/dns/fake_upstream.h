/* A DNS server for the tests of c_src/dns (stub.c, server.c), on the test's
 * own libuv loop: UDP and TCP on one loopback port the kernel chose. Its
 * answers follow its mode; it counts what it was asked. */
#ifndef CE_TEST_DNS_FAKE_UPSTREAM_H
#define CE_TEST_DNS_FAKE_UPSTREAM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

typedef enum {
  FAKE_ANSWER = 0,   /* A 192.0.2.1 / AAAA 2001:db8::1; "cname.test" is a CNAME to "target.test";
                        "loop.test" a CNAME to itself; "long.test" a chain of 12; "nx.test" NXDOMAIN;
                        "empty.test" no record */
  FAKE_FORGED_FIRST, /* first a wrong id, then a wrong name, then a wrong type, then the answer */
  FAKE_TRUNCATE,     /* UDP: TC and nothing else; TCP: the answer */
  FAKE_SERVFAIL,
  FAKE_SILENT,
} fake_mode_t;

typedef struct {
  uv_udp_t udp;
  uv_tcp_t tcp;
  uv_tcp_t conn;
  bool conn_open;
  uint8_t in[2 + 1024];
  size_t in_len;
  fake_mode_t mode;
  int udp_queries;
  int tcp_queries;
  struct sockaddr_storage addr;
  char last_name[256];
  uint8_t out[4096];
} fake_upstream_t;

void fake_start(uv_loop_t *loop, fake_upstream_t *f, fake_mode_t mode);
/* Closes its handles (the loop must run). */
void fake_stop(fake_upstream_t *f);

#endif
