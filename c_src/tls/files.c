/* Bounded PEM file reading and error sentences (see files.h). */
#include "tls/files.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/text.h"

/* A sanitised path, as ce_text_sanitize() writes it, always fits. */
#define SHOWN_PATH_MAX (4 * CE_TEXT_QUOTE_MAX + 8)
#define READ_CHUNK 16384u

int ce__tls_fail(char *err, size_t errlen, int code, const char *path,
                 const char *fmt, ...) {
  if (err == NULL || errlen == 0)
    return code;
  size_t used = 0;
  if (path != NULL) {
    char shown[SHOWN_PATH_MAX];
    ce_text_sanitize(shown, sizeof(shown), path, strlen(path), 0);
    int n = snprintf(err, errlen, "%s: ", shown);
    used = n < 0 ? 0 : (size_t)n;
    if (used >= errlen)
      return code;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err + used, errlen - used, fmt, ap);
  va_end(ap);
  return code;
}

const char *ce__tls_openssl_reason(void) {
  unsigned long e = ERR_peek_error();
  const char *reason = e != 0 ? ERR_reason_error_string(e) : NULL;
  return reason != NULL ? reason : "unknown OpenSSL error";
}

bool ce__tls_error_is_no_pem(void) {
  unsigned long e = ERR_peek_error();
  return ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
}

static int open_error(char *err, size_t errlen, const char *path, int e) {
  int code = e == ENOENT || e == ENOTDIR ? CE_ENOENT
             : e == EACCES || e == EPERM ? CE_EPERM
                                         : CE_EIO;
  return ce__tls_fail(err, errlen, code, path, "cannot open: %s", strerror(e));
}

int ce__tls_read_file(const char *path, BIO **out, char *err, size_t errlen) {
  if (path == NULL || path[0] == '\0')
    return ce__tls_fail(err, errlen, CE_EINVAL, NULL, "no file name given");
  /* O_NONBLOCK so that opening a FIFO by mistake does not wait for a
   * writer; the fstat below then refuses it. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return open_error(err, errlen, path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return ce__tls_fail(err, errlen, CE_EIO, path, "cannot stat: %s",
                        strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return ce__tls_fail(err, errlen, CE_EINVAL, path, "not a regular file");
  }
  if ((unsigned long long)st.st_size > CE__TLS_FILE_MAX) {
    close(fd);
    return ce__tls_fail(err, errlen, CE_ETOOBIG, path,
                        "larger than %u bytes; not a PEM file", CE__TLS_FILE_MAX);
  }
  BIO *bio = BIO_new(BIO_s_mem());
  if (bio == NULL) {
    close(fd);
    return ce__tls_fail(err, errlen, CE_ENOMEM, path, "out of memory");
  }
  /* The size limit is checked again while reading, since the file can grow
   * between fstat and read. */
  unsigned char chunk[READ_CHUNK];
  size_t total = 0;
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int e = errno;
      BIO_free(bio);
      close(fd);
      return ce__tls_fail(err, errlen, CE_EIO, path, "cannot read: %s",
                          strerror(e));
    }
    if (n == 0)
      break;
    total += (size_t)n;
    if (total > CE__TLS_FILE_MAX) {
      BIO_free(bio);
      close(fd);
      return ce__tls_fail(err, errlen, CE_ETOOBIG, path,
                          "larger than %u bytes; not a PEM file",
                          CE__TLS_FILE_MAX);
    }
    if (BIO_write(bio, chunk, (int)n) != (int)n) {
      BIO_free(bio);
      close(fd);
      ERR_clear_error();
      return ce__tls_fail(err, errlen, CE_ENOMEM, path, "out of memory");
    }
  }
  close(fd);
  *out = bio;
  return CE_OK;
}
