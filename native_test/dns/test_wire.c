/* Tests for c_src/dns/wire.c: names (compression and its abuses), whole
 * messages, and the query and response builders, round trips included. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/error.h"
#include "dns/wire.h"

/* A header: id 0x1234, the given flags and counts. */
static size_t header(uint8_t *b, uint16_t flags, uint16_t qd, uint16_t an) {
  memset(b, 0, 12);
  b[0] = 0x12;
  b[1] = 0x34;
  b[2] = (uint8_t)(flags >> 8);
  b[3] = (uint8_t)flags;
  b[5] = (uint8_t)qd;
  b[7] = (uint8_t)an;
  return 12;
}

static size_t put(uint8_t *b, size_t off, const void *data, size_t n) {
  memcpy(b + off, data, n);
  return off + n;
}

Test(dns_wire, name_read_plain_and_lowered) {
  const uint8_t msg[] = "\x03" "WwW" "\x07" "Example" "\x03" "com" "\x00";
  size_t off = 0, len = 0;
  char out[CE_DNS_NAME_MAX + 1];
  cr_assert_eq(ce_dns_name_read(msg, sizeof(msg) - 1, &off, out, &len), CE_OK);
  cr_expect_str_eq(out, "www.example.com");
  cr_expect_eq(len, 15);
  cr_expect_eq(off, sizeof(msg) - 1);
}

Test(dns_wire, name_read_root) {
  const uint8_t msg[] = {0};
  size_t off = 0, len = 9;
  char out[CE_DNS_NAME_MAX + 1];
  cr_assert_eq(ce_dns_name_read(msg, 1, &off, out, &len), CE_OK);
  cr_expect_eq(len, 0);
  cr_expect_str_eq(out, "");
  cr_expect_eq(off, 1);
}

Test(dns_wire, name_read_compressed_backwards) {
  uint8_t msg[64];
  size_t o = put(msg, 0, "\x07" "example" "\x03" "com" "\x00", 13);
  o = put(msg, o, "\x03" "api" "\xc0\x00", 6);
  size_t off = 13, len = 0;
  char out[CE_DNS_NAME_MAX + 1];
  cr_assert_eq(ce_dns_name_read(msg, o, &off, out, &len), CE_OK);
  cr_expect_str_eq(out, "api.example.com");
  cr_expect_eq(off, 19, "the offset goes past the pointer, not the target");
}

Test(dns_wire, name_read_refuses_forward_self_and_looping_pointers) {
  char out[CE_DNS_NAME_MAX + 1];
  size_t len, off;
  /* A pointer to itself. */
  const uint8_t self[] = {0xc0, 0x00};
  off = 0;
  cr_expect_eq(ce_dns_name_read(self, 2, &off, out, &len), CE_EPARSE);
  /* A pointer forwards. */
  const uint8_t fwd[] = {0xc0, 0x02, 0x00};
  off = 0;
  cr_expect_eq(ce_dns_name_read(fwd, 3, &off, out, &len), CE_EPARSE);
  /* Two pointers that point at each other. */
  const uint8_t loop[] = {0x01, 'a', 0xc0, 0x04, 0x01, 'b', 0xc0, 0x00};
  off = 4;
  cr_expect_eq(ce_dns_name_read(loop, sizeof(loop), &off, out, &len), CE_EPARSE);
  /* A pointer cut in half, a label past the end, no final zero. */
  const uint8_t half[] = {0x01, 'a', 0xc0};
  off = 0;
  cr_expect_eq(ce_dns_name_read(half, 3, &off, out, &len), CE_EPARSE);
  const uint8_t past[] = {0x05, 'a', 'b'};
  off = 0;
  cr_expect_eq(ce_dns_name_read(past, 3, &off, out, &len), CE_EPARSE);
  const uint8_t open[] = {0x01, 'a'};
  off = 0;
  cr_expect_eq(ce_dns_name_read(open, 2, &off, out, &len), CE_EPARSE);
  /* The retired label types 01 and 10. */
  const uint8_t ext[] = {0x41, 0x00};
  off = 0;
  cr_expect_eq(ce_dns_name_read(ext, 2, &off, out, &len), CE_EPARSE);
}

Test(dns_wire, name_read_refuses_bytes_text_cannot_carry) {
  char out[CE_DNS_NAME_MAX + 1];
  size_t len, off = 0;
  const uint8_t dot[] = {0x03, 'a', '.', 'b', 0x00};
  cr_expect_eq(ce_dns_name_read(dot, sizeof(dot), &off, out, &len), CE_EPARSE);
  off = 0;
  const uint8_t nul[] = {0x02, 'a', 0x00, 0x00};
  cr_expect_eq(ce_dns_name_read(nul, sizeof(nul), &off, out, &len), CE_EPARSE);
  off = 0;
  const uint8_t high[] = {0x02, 'a', 0xc3, 0x00};
  cr_expect_eq(ce_dns_name_read(high, sizeof(high), &off, out, &len), CE_EPARSE);
}

