#include "dns/hosts.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "dns/wire.h"

typedef struct {
  char *name; /* lowered, into the arena */
  size_t len;
  ce_hosts_addr_t addr;
} entry_t;

struct ce_hosts {
  entry_t *entries;
  size_t count;
  char *arena;
};

static bool is_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\r';
}

static int fail(char *err, size_t cap, int code, size_t line, const char *what) {
  if (err != NULL && cap > 0)
    snprintf(err, cap, "line %zu: %s", line, what);
  return code;
}

int ce_hosts_load_buffer(const char *buf, size_t len, ce_hosts_t **out, char *err, size_t err_cap) {
  if (err != NULL && err_cap > 0)
    err[0] = '\0';
  if (len > CE_HOSTS_MAX_BYTES)
    return fail(err, err_cap, CE_ETOOBIG, 0, "the file is larger than 1 MiB");
  ce_hosts_t *h = calloc(1, sizeof(*h));
  if (h == NULL)
    return CE_ENOMEM;
  /* Every name is a copy of file bytes plus its NUL: len + 1 covers all. */
  h->arena = malloc(len + 1);
  h->entries = calloc(CE_HOSTS_MAX_ENTRIES, sizeof(*h->entries));
  if (h->arena == NULL || h->entries == NULL) {
    ce_hosts_free(h);
    return CE_ENOMEM;
  }
  size_t arena = 0, pos = 0, line = 0;
  int rc = CE_OK;
  while (pos < len && rc == CE_OK) {
    line++;
    size_t end = pos;
    while (end < len && buf[end] != '\n')
      end++;
    size_t stop = pos;
    while (stop < end && buf[stop] != '#')
      stop++;
    size_t i = pos;
    bool have_addr = false;
    ce_hosts_addr_t addr;
    memset(&addr, 0, sizeof(addr));
    size_t names = 0;
    while (i < stop) {
      while (i < stop && is_space(buf[i]))
        i++;
      size_t w = i;
      while (i < stop && !is_space(buf[i]))
        i++;
      size_t wl = i - w;
      if (wl == 0)
        break;
      if (!have_addr) {
        char text[64];
        if (wl >= sizeof(text) || memchr(buf + w, '\0', wl) != NULL) {
          rc = fail(err, err_cap, CE_EPARSE, line, "not an IP address");
          break;
        }
        memcpy(text, buf + w, wl);
        text[wl] = '\0';
        if (inet_pton(AF_INET, text, addr.addr) == 1) {
          addr.family = 4;
        } else if (inet_pton(AF_INET6, text, addr.addr) == 1) {
          addr.family = 6;
        } else {
          rc = fail(err, err_cap, CE_EPARSE, line, "not an IP address");
          break;
        }
        have_addr = true;
        continue;
      }
      /* A name must be one the wire can carry. */
      uint8_t scratch[CE_DNS_NAME_WIRE_MAX + 2];
      size_t off = 0;
      if (ce_dns_name_write(scratch, sizeof(scratch), &off, buf + w, wl) != CE_OK || off <= 1) {
        rc = fail(err, err_cap, CE_EPARSE, line, "not a host name");
        break;
      }
      if (h->count >= CE_HOSTS_MAX_ENTRIES) {
        rc = fail(err, err_cap, CE_ETOOBIG, line, "more than 8192 name entries");
        break;
      }
      if (buf[w + wl - 1] == '.')
        wl--;
      entry_t *e = &h->entries[h->count++];
      e->name = h->arena + arena;
      for (size_t k = 0; k < wl; k++) {
        char ch = buf[w + k];
        e->name[k] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
      }
      e->name[wl] = '\0';
      e->len = wl;
      e->addr = addr;
      arena += wl + 1;
      names++;
    }
    if (rc == CE_OK && have_addr && names == 0)
      rc = fail(err, err_cap, CE_EPARSE, line, "an address without a name");
    pos = end + 1;
  }
  if (rc != CE_OK) {
    ce_hosts_free(h);
    return rc;
  }
  *out = h;
  return CE_OK;
}

int ce_hosts_load_file(const char *path, ce_hosts_t **out, char *err, size_t err_cap) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    int e = errno;
    if (err != NULL && err_cap > 0)
      snprintf(err, err_cap, "cannot open: %s", strerror(e));
    return e == ENOENT ? CE_ENOENT : CE_EIO;
  }
  char *buf = malloc(CE_HOSTS_MAX_BYTES + 1);
  if (buf == NULL) {
    fclose(f);
    return CE_ENOMEM;
  }
  size_t n = fread(buf, 1, CE_HOSTS_MAX_BYTES + 1, f);
  bool bad = ferror(f) != 0;
  fclose(f);
  int rc;
  if (bad) {
    if (err != NULL && err_cap > 0)
      snprintf(err, err_cap, "cannot read");
    rc = CE_EIO;
  } else {
    rc = ce_hosts_load_buffer(buf, n, out, err, err_cap);
  }
  free(buf);
  return rc;
}

void ce_hosts_free(ce_hosts_t *h) {
  if (h == NULL)
    return;
  free(h->entries);
  free(h->arena);
  free(h);
}

size_t ce_hosts_lookup(const ce_hosts_t *h, const char *name, size_t len, ce_hosts_addr_t *out, size_t cap) {
  if (h == NULL)
    return 0;
  if (len > 0 && name[len - 1] == '.')
    len--;
  size_t n = 0;
  for (size_t i = 0; i < h->count && n < cap; i++) {
    const entry_t *e = &h->entries[i];
    if (e->len != len)
      continue;
    bool same = true;
    for (size_t k = 0; k < len && same; k++) {
      char ch = name[k];
      same = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch) == e->name[k];
    }
    if (!same)
      continue;
    /* The same address twice (a name listed on two lines) once. */
    bool dup = false;
    for (size_t k = 0; k < n && !dup; k++)
      dup = out[k].family == e->addr.family && memcmp(out[k].addr, e->addr.addr, 16) == 0;
    if (!dup)
      out[n++] = e->addr;
  }
  return n;
}
