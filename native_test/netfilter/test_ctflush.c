/* Tests for c_src/netfilter/ctflush.c: the exact bytes of the flush
 * request, the parsing of the kernel's answer (bounded, every malformed
 * shape refused), and, as root, the real request in a fresh network
 * namespace: accepted with CAP_NET_ADMIN, refused with a message naming
 * the cause without it. What the flush does to traffic is proved by
 * test/condukt/netns/sidecar_conntrack_test.exs. */
#include <criterion/criterion.h>
#include <errno.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netlink.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/error.h"
#include "netfilter/ctflush.h"

/* ---- the request --------------------------------------------------------- */

Test(ctflush, request_bytes) {
  uint8_t buf[64];
  memset(buf, 0xaa, sizeof(buf));
  size_t len = 0;
  cr_assert_eq(ce_ctflush_request(0x539, 0x01020304, buf, sizeof(buf), &len), 0);
  cr_assert_eq(len, CE_CTFLUSH_REQUEST_LEN);
  struct nlmsghdr h;
  memcpy(&h, buf, sizeof(h));
  cr_assert_eq(h.nlmsg_len, 36);
  cr_assert_eq(h.nlmsg_type, (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE);
  cr_assert_eq(h.nlmsg_flags, NLM_F_REQUEST | NLM_F_ACK);
  cr_assert_eq(h.nlmsg_seq, 0x01020304);
  cr_assert_eq(h.nlmsg_pid, 0);
  /* nfgenmsg: every family, version 0, resource id 0. */
  static const uint8_t nfgen[4] = {0, 0, 0, 0};
  cr_assert_arr_eq(buf + 16, nfgen, 4);
  /* CTA_MARK then CTA_MARK_MASK, each a 4-byte header (length 8 and the
   * type, host order) and a big-endian value. */
  uint16_t alen, atype;
  memcpy(&alen, buf + 20, 2);
  memcpy(&atype, buf + 22, 2);
  cr_assert_eq(alen, 8);
  cr_assert_eq(atype, CTA_MARK);
  static const uint8_t mark[4] = {0x00, 0x00, 0x05, 0x39};
  cr_assert_arr_eq(buf + 24, mark, 4);
  memcpy(&alen, buf + 28, 2);
  memcpy(&atype, buf + 30, 2);
  cr_assert_eq(alen, 8);
  cr_assert_eq(atype, CTA_MARK_MASK);
  static const uint8_t mask[4] = {0xff, 0xff, 0xff, 0xff};
  cr_assert_arr_eq(buf + 32, mask, 4);
  /* Nothing written past the request. */
  cr_assert_eq(buf[36], 0xaa);
}

Test(ctflush, request_full_width_mark) {
  uint8_t buf[CE_CTFLUSH_REQUEST_LEN];
  size_t len = 0;
  cr_assert_eq(ce_ctflush_request(0xdeadbeef, 7, buf, sizeof(buf), &len), 0);
  static const uint8_t mark[4] = {0xde, 0xad, 0xbe, 0xef};
  cr_assert_arr_eq(buf + 24, mark, 4);
}

Test(ctflush, mark_zero_is_refused) {
  /* Mark 0 would select every connection nobody marked. */
  uint8_t buf[CE_CTFLUSH_REQUEST_LEN];
  size_t len = 0;
  cr_assert_eq(ce_ctflush_request(0, 1, buf, sizeof(buf), &len), CE_EINVAL);
  char err[CE_CTFLUSH_ERR_MAX];
  cr_assert_eq(ce_ctflush_mark(0, err, sizeof(err)), CE_EINVAL);
  cr_assert_not_null(strstr(err, "mark 0"), "%s", err);
}

Test(ctflush, request_buffer_too_small_is_untouched) {
  uint8_t buf[CE_CTFLUSH_REQUEST_LEN];
  memset(buf, 0xaa, sizeof(buf));
  size_t len = 99;
  cr_assert_eq(ce_ctflush_request(0x539, 1, buf, CE_CTFLUSH_REQUEST_LEN - 1, &len), CE_ETOOBIG);
  cr_assert_eq(len, 99);
  for (size_t i = 0; i < sizeof(buf); i++)
    cr_assert_eq(buf[i], 0xaa);
  cr_assert_eq(ce_ctflush_request(0x539, 1, buf, 0, &len), CE_ETOOBIG);
}

/* ---- the answer ---------------------------------------------------------- */

/* Writes a netlink message of type `type`, sequence seq and total length
 * len (at least 16) at p; for NLMSG_ERROR with len >= 20 the error code
 * follows the header. Returns len. */
static size_t put_msg(uint8_t *p, uint16_t type, uint32_t seq, uint32_t len, int32_t error) {
  struct nlmsghdr h = {.nlmsg_len = len, .nlmsg_type = type, .nlmsg_seq = seq};
  memset(p, 0, len);
  memcpy(p, &h, sizeof(h));
  if (type == NLMSG_ERROR && len >= 20)
    memcpy(p + 16, &error, 4);
  return len;
}

/* The kernel's acknowledgement: nlmsgerr, the error and our header back. */
#define ACK_LEN (NLMSG_HDRLEN + sizeof(struct nlmsgerr))

static int parse(const uint8_t *buf, size_t n, uint32_t seq, int *kerr) {
  /* A heap copy of exactly n bytes, so ASan catches any read past it. */
  uint8_t *copy = malloc(n > 0 ? n : 1);
  cr_assert_not_null(copy);
  memcpy(copy, buf, n);
  int rc = ce_ctflush_parse_answer(copy, n, seq, kerr);
  free(copy);
  return rc;
}

Test(ctflush, ack_success) {
  uint8_t buf[128];
  size_t n = put_msg(buf, NLMSG_ERROR, 42, ACK_LEN, 0);
  int kerr = -1;
  cr_assert_eq(parse(buf, n, 42, &kerr), 0);
  cr_assert_eq(kerr, 0);
}

Test(ctflush, ack_with_kernel_errors) {
  uint8_t buf[128];
  static const int errs[] = {EPERM, EOPNOTSUPP, ENOENT, EINVAL};
  for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
    size_t n = put_msg(buf, NLMSG_ERROR, 42, ACK_LEN, -errs[i]);
    int kerr = 0;
    cr_assert_eq(parse(buf, n, 42, &kerr), 0);
    cr_assert_eq(kerr, errs[i]);
  }
}