Test(dns_wire, name_read_bounds_255_wire_bytes) {
  /* Four labels of 63 bytes: 4 * 64 + 1 = 257 bytes. */
  uint8_t msg[300];
  size_t o = 0;
  for (int i = 0; i < 4; i++) {
    msg[o++] = 63;
    memset(msg + o, 'a', 63);
    o += 63;
  }
  msg[o++] = 0;
  char out[CE_DNS_NAME_MAX + 1];
  size_t len, off = 0;
  cr_expect_eq(ce_dns_name_read(msg, o, &off, out, &len), CE_EPARSE);
  /* 3 * 64 + 62 (61 + 1) + 1 = 255: the most there is. */
  msg[3 * 64] = 61;
  msg[3 * 64 + 62] = 0;
  off = 0;
  cr_assert_eq(ce_dns_name_read(msg, 3 * 64 + 63, &off, out, &len), CE_OK);
  cr_expect_eq(len, 253);
  /* The same length reached through pointers counts too: each name is a
   * 63-byte label and a pointer to the one before it. */
  uint8_t bomb[600];
  size_t prev = 0, last = 0;
  o = 0;
  for (int i = 0; i < 5; i++) {
    size_t start = o;
    bomb[o++] = 63;
    memset(bomb + o, 'b', 63);
    o += 63;
    if (i == 0) {
      bomb[o++] = 0;
    } else {
      bomb[o++] = (uint8_t)(0xc0 | (prev >> 8));
      bomb[o++] = (uint8_t)prev;
    }
    prev = last = start;
  }
  off = 65; /* the second name: 2 labels, fine */
  cr_expect_eq(ce_dns_name_read(bomb, o, &off, out, &len), CE_OK);
  off = last; /* the fifth: 5 labels of 63, past 255 */
  cr_expect_eq(ce_dns_name_read(bomb, o, &off, out, &len), CE_EPARSE);
}

Test(dns_wire, name_write_and_errors) {
  uint8_t b[300];
  size_t off = 0;
  cr_assert_eq(ce_dns_name_write(b, sizeof(b), &off, "api.example.com.", 16), CE_OK);
  cr_expect_eq(off, 17);
  cr_expect_eq(memcmp(b, "\x03" "api" "\x07" "example" "\x03" "com" "\x00", 17), 0);
  off = 0;
  cr_assert_eq(ce_dns_name_write(b, sizeof(b), &off, "", 0), CE_OK);
  cr_expect_eq(off, 1);
  off = 0;
  cr_expect_eq(ce_dns_name_write(b, sizeof(b), &off, "a..b", 4), CE_EINVAL);
  cr_expect_eq(ce_dns_name_write(b, sizeof(b), &off, ".a", 2), CE_EINVAL);
  cr_expect_eq(ce_dns_name_write(b, sizeof(b), &off, "a..", 3), CE_EINVAL);
  cr_expect_eq(ce_dns_name_write(b, sizeof(b), &off, "a b", 3), CE_EINVAL);
  char big[70];
  memset(big, 'x', 64);
  cr_expect_eq(ce_dns_name_write(b, sizeof(b), &off, big, 64), CE_EINVAL, "a 64-byte label");
  cr_expect_eq(ce_dns_name_write(b, 4, &off, "abcd", 4), CE_ETOOBIG);
  cr_expect_eq(ce_dns_name_write(b, 5, &off, "abcd", 4), CE_ETOOBIG, "no room for the final zero");
}

