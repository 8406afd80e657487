/*
 * Deleting the conntrack entries of the proxy's earlier upstream
 * connections, by connection mark, through ctnetlink (docs/netfilter.md,
 * "Stale conntrack entries").
 *
 * netfilter-setup's nat rule copies the proxy's packet mark into the
 * connection mark of every connection the proxy opens. When the proxy
 * stops or crashes, conntrack may keep such entries (un-NATed, often
 * ESTABLISHED, for days); a workspace connection whose source port
 * collides with one would match it, skip the REDIRECT and be refused. The
 * proxy therefore deletes every entry carrying its mark when it starts,
 * and only those: the namespace may be shared with other programs.
 *
 * One request does it: IPCTNL_MSG_CT_DELETE without a tuple is a flush,
 * and CTA_MARK with CTA_MARK_MASK restricts it to the entries whose
 * connection mark matches. Both attributes are always sent: older kernels
 * (4.x) only filter a flush when both are present, and would otherwise
 * empty the whole table; current ones (Debian 12's 6.1, the 6.18 this was
 * tested on) filter on CTA_MARK alone too, and a kernel built without
 * connection marks answers EOPNOTSUPP. The family AF_UNSPEC with version
 * 0 covers IPv4 and IPv6 together.
 *
 * The message building and the answer parsing are pure and bounded; only
 * ce_ctflush_mark() does I/O.
 */
#ifndef CE_NETFILTER_CTFLUSH_H
#define CE_NETFILTER_CTFLUSH_H

#include <stddef.h>
#include <stdint.h>

/* The request: a netlink header, the nfnetlink header and two 8-byte
 * attributes. */
#define CE_CTFLUSH_REQUEST_LEN 36u
/* The receive buffer: an acknowledgement of our request is 36 bytes (the
 * error code and our header); a page leaves room for whatever else might
 * share the datagram. Larger datagrams are truncated and refused. */
#define CE_CTFLUSH_ANSWER_MAX 4096u
/* How long ce_ctflush_mark waits for the kernel's answer. The kernel walks
 * the table before it answers, so the answer is normally there when
 * sendto returns. */
#define CE_CTFLUSH_TIMEOUT_MS 2000u
/* Room for ce_ctflush_mark's error text. */
#define CE_CTFLUSH_ERR_MAX 256u

/* Writes the flush request for connection mark `mark` (under the full
 * 32-bit mask), with sequence number seq, into buf[0..cap) and sets *len
 * to CE_CTFLUSH_REQUEST_LEN. Returns 0, CE_EINVAL for mark 0 (every
 * unmarked connection: never flushed), or CE_ETOOBIG when cap is smaller
 * than CE_CTFLUSH_REQUEST_LEN (buf untouched). */
int ce_ctflush_request(uint32_t mark, uint32_t seq, uint8_t *buf, size_t cap,
                       size_t *len);

/* Looks through one datagram received from the kernel (buf[0..n)) for the
 * acknowledgement of request seq.
 * Returns:
 *   0           the acknowledgement is there; *kernel_errno is 0 when the
 *               flush succeeded, else the positive errno the kernel
 *               answered (EPERM, EOPNOTSUPP, ...);
 *   CE_EAGAIN   well-formed, but no acknowledgement of seq in it (another
 *               message): keep reading;
 *   CE_EPARSE   malformed: a header shorter than itself, a length past
 *               the end of the datagram, a truncated error message.
 * *kernel_errno is only written when 0 is returned. */
int ce_ctflush_parse_answer(const uint8_t *buf, size_t n, uint32_t seq,
                            int *kernel_errno);

/* Deletes every conntrack entry of the current network namespace whose
 * connection mark is `mark`, and no other. Returns 0, or a CE_E* code with
 * err (cap bytes, NUL-terminated, at most CE_CTFLUSH_ERR_MAX is useful)
 * saying why: CE_EPERM (the kernel refused: no CAP_NET_ADMIN in the
 * namespace), CE_ENOTSUP (no ctnetlink, or no flush by mark), CE_ETIMEDOUT,
 * CE_EPARSE, CE_EIO. Never blocks longer than about
 * CE_CTFLUSH_TIMEOUT_MS. */
int ce_ctflush_mark(uint32_t mark, char *err, size_t cap);

#endif
