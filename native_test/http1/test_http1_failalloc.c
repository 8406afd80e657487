/* The HTTP/1 parser, body decoder and writer promise to work in the
 * caller's buffers (parser.h, writer.h): with every allocation made to
 * fail, a whole exchange still goes through and not one allocation is
 * attempted. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/error.h"
#include "http1/parser.h"
#include "http1/writer.h"
#include "support/failalloc.h"

Test(http1_failalloc, an_exchange_allocates_nothing) {
  static const char req[] = "POST http://api.example.com/v1?x=1 HTTP/1.1\r\n"
                            "Host: api.example.com\r\nTransfer-Encoding: chunked\r\n"
                            "Connection: keep-alive\r\n\r\n";
  static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
  static const char body[] = "5\r\nhello\r\n0\r\n\r\n";
  char out[1024];
  ce_h1_head_t h, r;
  const char *why;

  ce_failalloc_arm_from(0);
  int rc_req = ce_h1_parse_request(req, strlen(req), &h, &why);
  ce_h1_body_t b;
  ce_h1_body_init(&b, h.framing, h.content_length);
  size_t used = 0, dlen = 0;
  const char *data = NULL;
  int rc_body = ce_h1_body_next(&b, body, strlen(body), &used, &data, &dlen, &why);
  ce_h1_writer_t w;
  ce_h1_writer_init(&w, out, sizeof(out));
  int rc_w = ce_h1_write_request_head(&w, &h, NULL, 0, 0);
  int rc_resp = ce_h1_parse_response(resp, strlen(resp), "POST", 4, &r, &why);
  ce_h1_writer_init(&w, out, sizeof(out));
  int rc_w2 = ce_h1_write_response_head(&w, &r, 0);
  ce_failalloc_disarm();

  cr_expect_eq(rc_req, CE_OK);
  cr_expect_geq(rc_body, 0);
  cr_expect_eq(rc_w, CE_OK);
  cr_expect_eq(rc_resp, CE_OK);
  cr_expect_eq(rc_w2, CE_OK);
  cr_expect_eq(ce_failalloc_count(), 0, "%zu allocations", ce_failalloc_count());
}
