/*
 * TLS ClientHello parser (see clienthello.h and docs/clienthello.md).
 *
 * The work is split in two passes over the caller's buffer:
 *
 * 1. walk_records() steps over record headers only. It validates each
 *    record header, reads the 4-byte handshake header (which may itself be
 *    split over records) to learn the message length, and stops with
 *    CE_EAGAIN as soon as a byte is missing. It resumes where the previous
 *    call stopped (ce_clienthello_state_t remembers the whole records
 *    walked and the handshake-header bytes they held), so while the hello
 *    is incomplete a call costs O(new records), nothing copied.
 *
 * 2. Once every record of the message is buffered, parse_hello() reads the
 *    message exactly once through a cursor (hs_cursor_t) that steps over the
 *    record headers between fragments. Nothing is reassembled: the
 *    alternative, copying the fragments into one contiguous buffer, would
 *    need up to CE_CLIENTHELLO_MAX_BYTES of stack (too much for small thread
 *    stacks), a static (not reentrant) or an allocation (a new failure mode
 *    for a parser that otherwise cannot run out of memory).
 *
 * Both passes are bounds-checked independently of each other: the cursor
 * never reads past the byte count the walk established, and every vector
 * inside the message is read through a sub-cursor limited to its declared
 * length, so a length that points past its enclosing vector fails with
 * CE_EPARSE instead of reading the next structure.
 *
 * The check order in walk_records() is the same whether a record is whole
 * or cut short, so a prefix of any input yields either CE_EAGAIN or the
 * same result as the whole input. The fuzz target asserts this.
 */
#include "proxy/clienthello.h"

#include <string.h>

#include "common/error.h"

/* RFC 8446 §5.1 / RFC 5246 §6.2.1: type(1), legacy_record_version(2),
 * length(2). */
#define RECORD_HEADER_LEN 5u
/* RFC 8446 §5.1: "The length MUST NOT exceed 2^14 bytes." */
#define RECORD_MAX_PAYLOAD 16384u
/* RFC 8446 §5.1 ContentType.handshake. */
#define CONTENT_HANDSHAKE 22u
/* Every SSL 3.0 and TLS version number has major byte 3 (RFC 5246
 * Appendix E.1: "{03,XX}"). */
#define VERSION_MAJOR 3u
/* The highest record-layer minor version: TLS 1.3 still writes 0x0303
 * there (RFC 8446 §5.1), so nothing newer can appear. */
#define RECORD_MINOR_MAX 3u
/* RFC 8446 §4: msg_type(1), length(3). */
#define HANDSHAKE_HEADER_LEN 4u
/* RFC 8446 §4 HandshakeType.client_hello. */
#define HANDSHAKE_CLIENT_HELLO 1u
/* RFC 8446 §4.1.2: opaque Random[32]. */
#define RANDOM_LEN 32u
/* RFC 8446 §4.1.2: opaque legacy_session_id<0..32>. */
#define SESSION_ID_MAX 32u
/* RFC 5246 §7.4.1.2: CompressionMethod.null, which the list must contain. */
#define COMPRESSION_NULL 0u

/* Extension types (IANA TLS ExtensionType registry). */
#define EXT_SERVER_NAME 0u                          /* RFC 6066 §3 */
#define EXT_ALPN 16u                                /* RFC 7301 §3.1 */
#define EXT_PRE_SHARED_KEY 41u                      /* RFC 8446 §4.2.11 */
/* RFC 6066 §3 NameType.host_name. */
#define SNI_HOST_NAME 0u

/* One bit per possible extension type, for the duplicate check of RFC 8446
 * §4.2. 8 KiB of stack, and only on the one call that parses a complete
 * message; a list of seen types would be quadratic in the up to 16383
 * extensions a 64 KiB block can carry. */
#define EXT_TYPE_COUNT 65536u

static size_t get16(const uint8_t *p) { return (size_t)p[0] << 8 | p[1]; }

static size_t get24(const uint8_t *p) {
  return (size_t)p[0] << 16 | (size_t)p[1] << 8 | p[2];
}

/* The fewest buffer bytes that `payload` more handshake bytes can arrive
 * in: full records plus one header each. */
static size_t min_framed(size_t payload) {
  size_t records = (payload + RECORD_MAX_PAYLOAD - 1) / RECORD_MAX_PAYLOAD;
  return payload + records * RECORD_HEADER_LEN;
}

/*
 * Checks the `avail` (1 to 5) bytes present of the record header at `rec`,
 * in header order, so that a partial header fails exactly when the whole one
 * would. `first` is true for the first record of the connection.
 */
