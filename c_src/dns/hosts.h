/*
 * A static name table in hosts(5) syntax, read once at start from a file
 * the workspace cannot write (`proxy --hosts FILE`, docs/dns.md): the
 * proxy's own resolver answers these names from it and never reads
 * /etc/hosts, which the workspace shares and may rewrite.
 *
 * Syntax: one address followed by one or more names per line; '#' starts
 * a comment; blank lines are skipped. Addresses are IPv4 dotted quads or
 * IPv6 text (no zone index); names are matched case-insensitively, with a
 * final '.' ignored. A line that does not parse makes the whole file
 * refused (fail closed: a typo must not silently send a name to DNS).
 *
 * Ownership: ce_hosts_load_*() allocate a table that ce_hosts_free()
 * frees; a loaded table is immutable.
 */
#ifndef CE_DNS_HOSTS_H
#define CE_DNS_HOSTS_H

#include <stddef.h>
#include <stdint.h>

/* Bounds: the file, the entries (address, name pairs), the addresses one
 * name may have (also the most a lookup returns, see stub.h). */
#define CE_HOSTS_MAX_BYTES (1024u * 1024u)
#define CE_HOSTS_MAX_ENTRIES 8192u
#define CE_HOSTS_MAX_ADDRS 16u
#define CE_HOSTS_ERROR_MAX 256u

typedef struct ce_hosts ce_hosts_t;

typedef struct {
  uint8_t family; /* 4 or 6 */
  uint8_t addr[16];
} ce_hosts_addr_t;

/* Parses buf[0..len). Returns CE_OK with *out set, CE_ETOOBIG (the file or
 * the entries past their bound), CE_EPARSE (err says which line and why),
 * CE_ENOMEM. err (may be NULL) gets one line on failure. On failure *out
 * is untouched. */
int ce_hosts_load_buffer(const char *buf, size_t len, ce_hosts_t **out, char *err, size_t err_cap);

/* Reads path and parses it as above; also CE_ENOENT, CE_EIO. */
int ce_hosts_load_file(const char *path, ce_hosts_t **out, char *err, size_t err_cap);

void ce_hosts_free(ce_hosts_t *h);

/* The addresses of name[0..len) in file order (at most cap). Returns how
 * many were written; 0 when the name is not in the table. */
size_t ce_hosts_lookup(const ce_hosts_t *h, const char *name, size_t len, ce_hosts_addr_t *out, size_t cap);

#endif
