/*
 * PEM files and error sentences for the TLS code (internal to c_src/tls).
 *
 * CA certificates, CA keys and trust bundles are small files chosen by the
 * operator. They are read whole into a memory BIO, with a size limit, so a
 * wrong path (a FIFO, /dev/zero, a multi-gigabyte log) fails with a clear
 * sentence instead of hanging the sidecar, and every message names the file.
 */
#ifndef CE_TLS_FILES_H
#define CE_TLS_FILES_H

#include <openssl/bio.h>
#include <stdbool.h>
#include <stddef.h>

/* The Mozilla bundle is about 200 KiB; a CA or key file is a few KiB.
 * 8 MiB leaves room for any real bundle and bounds a wrong one. */
#define CE__TLS_FILE_MAX (8u * 1024u * 1024u)

/* Reads the regular file at path into a new memory BIO (*out, freed with
 * BIO_free by the caller). Returns CE_OK, CE_ENOENT (no such file),
 * CE_EPERM (not readable), CE_EINVAL (not a regular file), CE_ETOOBIG
 * (larger than CE__TLS_FILE_MAX), CE_EIO or CE_ENOMEM, with err set to a
 * sentence naming the file. *out is untouched on failure. */
int ce__tls_read_file(const char *path, BIO **out, char *err, size_t errlen);

/* Writes "PATH: " (sanitised, see common/text.h) followed by the formatted
 * text into err, then returns code, so that a failure is one statement:
 * `return ce__tls_fail(err, errlen, CE_EPARSE, path, "...", ...)`.
 * path may be NULL (no prefix); err may be NULL or errlen 0 (nothing is
 * written). */
int ce__tls_fail(char *err, size_t errlen, int code, const char *path,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* The reason string of the oldest entry in OpenSSL's error queue of this
 * thread, or "unknown OpenSSL error" when it is empty; never NULL. It does
 * not clear the queue. */
const char *ce__tls_openssl_reason(void);

/* True when the oldest error in OpenSSL's queue says "no PEM block of the
 * wanted kind in the input" (also what reading past the last block says),
 * as opposed to a block that is there but malformed. */
bool ce__tls_error_is_no_pem(void);

#endif
