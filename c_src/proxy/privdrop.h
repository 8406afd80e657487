/*
 * The proxy's privilege drop (`proxy --user UID`, docs/netfilter.md, "The
 * exemption"). In a Kubernetes pod a non-root container gets no ambient
 * capabilities, so the sidecar starts as root with CAP_NET_ADMIN (for
 * SO_MARK and the conntrack flush), CAP_SETUID and CAP_SETGID, and becomes
 * UID here, keeping CAP_NET_ADMIN alone. netfilter-setup exempts the mark
 * only on sockets of that uid, which a workspace without CAP_SETUID cannot
 * take.
 */
#ifndef CE_PROXY_PRIVDROP_H
#define CE_PROXY_PRIVDROP_H

#include <stddef.h>
#include <stdint.h>

#define CE_PRIVDROP_ERR_MAX 256

/* Makes the process uid and gid `uid` (real, effective, saved; no
 * supplementary groups), with CAP_NET_ADMIN as its only capability when
 * it had it, none otherwise, nothing inheritable or ambient, the bounding
 * set cut to CAP_NET_ADMIN when CAP_SETPCAP allows it, and no_new_privs
 * set. A process that already runs as `uid` only gets no_new_privs and
 * the ambient set cleared. Checks the result (getresuid, and that uid 0
 * cannot be taken back). Returns CE_OK, or CE_EPERM with err saying why
 * (a process that is neither root nor `uid`, or a missing capability). */
int ce_privdrop(uint32_t uid, char *err, size_t cap);

#endif
