/*
 * TLS ClientHello parser (RFC 8446 §4.1.2, RFC 5246 §7.4.1.2).
 *
 * The proxy reads the first bytes of every intercepted port-443 connection
 * before any TLS library sees them: it needs the SNI to evaluate the policy
 * and mint a leaf, and the ALPN list to choose the upstream protocol. The
 * ClientHello may span several TCP reads and several TLS records (records
 * carry at most 16 KiB; post-quantum key shares make hellos larger than one
 * record), so the proxy buffers what it reads and calls the parser on the
 * whole buffer after each read.
 *
 * ce_clienthello_resume() keeps a small state between those calls: it walks
 * only the record headers it has not walked yet, so a hello arriving one
 * byte per read in 1-byte records costs linear time in total, not
 * quadratic. ce_clienthello_parse() is the same with a fresh state (one
 * call on a complete buffer, tests, the fuzzer). Either way, the message
 * is parsed once, when it is complete.
 */
#ifndef CE_PROXY_CLIENTHELLO_H
#define CE_PROXY_CLIENTHELLO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most bytes the proxy buffers for a ClientHello (records included).
 * Real hellos are under 2 KiB, ML-KEM hybrids about 1.8 KiB more; 64 KiB
 * leaves room for any legitimate client and bounds a hostile one. */
#define CE_CLIENTHELLO_MAX_BYTES (64u * 1024u)

/* RFC 6066 §3: a host_name is at most 255 bytes (DNS limit). */
#define CE_CLIENTHELLO_MAX_SNI 255u

/* ALPN: how many protocol names are kept in alpn[]. Names past these are
 * still validated and still set offers_h2 / offers_http11. */
#define CE_CLIENTHELLO_MAX_ALPN 16u

typedef struct {
  uint16_t legacy_version;  /* client_version field (0x0303 for TLS 1.2/1.3) */
  bool has_sni;             /* a server_name extension with a host_name entry */
  char sni[CE_CLIENTHELLO_MAX_SNI + 1]; /* NUL-terminated, bytes as sent */
  size_t sni_len;
  size_t alpn_count;        /* names kept in alpn[] */
  struct {
    uint8_t len;
    char name[256];         /* NUL-terminated */
  } alpn[CE_CLIENTHELLO_MAX_ALPN];
  bool offers_h2;           /* "h2" among the ALPN names */
  bool offers_http11;       /* "http/1.1" among the ALPN names */
  bool has_alpn;            /* the extension was present */
  size_t record_bytes;      /* bytes of the buffer taken by the hello's records */
} ce_clienthello_t;

/* What ce_clienthello_resume() remembers between calls: the whole records
 * walked so far and the handshake-header bytes they carried. No pointer
 * into the buffer is kept, so the caller may move (realloc) its buffer
 * between calls as long as the bytes stay the same. Plain data: copy or
 * discard it freely; nothing to free. */
typedef struct {
  size_t pos;     /* buffer offset just past the last whole record walked */
  size_t got;     /* handshake bytes in those records */
  size_t total;   /* handshake message length with its header; 0 until known */
  uint8_t hs[4];  /* the handshake header bytes seen so far */
  size_t hs_have;
} ce_clienthello_state_t;

/* Starts a state for a new connection. */
void ce_clienthello_init(ce_clienthello_state_t *st);

/*
 * Parses the ClientHello at the start of buf[0..len). buf may be NULL when
 * len is 0; out must not be NULL. docs/clienthello.md lists every rule with
 * the RFC section behind it.
 *
 * Returns:
 *   CE_OK       a complete ClientHello; *out is filled, and record_bytes
 *               says where the bytes after the hello start (they are not
 *               looked at).
 *   CE_EAGAIN   the bytes so far are a valid prefix; read more and call again.
 *   CE_ENOTSUP  the bytes are not a TLS handshake record (the first byte is
 *               not 22 or the second not 3, which includes an SSLv2-style
 *               hello and cleartext protocols): not TLS, the proxy resets.
 *   CE_EPARSE   malformed (bad lengths, a record over 2^14 bytes or empty,
 *               a record version above {03,03}, a non-handshake record in
 *               the middle, a handshake message other than client_hello,
 *               bytes after the hello in its last record, trailing bytes
 *               inside the handshake message, duplicate extensions,
 *               pre_shared_key not last, an SNI with a NUL byte or an empty
 *               or over-255-byte name, a second host_name, an empty ALPN
 *               list or name, ...).
 *   CE_ETOOBIG  the hello needs more than CE_CLIENTHELLO_MAX_BYTES; known as
 *               soon as the headers prove it, before that much is buffered.
 * On any return but CE_OK, *out is unspecified. buf is never written.
 *
 * A prefix of any input gives CE_EAGAIN or the same result as the whole
 * input. Each call costs O(records in buf) while the hello is incomplete
 * and one pass over it when complete; it never allocates, keeps no state
 * between calls and is safe to call from several threads at once (as is
 * ce_clienthello_resume() on distinct states).
 */
int ce_clienthello_parse(const uint8_t *buf, size_t len, ce_clienthello_t *out);

/*
 * ce_clienthello_parse() for a buffer that grows between calls: buf[0..len)
 * must start with the same bytes as on every earlier call with st, and len
 * may not shrink. Returns what ce_clienthello_parse() returns on the same
 * bytes, plus CE_EINVAL when len is shorter than what st has walked. The
 * state is updated on every return and may be used again (a final result
 * is given again). The work of all calls together is O(len) walking plus
 * one parse of the complete message per CE_OK.
 */
int ce_clienthello_resume(ce_clienthello_state_t *st, const uint8_t *buf, size_t len,
                          ce_clienthello_t *out);

#endif