Test(ctflush, other_messages_before_the_ack_are_skipped) {
  uint8_t buf[256];
  size_t n = 0;
  /* An acknowledgement of another request, an odd-length message padded
   * to 4 bytes, then ours. */
  n += put_msg(buf + n, NLMSG_ERROR, 41, ACK_LEN, -EPERM);
  n += put_msg(buf + n, NLMSG_NOOP, 42, 17, 0);
  n += 3; /* padding */
  n += put_msg(buf + n, NLMSG_ERROR, 42, ACK_LEN, -EOPNOTSUPP);
  int kerr = 0;
  cr_assert_eq(parse(buf, n, 42, &kerr), 0);
  cr_assert_eq(kerr, EOPNOTSUPP);
}

Test(ctflush, no_ack_for_us_means_keep_reading) {
  uint8_t buf[256];
  size_t n = put_msg(buf, NLMSG_ERROR, 41, ACK_LEN, 0);
  int kerr = 12345;
  cr_assert_eq(parse(buf, n, 42, &kerr), CE_EAGAIN);
  cr_assert_eq(kerr, 12345, "untouched");
  n = put_msg(buf, NLMSG_DONE, 42, 20, 0);
  cr_assert_eq(parse(buf, n, 42, &kerr), CE_EAGAIN);
  /* An unpadded last message that ends exactly at the datagram's end. */
  n = put_msg(buf, NLMSG_NOOP, 42, 17, 0);
  cr_assert_eq(parse(buf, n, 42, &kerr), CE_EAGAIN);
  cr_assert_eq(parse(buf, 0, 42, &kerr), CE_EAGAIN);
}