static int check_record_header(const uint8_t *rec, size_t avail, int first) {
  /* Anything but a handshake record first is not TLS as far as we can
   * tell; this includes the SSL 2.0-compatible hello (RFC 5246 Appendix
   * E.2), whose first byte has the high bit set, and cleartext protocols.
   * Later on, RFC 8446 §5.1 forbids interleaving: "if a handshake message
   * is split over two or more records, there MUST NOT be any other records
   * between them". */
  if (rec[0] != CONTENT_HANDSHAKE)
    return first ? CE_ENOTSUP : CE_EPARSE;
  if (avail < 2)
    return 0;
  /* The version is how we tell 0x16 followed by anything from TLS. RFC 8446
   * §5.1 says the field "MUST be ignored for all purposes" beyond that, so
   * any {03,00}..{03,03} passes, on every record: RFC 5246 Appendix E.1 lets
   * a client probing old servers write {03,00} there, and RFC 8446 §5.1
   * lets the initial hello use {03,01}. Newer values never occur. */
  if (rec[1] != VERSION_MAJOR)
    return first ? CE_ENOTSUP : CE_EPARSE;
  if (avail < 3)
    return 0;
  if (rec[2] > RECORD_MINOR_MAX)
    return CE_EPARSE;
  if (avail < RECORD_HEADER_LEN)
    return 0;
  size_t len = get16(rec + 3);
  /* RFC 8446 §5.1: "Implementations MUST NOT send zero-length fragments of
   * Handshake types" (likewise RFC 5246 §6.2.1), and a record over 2^14
   * bytes is a record_overflow. */
  if (len == 0 || len > RECORD_MAX_PAYLOAD)
    return CE_EPARSE;
  return 0;
}

/*
 * Walks the record headers of buf[0..len), resuming where st left off.
 * Only whole records are committed to *st, so a record cut short is looked
 * at again on the next call: O(1) work for its header and the at most four
 * handshake-header bytes it may carry. Each call therefore costs O(records
 * completed since the last call + 1), and a hello fed in any number of
 * calls costs O(its records) in total.
 *
 * On CE_OK, *records_end is the offset just past the last record of the
 * hello and *msg_len the handshake message length, header included.
 */
static int walk_records(ce_clienthello_state_t *st, const uint8_t *buf, size_t len,
                        size_t *records_end, size_t *msg_len) {
  for (;;) {
    if (st->total != 0 && st->got == st->total) {
      *records_end = st->pos;
      *msg_len = st->total;
      return CE_OK;
    }
    size_t pos = st->pos;
    size_t avail = len - pos;
    if (avail == 0)
      return CE_EAGAIN;
    if (avail > RECORD_HEADER_LEN)
      avail = RECORD_HEADER_LEN;
    int rc = check_record_header(buf + pos, avail, pos == 0);
    if (rc != 0)
      return rc;
    if (avail < RECORD_HEADER_LEN)
      return CE_EAGAIN;

    size_t rec_len = get16(buf + pos + 3);
    size_t rec_end = pos + RECORD_HEADER_LEN + rec_len;
    size_t present = len - pos - RECORD_HEADER_LEN;
    if (present > rec_len)
      present = rec_len;

    /* The handshake header can be spread over several records (RFC 8446
     * §5.1 allows any fragmentation), down to one byte per record. Bytes
     * collected before this record are always whole records; this one's
     * are kept in a copy until the record is whole. */
    uint8_t hs[HANDSHAKE_HEADER_LEN];
    size_t hs_have = st->hs_have;
    size_t total = st->total;
    memcpy(hs, st->hs, sizeof(hs));
    const uint8_t *frag = buf + pos + RECORD_HEADER_LEN;
    for (size_t i = 0; i < present && hs_have < HANDSHAKE_HEADER_LEN; i++)
      hs[hs_have++] = frag[i];
    if (hs_have >= 1 && hs[0] != HANDSHAKE_CLIENT_HELLO)
      return CE_EPARSE; /* RFC 8446 §4: a client speaks first, with client_hello. */
    if (total == 0 && hs_have == HANDSHAKE_HEADER_LEN)
      total = HANDSHAKE_HEADER_LEN + get24(hs + 1);

    if (total != 0) {
      /* The record that completes the hello must end with it. RFC 8446
       * §5.1: "Because the ClientHello ... can immediately precede a key
       * change, implementations MUST send these messages in alignment with
       * a record boundary", and no other handshake message follows it
       * before the server has answered. */
      if (rec_len > total - st->got)
        return CE_EPARSE;
      /* The hello needs this whole record and the bytes still due in the
       * fewest records that can carry them. This is known from headers
       * alone, so an oversized or over-fragmented hello is refused as soon
       * as that is certain, not after 64 KiB have been buffered. (Before
       * the handshake header is complete, no record can end past the limit:
       * at most three 1-byte records precede one of at most 2^14 bytes.) */
      size_t rest = total - st->got - rec_len;
      if (rec_end + min_framed(rest) > CE_CLIENTHELLO_MAX_BYTES)
        return CE_ETOOBIG;
    }
    if (present < rec_len)
      return CE_EAGAIN;

    /* The record is whole and valid: commit it. */
    memcpy(st->hs, hs, sizeof(hs));
    st->hs_have = hs_have;
    st->total = total;
    st->got += rec_len;
    st->pos = rec_end;
  }
}

