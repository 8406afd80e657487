/*
 * libFuzzer target for the sidecar's DNS parsers: c_src/dns/wire.c (every
 * message the workspace sends to the sidecar's resolver and every answer
 * an upstream returns goes through ce_dns_parse) and c_src/dns/hosts.c
 * (the --hosts file). The first input byte chooses the parser; the rest
 * is its input.
 *
 * Beyond "no crash, no sanitizer report", it checks what the resolver
 * relies on:
 *
 * - ce_dns_parse returns a code its header lists; on CE_OK every name is
 *   NUL-terminated, at most 253 characters, of printable bytes without
 *   '.' inside a label or upper-case letters, and at most
 *   CE_DNS_MAX_ANSWERS records are kept;
 * - a parsed message written again with ce_dns_build_response (its
 *   question and kept records) parses to the same question and records:
 *   the server never writes what it cannot read back;
 * - ce_dns_name_read at every offset either fails or stays in bounds and
 *   moves forward;
 * - ce_hosts_load_buffer accepts or refuses whole; a loaded table answers
 *   lookups for its own names.
 *
 * Any violation aborts, which libFuzzer reports as a crash with the input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "dns/hosts.h"
#include "dns/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "fuzz_dns: %s:%d: %s\n", __FILE__, __LINE__, #cond);     \
      abort();                                                                  \
    }                                                                           \
  } while (0)

static void check_name(const char *name, size_t len) {
  CHECK(len <= CE_DNS_NAME_MAX);
  CHECK(name[len] == '\0' && strlen(name) == len);
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)name[i];
    CHECK(ch >= 0x21 && ch <= 0x7e);
    CHECK(!(ch >= 'A' && ch <= 'Z'));
  }
  CHECK(len == 0 || (name[0] != '.' && name[len - 1] != '.'));
  CHECK(strstr(name, "..") == NULL);
}

static bool same_rr(const ce_dns_rr_t *a, const ce_dns_rr_t *b) {
  if (a->type != b->type || a->name_len != b->name_len || memcmp(a->name, b->name, a->name_len) != 0 ||
      a->ttl != b->ttl)
    return false;
  if (a->type == CE_DNS_TYPE_CNAME)
    return a->target_len == b->target_len && memcmp(a->target, b->target, a->target_len) == 0;
  return memcmp(a->addr, b->addr, a->type == CE_DNS_TYPE_A ? 4 : 16) == 0;
}

static void fuzz_wire(const uint8_t *data, size_t size) {
  static ce_dns_msg_t m, again;
  int rc = ce_dns_parse(data, size, &m);
  CHECK(rc == CE_OK || rc == CE_EPARSE || rc == CE_ETOOBIG);
  if (rc == CE_OK) {
    CHECK(m.answer_count <= CE_DNS_MAX_ANSWERS);
    if (m.has_question)
      check_name(m.q.name, m.q.name_len);
    for (size_t i = 0; i < m.answer_count; i++) {
      const ce_dns_rr_t *rr = &m.answers[i];
      check_name(rr->name, rr->name_len);
      CHECK(rr->type == CE_DNS_TYPE_A || rr->type == CE_DNS_TYPE_AAAA || rr->type == CE_DNS_TYPE_CNAME);
      CHECK(rr->ttl <= 0x7fffffffu);
      if (rr->type == CE_DNS_TYPE_CNAME)
        check_name(rr->target, rr->target_len);
    }
    static uint8_t out[CE_DNS_MAX_MSG];
    size_t len = 0;
    /* A root name cannot be an owner we write, nor an empty label: every
     * parsed name can. */
    int b = ce_dns_build_response(out, sizeof(out), m.id, 0, m.has_question ? &m.q : NULL, m.answers,
                                  m.answer_count, &len);
    CHECK(b == CE_OK);
    CHECK(ce_dns_parse(out, len, &again) == CE_OK);
    CHECK(again.id == m.id && again.has_question == m.has_question);
    if (m.has_question)
      CHECK(again.q.type == m.q.type && again.q.cls == m.q.cls && strcmp(again.q.name, m.q.name) == 0);
    CHECK(again.answer_count == m.answer_count);
    for (size_t i = 0; i < m.answer_count; i++)
      CHECK(same_rr(&again.answers[i], &m.answers[i]));
  }
  char name[CE_DNS_NAME_MAX + 1];
  size_t step = size > 512 ? size / 256 : 1;
  for (size_t at = 0; at < size; at += step) {
    size_t off = at, len = 0;
    if (ce_dns_name_read(data, size, &off, name, &len) == CE_OK) {
      check_name(name, len);
      CHECK(off > at && off <= size);
    }
  }
}

static void fuzz_hosts(const uint8_t *data, size_t size) {
  ce_hosts_t *h = NULL;
  char err[CE_HOSTS_ERROR_MAX];
  int rc = ce_hosts_load_buffer((const char *)data, size, &h, err, sizeof(err));
  CHECK(rc == CE_OK || rc == CE_EPARSE || rc == CE_ETOOBIG || rc == CE_ENOMEM);
  CHECK((rc == CE_OK) == (h != NULL));
  if (h == NULL)
    return;
  /* The second word of the first line that has one is a name it knows. */
  const char *p = (const char *)data, *end = p + size;
  while (p < end && *p != '\n') {
    while (p < end && (*p == ' ' || *p == '\t'))
      p++;
    const char *w = p;
    while (p < end && *p != ' ' && *p != '\t' && *p != '\n' && *p != '#' && *p != '\r')
      p++;
    if (w == p || *w == '#')
      break;
    while (p < end && (*p == ' ' || *p == '\t'))
      p++;
    const char *n = p;
    while (p < end && *p != ' ' && *p != '\t' && *p != '\n' && *p != '#' && *p != '\r')
      p++;
    if (p > n) {
      ce_hosts_addr_t a[CE_HOSTS_MAX_ADDRS];
      CHECK(ce_hosts_lookup(h, n, (size_t)(p - n), a, CE_HOSTS_MAX_ADDRS) >= 1);
    }
    break;
  }
  ce_hosts_free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  if (data[0] & 1)
    fuzz_hosts(data + 1, size - 1);
  else
    fuzz_wire(data + 1, size - 1);
  return 0;
}
