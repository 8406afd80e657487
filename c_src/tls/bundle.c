/* The workspace's trust files (see bundle.h). */
#include "tls/bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/bio.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "tls/files.h"

/* Writes len bytes to a new file "<dir>/.<name>.tmp" and renames it to
 * "<dir>/<name>". parts/lens: up to three pieces written in order. */
static int write_file(const char *dir, const char *name, const char *const *parts, const size_t *lens,
                      size_t count, char *err, size_t errlen) {
  char final[PATH_MAX], tmp[PATH_MAX];
  int n1 = snprintf(final, sizeof(final), "%s/%s", dir, name);
  int n2 = snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
  if (n1 < 0 || n2 < 0 || (size_t)n1 >= sizeof(final) || (size_t)n2 >= sizeof(tmp))
    return ce__tls_fail(err, errlen, CE_ETOOBIG, dir, "directory name too long");

  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    int e = errno;
    int code = e == ENOENT || e == ENOTDIR ? CE_ENOENT : e == EACCES || e == EPERM || e == EROFS ? CE_EPERM : CE_EIO;
    return ce__tls_fail(err, errlen, code, tmp, "cannot create: %s", strerror(e));
  }
  for (size_t i = 0; i < count; i++) {
    size_t off = 0;
    while (off < lens[i]) {
      ssize_t w = write(fd, parts[i] + off, lens[i] - off);
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0) {
        int e = w < 0 ? errno : EIO;
        close(fd);
        unlink(tmp);
        return ce__tls_fail(err, errlen, CE_EIO, tmp, "cannot write: %s", strerror(e));
      }
      off += (size_t)w;
    }
  }
  /* umask may have narrowed the mode: the workspace, any uid, reads it. */
  if (fchmod(fd, 0644) != 0 || close(fd) != 0) {
    int e = errno;
    unlink(tmp);
    return ce__tls_fail(err, errlen, CE_EIO, tmp, "cannot write: %s", strerror(e));
  }
  if (rename(tmp, final) != 0) {
    int e = errno;
    unlink(tmp);
    return ce__tls_fail(err, errlen, CE_EIO, final, "cannot rename into place: %s", strerror(e));
  }
  return CE_OK;
}

const char *ce_trust_default_roots(char *buf, size_t cap) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0)
    return NULL;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (slash == NULL)
    return NULL;
  *slash = '\0';
  int n2 = snprintf(buf, cap, "%s/ca-certificates/mozilla.pem", exe);
  return n2 > 0 && (size_t)n2 < cap ? buf : NULL;
}

static bool contains(const char *data, size_t len, const char *text) {
  return memmem(data, len, text, strlen(text)) != NULL;
}

int ce_trust_bundle_write(const char *ca_cert, const char *roots, const char *dir, char *err,
                          size_t errlen) {
  if (dir == NULL || dir[0] == '\0')
    return ce__tls_fail(err, errlen, CE_EINVAL, NULL, "no directory given");
  BIO *ca_bio = NULL, *roots_bio = NULL;
  int rc = ce__tls_read_file(ca_cert, &ca_bio, err, errlen);
  if (rc != CE_OK)
    return rc;
  rc = ce__tls_read_file(roots, &roots_bio, err, errlen);
  if (rc != CE_OK) {
    BIO_free(ca_bio);
    return rc;
  }
  char *ca = NULL, *rt = NULL;
  long ca_len = BIO_get_mem_data(ca_bio, &ca);
  long rt_len = BIO_get_mem_data(roots_bio, &rt);
  if (ca_len <= 0 || !contains(ca, (size_t)ca_len, "-----BEGIN CERTIFICATE-----")) {
    rc = ce__tls_fail(err, errlen, CE_EPARSE, ca_cert, "holds no PEM certificate");
  } else if (rt_len <= 0 || !contains(rt, (size_t)rt_len, "-----BEGIN ")) {
    rc = ce__tls_fail(err, errlen, CE_EPARSE, roots, "holds no PEM certificate");
  } else {
    const char *ca_parts[] = {ca};
    size_t ca_lens[] = {(size_t)ca_len};
    rc = write_file(dir, CE_BUNDLE_CA_NAME, ca_parts, ca_lens, 1, err, errlen);
    if (rc == CE_OK) {
      bool newline = rt[rt_len - 1] != '\n';
      const char *parts[] = {rt, "\n", ca};
      size_t lens[] = {(size_t)rt_len, newline ? 1u : 0u, (size_t)ca_len};
      rc = write_file(dir, CE_BUNDLE_NAME, parts, lens, 3, err, errlen);
    }
  }
  BIO_free(ca_bio);
  BIO_free(roots_bio);
  return rc;
}