/*
 * A read position in the handshake message, which lies in the record
 * payloads of buf. `left` bounds the vector being read; crossing into the
 * next record skips its header, which walk_records() has already checked.
 * Copies of a cursor read independently (see cur_sub).
 */
typedef struct {
  const uint8_t *buf;
  size_t pos;    /* offset in buf of the next byte (or next record header) */
  size_t in_rec; /* bytes of the current record left at pos */
  size_t left;   /* bytes left in the vector this cursor reads */
} hs_cursor_t;

/* Moves to the next record when the current one is used up. Called only
 * with c->left > 0, and the walk proved the message's bytes exist. */
static void cur_next_record(hs_cursor_t *c) {
  if (c->in_rec == 0) {
    c->in_rec = get16(c->buf + c->pos + 3);
    c->pos += RECORD_HEADER_LEN;
  }
}

/* Copies (dst != NULL) or skips n bytes, n <= c->left. */
static void cur_move(hs_cursor_t *c, uint8_t *dst, size_t n) {
  c->left -= n;
  while (n > 0) {
    cur_next_record(c);
    size_t chunk = n < c->in_rec ? n : c->in_rec;
    if (dst != NULL) {
      memcpy(dst, c->buf + c->pos, chunk);
      dst += chunk;
    }
    c->pos += chunk;
    c->in_rec -= chunk;
    n -= chunk;
  }
}

/* Copies (dst != NULL) or skips n bytes, if the vector has that many. */
static int cur_read(hs_cursor_t *c, uint8_t *dst, size_t n) {
  if (n > c->left)
    return CE_EPARSE;
  cur_move(c, dst, n);
  return 0;
}

/* Copies the rest of the vector into dst, which holds c->left bytes. */
static void cur_take_rest(hs_cursor_t *c, uint8_t *dst) { cur_move(c, dst, c->left); }

/* Reads a big-endian integer of `width` (1 to 3) bytes. */
static int cur_uint(hs_cursor_t *c, size_t width, size_t *v) {
  uint8_t b[3];
  int rc = cur_read(c, b, width);
  if (rc != 0)
    return rc;
  size_t x = 0;
  for (size_t i = 0; i < width; i++)
    x = x << 8 | b[i];
  *v = x;
  return 0;
}

/* Makes *sub a cursor over the next n bytes and moves c past them. */
static int cur_sub(hs_cursor_t *c, size_t n, hs_cursor_t *sub) {
  if (n > c->left)
    return CE_EPARSE;
  *sub = *c;
  sub->left = n;
  cur_move(c, NULL, n);
  return 0;
}

/* Reads a vector with a `width`-byte length prefix into *sub. The TLS
 * presentation language (RFC 8446 §3.4) bounds every vector by its prefix,
 * so the caller checks that *sub is consumed exactly. */
static int cur_vector(hs_cursor_t *c, size_t width, hs_cursor_t *sub) {
  size_t n;
  int rc = cur_uint(c, width, &n);
  if (rc != 0)
    return rc;
  return cur_sub(c, n, sub);
}

/*
 * server_name extension_data from a client (RFC 6066 §3):
 *   struct { NameType name_type; select (name_type) { case host_name:
 *            HostName; } name; } ServerName;
 *   opaque HostName<1..2^16-1>;
 *   struct { ServerName server_name_list<1..2^16-1> } ServerNameList;
 */
