/*
 * Shared helpers for the TLS tests: a scratch directory per test, PEM
 * files, hand-built certificates (for the cases ce_ca_generate refuses to
 * make: expired CAs, non-CAs, other key types), and running the built
 * binary.
 */
#ifndef CE_TEST_TLS_FIXTURES_H
#define CE_TEST_TLS_FIXTURES_H

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stddef.h>

#include "tls/tlsconn.h"

#define FX_PATH_MAX 256
#define FX_OUT_MAX 8192

/* The scratch directory of the running test (set by fx_setup). */
extern char fx_dir[64];

/* Criterion .init/.fini: create and remove fx_dir (and all it holds). */
void fx_setup(void);
void fx_teardown(void);

/* fx_dir + "/" + name into buf (FX_PATH_MAX bytes). */
char *fx_path(char *buf, const char *name);

void fx_write_text(const char *path, const char *text);
void fx_write_cert(const char *path, X509 *cert);
void fx_write_key(const char *path, EVP_PKEY *key);
/* Reads a whole small file into a NUL-terminated malloc'd string. */
char *fx_read_text(const char *path);

/* What a hand-built certificate looks like. issuer/issuer_key NULL makes it
 * self-signed. key_usage NULL leaves out the extension. */
typedef struct {
  const char *cn;
  bool ca;
  const char *key_usage;    /* e.g. "critical,keyCertSign" */
  long not_before_offset;   /* seconds from now */
  long not_after_offset;
  X509 *issuer;
  EVP_PKEY *issuer_key;
} fx_cert_spec_t;

X509 *fx_make_cert(EVP_PKEY *key, const fx_cert_spec_t *spec);

/* A self-signed P-256 CA named cn, valid from a minute ago for a day. */
X509 *fx_self_signed(const char *cn);

/* A PEM block of type `type` with `header` ("" for none) around data
 * (len bytes), and a certificate's PEM: malloc'd strings. */
char *fx_pem_block(const char *type, const char *header, const unsigned char *data, long len);
char *fx_cert_pem(X509 *cert);

/* A CA made by ce_ca_generate into fx_dir as ca.pem / ca.key. */
void fx_generate_ca(unsigned days);

typedef struct {
  int status;
  char out[FX_OUT_MAX];
  char err[FX_OUT_MAX];
} fx_result_t;

/* Runs $CONDUKT_EGRESS_BIN with args (NULL-terminated, without argv[0]). */
void fx_run(fx_result_t *r, const char *const *args);

/* The seconds between an ASN1_TIME and time_t t (positive when later). */
long fx_time_diff(const ASN1_TIME *a, time_t t);

/* Moves everything `from` has to send into `to` (two in-memory TLS
 * connections); returns the byte count. */
size_t fx_shuttle(ce_tlsconn_t *from, ce_tlsconn_t *to);

#endif
