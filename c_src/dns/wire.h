/*
 * The DNS wire format (RFC 1035 §4), as far as the sidecar needs it: one
 * codec shared by the proxy's own stub resolver (stub.c, queries out and
 * answers in) and the resolver it runs for the workspace (server.c,
 * queries in and answers out). docs/dns.md describes both.
 *
 * Parsing is bounded everywhere: a message is at most CE_DNS_MAX_MSG bytes,
 * a name at most 255 bytes on the wire (RFC 1035 §2.3.4), a compressed
 * name follows at most CE_DNS_MAX_POINTERS pointers and every pointer must
 * point backwards (RFC 1035 §4.1.4 only lets a pointer name a prior
 * occurrence), so no input loops. Only A, AAAA and CNAME records of class
 * IN are kept from the answer section (at most CE_DNS_MAX_ANSWERS); others
 * are skipped after their length was checked.
 *
 * Names are handled as text: labels joined by '.', without the final dot,
 * ASCII letters lowered (RFC 4343: names compare case-insensitively). A
 * label holding '.', a byte below 0x21 or above 0x7e cannot be written as
 * such text and makes the message CE_EPARSE: the sidecar never has to
 * reason about a name that prints ambiguously.
 *
 * Nothing here allocates; every function writes only into the caller's
 * structures.
 */
#ifndef CE_DNS_WIRE_H
#define CE_DNS_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* RFC 1035 §4.2.2: TCP messages carry a 16-bit length. */
#define CE_DNS_MAX_MSG 65535u
/* RFC 1035 §2.3.4: 255 bytes on the wire, so 253 characters of text. */
#define CE_DNS_NAME_WIRE_MAX 255u
#define CE_DNS_NAME_MAX 253u
#define CE_DNS_LABEL_MAX 63u
/* Compression pointers followed for one name: more than a name can have
 * labels would only serve a loop or a bomb. */
#define CE_DNS_MAX_POINTERS 64u
/* Answer records kept from one message (A, AAAA, CNAME). */
#define CE_DNS_MAX_ANSWERS 32u
/* The header (RFC 1035 §4.1.1). */
#define CE_DNS_HEADER_LEN 12u

/* Types and class (RFC 1035 §3.2.2, RFC 3596, RFC 9460, RFC 6891). */
#define CE_DNS_TYPE_A 1u
#define CE_DNS_TYPE_NS 2u
#define CE_DNS_TYPE_CNAME 5u
#define CE_DNS_TYPE_SOA 6u
#define CE_DNS_TYPE_PTR 12u
#define CE_DNS_TYPE_MX 15u
#define CE_DNS_TYPE_TXT 16u
#define CE_DNS_TYPE_AAAA 28u
#define CE_DNS_TYPE_SRV 33u
#define CE_DNS_TYPE_OPT 41u
#define CE_DNS_TYPE_SVCB 64u
#define CE_DNS_TYPE_HTTPS 65u
#define CE_DNS_TYPE_ANY 255u
#define CE_DNS_CLASS_IN 1u

/* Header flags (RFC 1035 §4.1.1). */
#define CE_DNS_FLAG_QR 0x8000u
#define CE_DNS_FLAG_AA 0x0400u
#define CE_DNS_FLAG_TC 0x0200u
#define CE_DNS_FLAG_RD 0x0100u
#define CE_DNS_FLAG_RA 0x0080u
#define CE_DNS_OPCODE(flags) (((flags) >> 11) & 0xfu)
#define CE_DNS_RCODE(flags) ((flags) & 0xfu)

/* Response codes (RFC 1035 §4.1.1). */
#define CE_DNS_RCODE_NOERROR 0u
#define CE_DNS_RCODE_FORMERR 1u
#define CE_DNS_RCODE_SERVFAIL 2u
#define CE_DNS_RCODE_NXDOMAIN 3u
#define CE_DNS_RCODE_NOTIMP 4u
#define CE_DNS_RCODE_REFUSED 5u