Test(dns_wire, parse_question_and_answers) {
  uint8_t m[512];
  size_t o = header(m, CE_DNS_FLAG_QR | CE_DNS_FLAG_RD | CE_DNS_FLAG_RA, 1, 4);
  o = put(m, o, "\x03" "www" "\x07" "example" "\x03" "com" "\x00" "\x00\x01" "\x00\x01", 21);
  /* www CNAME cdn.example.com (compressed), cdn A 192.0.2.1, a TXT to
   * skip, cdn AAAA 2001:db8::1. */
  o = put(m, o, "\xc0\x0c" "\x00\x05" "\x00\x01" "\x00\x00\x00\x3c" "\x00\x06" "\x03" "cdn" "\xc0\x10", 18);
  size_t cdn = o - 6;
  uint8_t ptr[2] = {0xc0, (uint8_t)cdn};
  o = put(m, o, ptr, 2);
  o = put(m, o, "\x00\x01" "\x00\x01" "\x80\x00\x00\x01" "\x00\x04" "\xc0\x00\x02\x01", 14);
  o = put(m, o, ptr, 2);
  o = put(m, o, "\x00\x10" "\x00\x01" "\x00\x00\x00\x01" "\x00\x03" "\x02hi", 13);
  o = put(m, o, ptr, 2);
  o = put(m, o, "\x00\x1c" "\x00\x01" "\x00\x00\x00\x05" "\x00\x10", 10);
  o = put(m, o, "\x20\x01\x0d\xb8\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01", 16);
  ce_dns_msg_t msg;
  cr_assert_eq(ce_dns_parse(m, o, &msg), CE_OK);
  cr_expect_eq(msg.id, 0x1234);
  cr_expect(msg.has_question);
  cr_expect_str_eq(msg.q.name, "www.example.com");
  cr_expect_eq(msg.q.type, CE_DNS_TYPE_A);
  cr_assert_eq(msg.answer_count, 3, "the TXT is skipped");
  cr_expect_eq(msg.answers[0].type, CE_DNS_TYPE_CNAME);
  cr_expect_str_eq(msg.answers[0].target, "cdn.example.com");
  cr_expect_eq(msg.answers[0].ttl, 60);
  cr_expect_str_eq(msg.answers[1].name, "cdn.example.com");
  cr_expect_eq(msg.answers[1].ttl, 0, "a TTL with the top bit set is 0 (RFC 2181 §8)");
  cr_expect_eq(memcmp(msg.answers[1].addr, "\xc0\x00\x02\x01", 4), 0);
  cr_expect_eq(msg.answers[2].type, CE_DNS_TYPE_AAAA);
  cr_expect_eq(msg.answers[2].addr[15], 1);
}

Test(dns_wire, parse_refuses_bad_messages) {
  uint8_t m[512] = {0};
  ce_dns_msg_t msg;
  cr_expect_eq(ce_dns_parse(m, 11, &msg), CE_EPARSE, "shorter than a header");
  cr_expect_eq(ce_dns_parse(m, CE_DNS_MAX_MSG + 1, &msg), CE_ETOOBIG);
  size_t o = header(m, 0, 2, 0);
  o = put(m, o, "\x01" "a" "\x00" "\x00\x01\x00\x01" "\x01" "b" "\x00" "\x00\x01\x00\x01", 14);
  cr_expect_eq(ce_dns_parse(m, o, &msg), CE_EPARSE, "two questions");
  o = header(m, 0, 1, 0);
  o = put(m, o, "\x01" "a" "\x00" "\x00\x01", 5);
  cr_expect_eq(ce_dns_parse(m, o, &msg), CE_EPARSE, "a question cut short");
  o = header(m, CE_DNS_FLAG_QR, 1, 1);
  o = put(m, o, "\x01" "a" "\x00" "\x00\x01\x00\x01", 7);
  o = put(m, o, "\xc0\x0c" "\x00\x01" "\x00\x01" "\x00\x00\x00\x01" "\x00\x05" "\x01\x02\x03\x04\x05", 17);
  cr_expect_eq(ce_dns_parse(m, o, &msg), CE_EPARSE, "an A record of 5 bytes");
  o = header(m, CE_DNS_FLAG_QR, 1, 1);
  o = put(m, o, "\x01" "a" "\x00" "\x00\x01\x00\x01", 7);
  o = put(m, o, "\xc0\x0c" "\x00\x01" "\x00\x01" "\x00\x00\x00\x01" "\x00\x04" "\x01\x02", 14);
  cr_expect_eq(ce_dns_parse(m, o, &msg), CE_EPARSE, "rdata past the end");
  o = header(m, CE_DNS_FLAG_QR, 1, 1);
  o = put(m, o, "\x01" "a" "\x00" "\x00\x05\x00\x01", 7);
  o = put(m, o, "\xc0\x0c" "\x00\x05" "\x00\x01" "\x00\x00\x00\x01" "\x00\x04" "\x01" "b" "\x00" "\x00", 16);
  cr_expect_eq(ce_dns_parse(m, o, &msg), CE_EPARSE, "a CNAME target shorter than its rdata");
  o = header(m, CE_DNS_FLAG_QR, 1, 2);
  o = put(m, o, "\x01" "a" "\x00" "\x00\x01\x00\x01", 7);
  cr_expect_eq(ce_dns_parse(m, o, &msg), CE_EPARSE, "answers announced, none there");
}

Test(dns_wire, parse_keeps_at_most_max_answers) {
  uint8_t m[4096];
  size_t o = header(m, CE_DNS_FLAG_QR, 1, 40);
  o = put(m, o, "\x01" "a" "\x00" "\x00\x01\x00\x01", 7);
  for (int i = 0; i < 40; i++)
    o = put(m, o, "\xc0\x0c" "\x00\x01" "\x00\x01" "\x00\x00\x00\x01" "\x00\x04" "\x01\x02\x03\x04", 16);
  ce_dns_msg_t msg;
  cr_assert_eq(ce_dns_parse(m, o, &msg), CE_OK);
  cr_expect_eq(msg.answer_count, CE_DNS_MAX_ANSWERS);
}