static int parse_server_name(hs_cursor_t *ext, ce_clienthello_t *out) {
  hs_cursor_t list;
  int rc = cur_vector(ext, 2, &list);
  if (rc != 0)
    return rc;
  if (ext->left != 0 || list.left == 0)
    return CE_EPARSE;

  while (list.left > 0) {
    uint8_t type;
    hs_cursor_t name;
    cur_move(&list, &type, 1); /* list.left > 0 */
    /* RFC 6066 §3: "all future data structures associated with new
     * NameTypes MUST begin with a 16-bit length field", so every entry,
     * known type or not, can be read as a 16-bit-prefixed vector and
     * unknown ones skipped. */
    rc = cur_vector(&list, 2, &name);
    if (rc != 0)
      return rc;
    if (type != SNI_HOST_NAME)
      continue;
    /* RFC 6066 §3: "The ServerNameList MUST NOT contain more than one name
     * of the same name_type." Two host_names would let the policy check
     * one name while the upstream is reached by the other. */
    if (out->has_sni)
      return CE_EPARSE;
    /* HostName<1..2^16-1> is never empty. A DNS name fits in 255 bytes
     * (RFC 1035 §2.3.4), which is also the size of out->sni. */
    if (name.left == 0 || name.left > CE_CLIENTHELLO_MAX_SNI)
      return CE_EPARSE;
    out->sni_len = name.left;
    cur_take_rest(&name, (uint8_t *)out->sni);
    out->sni[out->sni_len] = '\0';
    /* A NUL would cut the name short for any C string consumer; it cannot
     * occur in a DNS name. Other bytes are kept as sent (IP literals and a
     * trailing dot included): the policy layer normalises and judges the
     * name (docs/host-matching.md §1). */
    if (memchr(out->sni, '\0', out->sni_len) != NULL)
      return CE_EPARSE;
    out->has_sni = true;
  }
  return 0;
}

/*
 * application_layer_protocol_negotiation extension_data (RFC 7301 §3.1):
 *   opaque ProtocolName<1..2^8-1>;
 *   struct { ProtocolName protocol_name_list<2..2^16-1> } ProtocolNameList;
 * "Empty strings MUST NOT be included".
 */
static int parse_alpn(hs_cursor_t *ext, ce_clienthello_t *out) {
  hs_cursor_t list;
  int rc = cur_vector(ext, 2, &list);
  if (rc != 0)
    return rc;
  /* The smallest list holds one name of one byte: two bytes. */
  if (ext->left != 0 || list.left < 2)
    return CE_EPARSE;

  while (list.left > 0) {
    hs_cursor_t name;
    uint8_t bytes[UINT8_MAX];
    rc = cur_vector(&list, 1, &name);
    if (rc != 0)
      return rc;
    size_t n = name.left;
    if (n == 0)
      return CE_EPARSE;
    cur_take_rest(&name, bytes);
    /* Names past the kept ones still count for the offers_* flags, so a
     * client listing many protocols is not mistaken for one without h2. */
    if (n == 2 && memcmp(bytes, "h2", 2) == 0)
      out->offers_h2 = true;
    if (n == 8 && memcmp(bytes, "http/1.1", 8) == 0)
      out->offers_http11 = true;
    if (out->alpn_count < CE_CLIENTHELLO_MAX_ALPN) {
      memcpy(out->alpn[out->alpn_count].name, bytes, n);
      out->alpn[out->alpn_count].name[n] = '\0';
      out->alpn[out->alpn_count].len = (uint8_t)n;
      out->alpn_count++;
    }
  }
  out->has_alpn = true;
  return 0;
}

/*
 * The extensions block: Extension extensions<8..2^16-1> in TLS 1.3 (RFC
 * 8446 §4.1.2), <0..2^16-1> in TLS 1.2 (RFC 5246 §7.4.1.2). The TLS 1.3
 * minimum is not enforced: the version is negotiated later, by the TLS
 * library, which also refuses a TLS 1.3 hello lacking its extensions.
 */
static int parse_extensions(hs_cursor_t *c, ce_clienthello_t *out) {
  hs_cursor_t block;
  int rc = cur_vector(c, 2, &block);
  if (rc != 0)
    return rc;
  /* The block must end exactly where the message ends. */
  if (c->left != 0)
    return CE_EPARSE;

  uint8_t seen[EXT_TYPE_COUNT / 8];
  memset(seen, 0, sizeof(seen));
  int after_psk = 0;
  while (block.left > 0) {
    size_t type;
    hs_cursor_t data;
    rc = cur_uint(&block, 2, &type);
    if (rc == 0)
      rc = cur_vector(&block, 2, &data);
    if (rc != 0)
      return rc;
    /* RFC 8446 §4.2: "There MUST NOT be more than one extension of the same
     * type in a given extension block." Duplicates are also the classic way
     * to make two parsers see different server names. */
    if (seen[type / 8] & (1u << (type % 8)))
      return CE_EPARSE;
    seen[type / 8] = (uint8_t)(seen[type / 8] | (1u << (type % 8)));
    /* RFC 8446 §4.2.11: pre_shared_key "MUST be the last extension in the
     * ClientHello". */
    if (after_psk)
      return CE_EPARSE;
    if (type == EXT_PRE_SHARED_KEY)
      after_psk = 1;

    if (type == EXT_SERVER_NAME)
      rc = parse_server_name(&data, out);
    else if (type == EXT_ALPN)
      rc = parse_alpn(&data, out);
    /* Other extensions, GREASE values (RFC 8701) included, are the TLS
     * library's business; their lengths were checked by cur_vector. */
    if (rc != 0)
      return rc;
  }
  return 0;
}

