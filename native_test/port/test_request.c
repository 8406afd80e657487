/* Tests for c_src/port/request.c: the {call, Id, Op} / {ack, Chan, N}
 * envelope, and what each refusal lets the port answer. */
#include <criterion/criterion.h>
#include <ei.h>
#include <string.h>

#include "common/error.h"
#include "port/request.h"
#include "support/term.h"

static void setup(void) { ei_init(); }

TestSuite(port_request, .init = setup);

static int parse(const char *text, ce_port_request_t *req, char *err) {
  ei_x_buff x;
  ce_test_term(&x, text);
  int rc = ce_port_request_parse(x.buff, (size_t)x.index, req, err, 256);
  ei_x_free(&x);
  return rc;
}

Test(port_request, call) {
  ce_port_request_t r;
  char err[256];
  cr_assert_eq(parse("{call, 18446744073709551615, {token_new, 16}}", &r, err), CE_OK, "%s", err);
  cr_assert_eq(r.kind, CE_PORT_REQ_CALL);
  cr_assert(r.has_id);
  cr_assert_eq(r.id, UINT64_MAX);
  cr_assert_str_eq(r.op, "token_new");
  cr_assert_eq(r.argc, 1);
  cr_assert_eq(parse("{call, 0, {version}}", &r, err), CE_OK);
  cr_assert_eq(r.argc, 0);
}

Test(port_request, ack) {
  ce_port_request_t r;
  char err[256];
  cr_assert_eq(parse("{ack, 3, 10}", &r, err), CE_OK, "%s", err);
  cr_assert_eq(r.kind, CE_PORT_REQ_ACK);
  cr_assert_eq(r.chan, 3);
  cr_assert_eq(r.n, 10);
  cr_assert_eq(parse("{ack, 0, 10}", &r, err), CE_EINVAL);
  cr_assert(strstr(err, "Chan") != NULL, "%s", err);
  cr_assert_eq(parse("{ack, 1, 0}", &r, err), CE_EINVAL);
  cr_assert(strstr(err, "N must be") != NULL, "%s", err);
  cr_assert_eq(parse("{ack, 1, -5}", &r, err), CE_EINVAL);
  cr_assert_not(r.has_id);
}

/* {post, Chan, Tag, Frame}: Tag is any term (its bytes are echoed back on
 * failure), Frame is checked by the operation, not here. */
Test(port_request, post) {
  ce_port_request_t r;
  char err[256];
  ei_x_buff x;
  ce_test_term(&x, "{post, 5, {decision, <<\"7\">>, allow, [1,2]}, #{type => ping}}");
  cr_assert_eq(ce_port_request_parse(x.buff, (size_t)x.index, &r, err, sizeof(err)), CE_OK, "%s",
               err);
  cr_assert_eq(r.kind, CE_PORT_REQ_POST);
  cr_assert_eq(r.chan, 5);
  cr_assert_not(r.has_id);
  cr_assert_eq(x.buff[r.args], 'h', "Tag is not at args");
  cr_assert_eq((unsigned char)x.buff[r.frame], ERL_MAP_EXT, "Frame is not at frame");
  cr_assert_lt(r.args, r.frame);
  ei_x_free(&x);
  cr_assert_eq(parse("{post, 1, tag, not_a_map}", &r, err), CE_OK, "%s", err);
  cr_assert_eq(parse("{post, 0, tag, #{}}", &r, err), CE_EINVAL);
  cr_assert(strstr(err, "post: Chan must be a positive integer") != NULL, "%s", err);
  cr_assert_eq(parse("{post, 1, #{}}", &r, err), CE_EINVAL);
  cr_assert_eq(parse("{post, 1, tag, #{}, extra}", &r, err), CE_EINVAL);
  cr_assert_eq(parse("{call, 1, {version}, extra}", &r, err), CE_EINVAL);
  cr_assert_not(r.has_id);
}

Test(port_request, refusals_without_an_id) {
  ce_port_request_t r;
  char err[256];
  const char *bad[] = {"foo", "{call, 1}", "{cast, 1, {version}}", "{call, -1, {version}}",
                       "{call, <<\"1\">>, {version}}", "[call, 1, {version}]",
                       "{\"call\", 1, {version}}"};
  for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
    cr_assert_eq(parse(bad[k], &r, err), CE_EINVAL, "%s", bad[k]);
    cr_assert_not(r.has_id, "%s", bad[k]);
    cr_assert(err[0] != '\0');
  }
}

Test(port_request, refusals_with_an_id) {
  ce_port_request_t r;
  char err[256];
  cr_assert_eq(parse("{call, 7, version}", &r, err), CE_EINVAL);
  cr_assert(r.has_id);
  cr_assert_eq(r.id, 7);
  cr_assert(strstr(err, "Op must be a tuple") != NULL, "%s", err);
  cr_assert_eq(parse("{call, 7, {}}", &r, err), CE_EINVAL);
  cr_assert(r.has_id);
  cr_assert_eq(parse("{call, 7, {<<\"version\">>}}", &r, err), CE_EINVAL);
  cr_assert(r.has_id);
  cr_assert(strstr(err, "name must be an atom") != NULL, "%s", err);
}

Test(port_request, badterm) {
  ce_port_request_t r;
  char err[256];
  cr_assert_eq(ce_port_request_parse("\x83\x68", 2, &r, err, sizeof(err)), CE_EPARSE);
  cr_assert(strstr(err, "truncated") != NULL, "%s", err);
}