typedef struct {
  char name[CE_DNS_NAME_MAX + 1]; /* text, lowered, NUL-terminated */
  size_t name_len;
  uint16_t type;
  uint16_t cls;
} ce_dns_question_t;

typedef struct {
  char name[CE_DNS_NAME_MAX + 1]; /* the owner */
  size_t name_len;
  uint16_t type;                  /* A, AAAA or CNAME */
  uint32_t ttl;
  uint8_t addr[16];               /* A: 4 bytes, AAAA: 16 */
  char target[CE_DNS_NAME_MAX + 1]; /* CNAME */
  size_t target_len;
} ce_dns_rr_t;

typedef struct {
  uint16_t id;
  uint16_t flags;
  uint16_t qdcount, ancount, nscount, arcount; /* as the header says */
  bool has_question;               /* qdcount == 1 and it parsed */
  ce_dns_question_t q;
  size_t answer_count;             /* kept records in answers[] */
  ce_dns_rr_t answers[CE_DNS_MAX_ANSWERS];
} ce_dns_msg_t;

/* Reads the (possibly compressed) name at msg[*off] into out (text, as
 * above) and advances *off past the name's bytes at that place.
 * Returns CE_OK, or CE_EPARSE (truncated, a forward or looping pointer,
 * too many pointers, a name past 255 bytes, a reserved label type, a label
 * byte that text cannot carry). On failure *off and out are unspecified. */
int ce_dns_name_read(const uint8_t *msg, size_t len, size_t *off, char out[CE_DNS_NAME_MAX + 1],
                     size_t *out_len);

/* Parses a whole message: the header, at most one question (a message
 * with more is CE_EPARSE: no resolver sends that, RFC 9619) and the answer
 * section (A, AAAA, CNAME of class IN kept, at most CE_DNS_MAX_ANSWERS,
 * the rest skipped). The authority and additional sections are not read.
 * Returns CE_OK, CE_ETOOBIG (len > CE_DNS_MAX_MSG) or CE_EPARSE. On
 * failure *out is unspecified (the header fields may be filled: a server
 * uses id to answer FORMERR). */
int ce_dns_parse(const uint8_t *buf, size_t len, ce_dns_msg_t *out);

/* Writes name (text as above; a final '.' is accepted and dropped) in
 * wire form, uncompressed, at buf[*off], advancing *off. Returns CE_OK,
 * CE_EINVAL (an empty label, a label past 63 bytes, a name past 253
 * characters, a byte text cannot carry) or CE_ETOOBIG (no room in cap). */
int ce_dns_name_write(uint8_t *buf, size_t cap, size_t *off, const char *name, size_t len);

/* Builds a query: header (id, RD set when rd), one question of class IN.
 * When edns_udp is non-zero an OPT record (RFC 6891) announces that UDP
 * payload size. Returns CE_OK with *out_len set, or what
 * ce_dns_name_write returns. */
int ce_dns_build_query(uint8_t *buf, size_t cap, uint16_t id, const char *name, size_t len, uint16_t type,
                       bool rd, uint16_t edns_udp, size_t *out_len);

/* Builds a response to question q (NULL: none, as for a FORMERR on an
 * unparsable query) with the given flags (QR is added; RA, RD, AA and
 * the rcode are the caller's) and the answer records (A, AAAA, CNAME),
 * written in order with the question's name compressed. When the records
 * do not fit in cap, as many as fit are written and TC is set (RFC 2181
 * §9). Returns CE_OK with *out_len set, CE_EINVAL (a record of another
 * type, a bad name) or CE_ETOOBIG (not even the header and question fit). */
int ce_dns_build_response(uint8_t *buf, size_t cap, uint16_t id, uint16_t flags, const ce_dns_question_t *q,
                          const ce_dns_rr_t *answers, size_t count, size_t *out_len);

/* "A", "AAAA", "CNAME", ... for the types above, else "TYPE<n>" written
 * into buf (RFC 3597 §5). Returns buf or a static string. */
const char *ce_dns_type_name(uint16_t type, char buf[16]);

#endif