/*
 * The ClientHello body (RFC 8446 §4.1.2, RFC 5246 §7.4.1.2):
 *   ProtocolVersion legacy_version; Random random;
 *   opaque legacy_session_id<0..32>;
 *   CipherSuite cipher_suites<2..2^16-2>;
 *   opaque legacy_compression_methods<1..2^8-1>;
 *   Extension extensions<...>;   (absent in a TLS 1.2 hello without any)
 */
static int parse_hello(const uint8_t *buf, size_t msg_len, ce_clienthello_t *out) {
  hs_cursor_t c = {.buf = buf, .pos = 0, .in_rec = 0, .left = msg_len};
  hs_cursor_t v;
  size_t version;
  int rc;

  /* walk_records() checked the handshake header already, and msg_len
   * includes it. */
  cur_move(&c, NULL, HANDSHAKE_HEADER_LEN);
  rc = cur_uint(&c, 2, &version);
  if (rc != 0)
    return rc;
  /* Only the {03,XX} family is TLS (RFC 5246 Appendix E.1). The minor
   * version is left to the TLS library, which answers a version it does
   * not support with a protocol_version alert (RFC 8446 §4.2.1, RFC 5246
   * Appendix E.1): the client learns why, where a reset would not say. */
  if (version >> 8 != VERSION_MAJOR)
    return CE_EPARSE;
  out->legacy_version = (uint16_t)version;

  rc = cur_read(&c, NULL, RANDOM_LEN);
  if (rc == 0)
    rc = cur_vector(&c, 1, &v);
  if (rc != 0)
    return rc;
  if (v.left > SESSION_ID_MAX)
    return CE_EPARSE;

  rc = cur_vector(&c, 2, &v);
  if (rc != 0)
    return rc;
  /* CipherSuite is two bytes: the list is even and at least one long. */
  if (v.left == 0 || v.left % 2 != 0)
    return CE_EPARSE;

  rc = cur_vector(&c, 1, &v);
  if (rc != 0)
    return rc;
  if (v.left == 0)
    return CE_EPARSE;
  /* RFC 5246 §7.4.1.2: the list "MUST contain ... CompressionMethod.null";
   * RFC 8446 §4.1.2 requires exactly that one byte from TLS 1.3 clients,
   * which the TLS library checks once the version is known. */
  uint8_t methods[UINT8_MAX];
  size_t nmethods = v.left;
  cur_take_rest(&v, methods);
  if (memchr(methods, COMPRESSION_NULL, nmethods) == NULL)
    return CE_EPARSE;

  /* RFC 5246 §7.4.1.2: a hello may end here; "the presence of extensions
   * can be detected by determining whether there are bytes following the
   * compression_methods at the end of the ClientHello". */
  if (c.left == 0)
    return 0;
  return parse_extensions(&c, out);
}

void ce_clienthello_init(ce_clienthello_state_t *st) { memset(st, 0, sizeof(*st)); }

int ce_clienthello_resume(ce_clienthello_state_t *st, const uint8_t *buf, size_t len,
                          ce_clienthello_t *out) {
  if (len < st->pos)
    return CE_EINVAL; /* not the buffer the state has walked */
  size_t records_end, msg_len;
  int rc = walk_records(st, buf, len, &records_end, &msg_len);
  if (rc != 0)
    return rc;
  memset(out, 0, sizeof(*out));
  rc = parse_hello(buf, msg_len, out);
  if (rc != 0)
    return rc;
  out->record_bytes = records_end;
  return CE_OK;
}

int ce_clienthello_parse(const uint8_t *buf, size_t len, ce_clienthello_t *out) {
  ce_clienthello_state_t st;
  ce_clienthello_init(&st);
  return ce_clienthello_resume(&st, buf, len, out);
}