Test(ctflush, malformed_answers_are_refused) {
  uint8_t buf[256];
  int kerr = 12345;
  /* Shorter than a header. */
  put_msg(buf, NLMSG_ERROR, 42, ACK_LEN, 0);
  for (size_t n = 1; n < NLMSG_HDRLEN; n++)
    cr_assert_eq(parse(buf, n, 42, &kerr), CE_EPARSE, "n=%zu", n);
  /* A length past the end of the datagram. */
  put_msg(buf, NLMSG_ERROR, 42, ACK_LEN, 0);
  cr_assert_eq(parse(buf, ACK_LEN - 1, 42, &kerr), CE_EPARSE);
  /* A length shorter than the header itself (0 would loop forever). */
  for (uint32_t len = 0; len < NLMSG_HDRLEN; len++) {
    struct nlmsghdr h = {.nlmsg_len = len, .nlmsg_type = NLMSG_NOOP, .nlmsg_seq = 42};
    memset(buf, 0, sizeof(buf));
    memcpy(buf, &h, sizeof(h));
    cr_assert_eq(parse(buf, 64, 42, &kerr), CE_EPARSE, "len=%u", len);
  }
  /* Our acknowledgement, truncated: the error code alone, or less. */
  for (uint32_t len = NLMSG_HDRLEN; len < ACK_LEN; len++) {
    size_t n = put_msg(buf, NLMSG_ERROR, 42, len, 0);
    cr_assert_eq(parse(buf, n, 42, &kerr), CE_EPARSE, "len=%u", len);
  }
  /* A positive or absurd error code. */
  size_t n = put_msg(buf, NLMSG_ERROR, 42, ACK_LEN, 1);
  cr_assert_eq(parse(buf, n, 42, &kerr), CE_EPARSE);
  n = put_msg(buf, NLMSG_ERROR, 42, ACK_LEN, -5000);
  cr_assert_eq(parse(buf, n, 42, &kerr), CE_EPARSE);
  /* A good message followed by a torn one: the torn one is never
   * reached when ours comes first, and refused when it comes first. */
  n = put_msg(buf, NLMSG_NOOP, 41, 20, 0);
  n += put_msg(buf + n, NLMSG_ERROR, 42, ACK_LEN, 0);
  cr_assert_eq(parse(buf, n - 1, 42, &kerr), CE_EPARSE);
  cr_assert_eq(kerr, 12345, "untouched on every failure");
}

/* ---- the real kernel ----------------------------------------------------- */

/* Runs ce_ctflush_mark in a child in a fresh network namespace, as root or
 * (drop) as uid 65534 with no capabilities, with an error buffer of exactly
 * child_cap bytes on the heap (so ASan sees any write past it); returns its
 * CE code and the error text through a pipe. */
static int flush_in_child(bool drop, size_t child_cap, char *err, size_t cap) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    close(fds[0]);
    char *text = malloc(child_cap);
    if (text == NULL)
      _exit(3);
    int rc = -1;
    if (unshare(CLONE_NEWNET) != 0) {
      snprintf(text, child_cap, "unshare: %s", strerror(errno));
    } else if (drop && (setgid(65534) != 0 || setuid(65534) != 0)) {
      snprintf(text, child_cap, "setuid: %s", strerror(errno));
    } else {
      rc = ce_ctflush_mark(0x539, text, child_cap);
    }
    char out[16 + CE_CTFLUSH_ERR_MAX];
    int n = snprintf(out, sizeof(out), "%d\n%s", rc, text);
    free(text);
    if (write(fds[1], out, (size_t)n) != n)
      _exit(2);
    _exit(0);
  }
  close(fds[1]);
  char in[16 + CE_CTFLUSH_ERR_MAX + 1];
  size_t got = 0;
  ssize_t r;
  while (got < sizeof(in) - 1 && (r = read(fds[0], in + got, sizeof(in) - 1 - got)) > 0)
    got += (size_t)r;
  in[got] = '\0';
  close(fds[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char *nl = strchr(in, '\n');
  cr_assert_not_null(nl, "%s", in);
  *nl = '\0';
  snprintf(err, cap, "%s", nl + 1);
  return atoi(in);
}

Test(ctflush, real_flush_in_a_fresh_namespace) {
  if (geteuid() != 0)
    cr_skip_test("not root: cannot create a network namespace");
  char err[CE_CTFLUSH_ERR_MAX];
  int rc = flush_in_child(false, CE_CTFLUSH_ERR_MAX, err, sizeof(err));
  cr_assert_eq(rc, 0, "rc=%d: %s", rc, err);
  cr_assert_str_empty(err);
}

Test(ctflush, without_cap_net_admin_the_cause_is_named) {
  if (geteuid() != 0)
    cr_skip_test("not root: cannot create a network namespace");
  char err[CE_CTFLUSH_ERR_MAX];
  int rc = flush_in_child(true, CE_CTFLUSH_ERR_MAX, err, sizeof(err));
  cr_assert_eq(rc, CE_EPERM, "rc=%d: %s", rc, err);
  cr_assert_not_null(strstr(err, "CAP_NET_ADMIN"), "%s", err);
  cr_assert_not_null(strstr(err, "not permitted"), "%s", err);
}

Test(ctflush, error_text_is_bounded) {
  if (geteuid() != 0)
    cr_skip_test("not root: cannot create a network namespace");
  /* An 8-byte buffer in the child: truncated, NUL-terminated, nothing
   * written past it (ASan aborts the child, and the test, if it were). */
  char err[CE_CTFLUSH_ERR_MAX];
  int rc = flush_in_child(true, 8, err, sizeof(err));
  cr_assert_eq(rc, CE_EPERM);
  cr_assert_str_eq(err, "the ker");
}