Test(dns_wire, query_round_trip) {
  uint8_t b[600];
  size_t len;
  cr_assert_eq(ce_dns_build_query(b, sizeof(b), 0xbeef, "Api.Example.com", 15, CE_DNS_TYPE_AAAA, true, 1232, &len),
               CE_OK);
  ce_dns_msg_t msg;
  cr_assert_eq(ce_dns_parse(b, len, &msg), CE_OK);
  cr_expect_eq(msg.id, 0xbeef);
  cr_expect(msg.flags & CE_DNS_FLAG_RD);
  cr_expect_not(msg.flags & CE_DNS_FLAG_QR);
  cr_expect_str_eq(msg.q.name, "api.example.com");
  cr_expect_eq(msg.q.type, CE_DNS_TYPE_AAAA);
  cr_expect_eq(msg.arcount, 1, "the OPT record");
  cr_expect_eq(ce_dns_build_query(b, 20, 1, "api.example.com", 15, 1, true, 0, &len), CE_ETOOBIG);
  cr_expect_eq(ce_dns_build_query(b, sizeof(b), 1, "a..b", 4, 1, true, 0, &len), CE_EINVAL);
}

Test(dns_wire, response_round_trip_and_truncation) {
  ce_dns_question_t q = {.name = "www.example.com", .name_len = 15, .type = CE_DNS_TYPE_A, .cls = CE_DNS_CLASS_IN};
  ce_dns_rr_t rrs[20];
  memset(rrs, 0, sizeof(rrs));
  strcpy(rrs[0].name, "www.example.com");
  rrs[0].name_len = 15;
  rrs[0].type = CE_DNS_TYPE_CNAME;
  rrs[0].ttl = 30;
  strcpy(rrs[0].target, "cdn.example.net");
  rrs[0].target_len = 15;
  for (int i = 1; i < 20; i++) {
    strcpy(rrs[i].name, "cdn.example.net");
    rrs[i].name_len = 15;
    rrs[i].type = CE_DNS_TYPE_A;
    rrs[i].ttl = 5;
    rrs[i].addr[0] = 192;
    rrs[i].addr[3] = (uint8_t)i;
  }
  uint8_t b[CE_DNS_MAX_MSG];
  size_t len;
  cr_assert_eq(ce_dns_build_response(b, sizeof(b), 7, CE_DNS_FLAG_RA | CE_DNS_FLAG_RD, &q, rrs, 20, &len), CE_OK);
  ce_dns_msg_t msg;
  cr_assert_eq(ce_dns_parse(b, len, &msg), CE_OK);
  cr_expect(msg.flags & CE_DNS_FLAG_QR);
  cr_expect_not(msg.flags & CE_DNS_FLAG_TC);
  cr_expect_eq(msg.answer_count, 20);
  cr_expect_str_eq(msg.answers[0].target, "cdn.example.net");
  cr_expect_eq(msg.answers[19].addr[3], 19);
  /* 100 bytes: the question and a few records, TC set. */
  cr_assert_eq(ce_dns_build_response(b, 100, 7, CE_DNS_RCODE_NOERROR, &q, rrs, 20, &len), CE_OK);
  cr_assert_eq(ce_dns_parse(b, len, &msg), CE_OK);
  cr_expect(msg.flags & CE_DNS_FLAG_TC);
  cr_expect_lt(msg.answer_count, 20);
  cr_expect_leq(len, 100);
  /* NXDOMAIN without a question (a FORMERR-like answer). */
  cr_assert_eq(ce_dns_build_response(b, sizeof(b), 9, CE_DNS_RCODE_FORMERR, NULL, NULL, 0, &len), CE_OK);
  cr_expect_eq(len, 12);
  cr_expect_eq(CE_DNS_RCODE(b[3]), CE_DNS_RCODE_FORMERR);
  /* A record type the builder does not write. */
  rrs[1].type = CE_DNS_TYPE_TXT;
  cr_expect_eq(ce_dns_build_response(b, sizeof(b), 7, 0, &q, rrs, 2, &len), CE_EINVAL);
  cr_expect_eq(ce_dns_build_response(b, 11, 7, 0, &q, rrs, 0, &len), CE_ETOOBIG);
}

Test(dns_wire, type_names) {
  char buf[16];
  cr_expect_str_eq(ce_dns_type_name(CE_DNS_TYPE_A, buf), "A");
  cr_expect_str_eq(ce_dns_type_name(CE_DNS_TYPE_HTTPS, buf), "HTTPS");
  cr_expect_str_eq(ce_dns_type_name(4321, buf), "TYPE4321");
}
