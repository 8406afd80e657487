#include "dns/wire.h"

#include <stdio.h>
#include <string.h>

#include "common/error.h"

static uint16_t get16(const uint8_t *p) {
  return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t get32(const uint8_t *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

/* A label byte that the dotted text carries without ambiguity. */
static bool text_byte(uint8_t b) {
  return b >= 0x21 && b <= 0x7e && b != '.';
}

static char lower(uint8_t b) {
  return (char)(b >= 'A' && b <= 'Z' ? b + 32 : b);
}

int ce_dns_name_read(const uint8_t *msg, size_t len, size_t *off, char out[CE_DNS_NAME_MAX + 1],
                     size_t *out_len) {
  size_t pos = *off;
  size_t end_of_name = 0; /* where the name ends at its first place; 0 until a pointer was taken */
  bool jumped = false;
  unsigned pointers = 0;
  size_t wire = 0; /* wire bytes of the name so far, final zero included */
  size_t n = 0;
  /* The lowest position a pointer may jump to: strictly before the start
   * of the label run it ends, so every jump goes backwards and the walk
   * ends (RFC 1035 §4.1.4: a pointer names a prior occurrence). */
  size_t run_start = pos;
  for (;;) {
    if (pos >= len)
      return CE_EPARSE;
    uint8_t b = msg[pos];
    if ((b & 0xc0) == 0xc0) {
      if (pos + 1 >= len)
        return CE_EPARSE;
      size_t target = ((size_t)(b & 0x3f) << 8) | msg[pos + 1];
      if (target >= run_start || ++pointers > CE_DNS_MAX_POINTERS)
        return CE_EPARSE;
      if (!jumped) {
        end_of_name = pos + 2;
        jumped = true;
      }
      pos = target;
      run_start = target;
      continue;
    }
    if ((b & 0xc0) != 0) /* 01 and 10: RFC 6891 §5 retired them */
      return CE_EPARSE;
    wire += 1u + b;
    if (wire > CE_DNS_NAME_WIRE_MAX)
      return CE_EPARSE;
    if (b == 0) {
      pos++;
      break;
    }
    if (pos + 1 + b > len)
      return CE_EPARSE;
    if (n > 0)
      out[n++] = '.';
    for (size_t i = 0; i < b; i++) {
      uint8_t ch = msg[pos + 1 + i];
      if (!text_byte(ch))
        return CE_EPARSE;
      out[n++] = lower(ch);
    }
    pos += 1u + b;
  }
  /* wire <= 255 bounds the text to 253 characters. */
  out[n] = '\0';
  *out_len = n;
  *off = jumped ? end_of_name : pos;
  return CE_OK;
}

static int read_question(const uint8_t *buf, size_t len, size_t *off, ce_dns_question_t *q) {
  if (ce_dns_name_read(buf, len, off, q->name, &q->name_len) != CE_OK)
    return CE_EPARSE;
  if (*off + 4 > len)
    return CE_EPARSE;
  q->type = get16(buf + *off);
  q->cls = get16(buf + *off + 2);
  *off += 4;
  return CE_OK;
}

int ce_dns_parse(const uint8_t *buf, size_t len, ce_dns_msg_t *out) {
  out->has_question = false;
  out->answer_count = 0;
  if (len > CE_DNS_MAX_MSG)
    return CE_ETOOBIG;
  if (len < CE_DNS_HEADER_LEN)
    return CE_EPARSE;
  out->id = get16(buf);
  out->flags = get16(buf + 2);
  out->qdcount = get16(buf + 4);
  out->ancount = get16(buf + 6);
  out->nscount = get16(buf + 8);
  out->arcount = get16(buf + 10);
  if (out->qdcount > 1)
    return CE_EPARSE;
  size_t off = CE_DNS_HEADER_LEN;
  if (out->qdcount == 1) {
    if (read_question(buf, len, &off, &out->q) != CE_OK)
      return CE_EPARSE;
    out->has_question = true;
  }
  for (unsigned i = 0; i < out->ancount; i++) {
    ce_dns_rr_t tmp;
    ce_dns_rr_t *rr = out->answer_count < CE_DNS_MAX_ANSWERS ? &out->answers[out->answer_count] : &tmp;
    if (ce_dns_name_read(buf, len, &off, rr->name, &rr->name_len) != CE_OK)
      return CE_EPARSE;
    if (off + 10 > len)
      return CE_EPARSE;
    uint16_t type = get16(buf + off);
    uint16_t cls = get16(buf + off + 2);
    uint32_t ttl = get32(buf + off + 4);
    size_t rdlen = get16(buf + off + 8);
    off += 10;
    if (off + rdlen > len)
      return CE_EPARSE;
    bool keep = false;
    if (cls == CE_DNS_CLASS_IN && type == CE_DNS_TYPE_A) {
      if (rdlen != 4)
        return CE_EPARSE;
      memcpy(rr->addr, buf + off, 4);
      keep = true;
    } else if (cls == CE_DNS_CLASS_IN && type == CE_DNS_TYPE_AAAA) {
      if (rdlen != 16)
        return CE_EPARSE;
      memcpy(rr->addr, buf + off, 16);
      keep = true;
    } else if (cls == CE_DNS_CLASS_IN && type == CE_DNS_TYPE_CNAME) {
      /* The target may be compressed (RFC 1035 §4.1.4) but must end
       * exactly where the record's data ends. */
      size_t t = off;
      if (ce_dns_name_read(buf, len, &t, rr->target, &rr->target_len) != CE_OK || t != off + rdlen)
        return CE_EPARSE;
      keep = true;
    }
    off += rdlen;
    if (keep && rr != &tmp) {
      rr->type = type;
      rr->ttl = ttl & 0x7fffffffu; /* RFC 2181 §8: a TTL with the top bit set is 0 */
      if (ttl & 0x80000000u)
        rr->ttl = 0;
      out->answer_count++;
    }
  }
  return CE_OK;
}

int ce_dns_name_write(uint8_t *buf, size_t cap, size_t *off, const char *name, size_t len) {
  if (len > 0 && name[len - 1] == '.')
    len--;
  if (len > CE_DNS_NAME_MAX)
    return CE_EINVAL;
  size_t pos = *off;
  size_t i = 0;
  while (i < len) {
    size_t j = i;
    while (j < len && name[j] != '.') {
      if (!text_byte((uint8_t)name[j]))
        return CE_EINVAL;
      j++;
    }
    size_t label = j - i;
    if (label == 0 || label > CE_DNS_LABEL_MAX)
      return CE_EINVAL;
    if (pos + 1 + label > cap)
      return CE_ETOOBIG;
    buf[pos] = (uint8_t)label;
    memcpy(buf + pos + 1, name + i, label);
    pos += 1 + label;
    i = j + 1;
    if (j < len && i == len) /* "a..": a dot right before the end was the final one, dropped above */
      return CE_EINVAL;
  }
  if (pos + 1 > cap)
    return CE_ETOOBIG;
  buf[pos++] = 0;
  *off = pos;
  return CE_OK;
}

static void put_header(uint8_t *buf, uint16_t id, uint16_t flags, uint16_t qd, uint16_t an, uint16_t ns,
                       uint16_t ar) {
  put16(buf, id);
  put16(buf + 2, flags);
  put16(buf + 4, qd);
  put16(buf + 6, an);
  put16(buf + 8, ns);
  put16(buf + 10, ar);
}

int ce_dns_build_query(uint8_t *buf, size_t cap, uint16_t id, const char *name, size_t len, uint16_t type,
                       bool rd, uint16_t edns_udp, size_t *out_len) {
  if (cap < CE_DNS_HEADER_LEN)
    return CE_ETOOBIG;
  size_t off = CE_DNS_HEADER_LEN;
  int rc = ce_dns_name_write(buf, cap, &off, name, len);
  if (rc != CE_OK)
    return rc;
  if (off + 4 > cap)
    return CE_ETOOBIG;
  put16(buf + off, type);
  put16(buf + off + 2, CE_DNS_CLASS_IN);
  off += 4;
  if (edns_udp != 0) {
    /* RFC 6891 §6.1.2: root owner, type OPT, class = UDP size, TTL 0, no data. */
    if (off + 11 > cap)
      return CE_ETOOBIG;
    buf[off] = 0;
    put16(buf + off + 1, CE_DNS_TYPE_OPT);
    put16(buf + off + 3, edns_udp);
    put32(buf + off + 5, 0);
    put16(buf + off + 9, 0);
    off += 11;
  }
  put_header(buf, id, rd ? CE_DNS_FLAG_RD : 0, 1, 0, 0, edns_udp != 0 ? 1 : 0);
  *out_len = off;
  return CE_OK;
}

/* Writes one record at buf[*off]; the owner is a pointer to the question's
 * name when it equals it, else written in full. */
static int write_rr(uint8_t *buf, size_t cap, size_t *off, const ce_dns_question_t *q, const ce_dns_rr_t *rr) {
  size_t pos = *off;
  if (q != NULL && rr->name_len == q->name_len && memcmp(rr->name, q->name, q->name_len) == 0) {
    if (pos + 2 > cap)
      return CE_ETOOBIG;
    put16(buf + pos, 0xc000u | CE_DNS_HEADER_LEN);
    pos += 2;
  } else {
    int rc = ce_dns_name_write(buf, cap, &pos, rr->name, rr->name_len);
    if (rc != CE_OK)
      return rc;
  }
  if (pos + 10 > cap)
    return CE_ETOOBIG;
  size_t fixed = pos;
  put16(buf + pos, rr->type);
  put16(buf + pos + 2, CE_DNS_CLASS_IN);
  put32(buf + pos + 4, rr->ttl);
  pos += 10;
  size_t rd_start = pos;
  switch (rr->type) {
  case CE_DNS_TYPE_A:
  case CE_DNS_TYPE_AAAA: {
    size_t n = rr->type == CE_DNS_TYPE_A ? 4 : 16;
    if (pos + n > cap)
      return CE_ETOOBIG;
    memcpy(buf + pos, rr->addr, n);
    pos += n;
    break;
  }
  case CE_DNS_TYPE_CNAME: {
    int rc = ce_dns_name_write(buf, cap, &pos, rr->target, rr->target_len);
    if (rc != CE_OK)
      return rc;
    break;
  }
  default:
    return CE_EINVAL;
  }
  put16(buf + fixed + 8, (uint16_t)(pos - rd_start));
  *off = pos;
  return CE_OK;
}

int ce_dns_build_response(uint8_t *buf, size_t cap, uint16_t id, uint16_t flags, const ce_dns_question_t *q,
                          const ce_dns_rr_t *answers, size_t count, size_t *out_len) {
  if (cap < CE_DNS_HEADER_LEN)
    return CE_ETOOBIG;
  size_t off = CE_DNS_HEADER_LEN;
  if (q != NULL) {
    int rc = ce_dns_name_write(buf, cap, &off, q->name, q->name_len);
    if (rc != CE_OK)
      return rc;
    if (off + 4 > cap)
      return CE_ETOOBIG;
    put16(buf + off, q->type);
    put16(buf + off + 2, q->cls);
    off += 4;
  }
  size_t written = 0;
  bool truncated = false;
  for (size_t i = 0; i < count && i < 0xffffu; i++) {
    size_t pos = off;
    int rc = write_rr(buf, cap, &pos, q, &answers[i]);
    if (rc == CE_ETOOBIG) {
      truncated = true;
      break;
    }
    if (rc != CE_OK)
      return rc;
    off = pos;
    written++;
  }
  flags |= CE_DNS_FLAG_QR;
  if (truncated)
    flags |= CE_DNS_FLAG_TC;
  put_header(buf, id, flags, q != NULL ? 1 : 0, (uint16_t)written, 0, 0);
  *out_len = off;
  return CE_OK;
}

const char *ce_dns_type_name(uint16_t type, char buf[16]) {
  switch (type) {
  case CE_DNS_TYPE_A:
    return "A";
  case CE_DNS_TYPE_NS:
    return "NS";
  case CE_DNS_TYPE_CNAME:
    return "CNAME";
  case CE_DNS_TYPE_SOA:
    return "SOA";
  case CE_DNS_TYPE_PTR:
    return "PTR";
  case CE_DNS_TYPE_MX:
    return "MX";
  case CE_DNS_TYPE_TXT:
    return "TXT";
  case CE_DNS_TYPE_AAAA:
    return "AAAA";
  case CE_DNS_TYPE_SRV:
    return "SRV";
  case CE_DNS_TYPE_SVCB:
    return "SVCB";
  case CE_DNS_TYPE_HTTPS:
    return "HTTPS";
  case CE_DNS_TYPE_ANY:
    return "ANY";
  default:
    snprintf(buf, 16, "TYPE%u", (unsigned)type);
    return buf;
  }
}
