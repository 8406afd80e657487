/*
 * The pure parts of the Kubernetes streaming protocols and credentials
 * (docs/port-protocol.md, "Kubernetes"): the channel byte of
 * v4/v5.channel.k8s.io frames, the 2-byte port prefix of port-forward
 * streams, an exec Status turned into an exit code, ExecCredential
 * output of exec plugins, and the query escaping of exec URLs.
 */
#ifndef CE_KUBE_PROTO_H
#define CE_KUBE_PROTO_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Channel numbers of the streaming subprotocols. */
#define CE_KUBE_CH_STDIN 0
#define CE_KUBE_CH_STDOUT 1
#define CE_KUBE_CH_STDERR 2
#define CE_KUBE_CH_ERROR 3
#define CE_KUBE_CH_RESIZE 4
#define CE_KUBE_CH_CLOSE 255   /* v5: {255, Chan} closes Chan's write side */
#define CE_KUBE_PF_DATA 0
#define CE_KUBE_PF_ERROR 1

/* Splits one binary WebSocket message: its first byte is the channel.
 * Returns false for an empty message (no channel). */
bool ce_kube_frame_split(const uint8_t *msg, size_t len, unsigned *chan,
                         const uint8_t **data, size_t *dlen);

/* The 2-byte little-endian port number that opens each port-forward
 * stream, which may arrive split over messages. */
typedef struct {
  uint8_t have;      /* 0..2 bytes of the prefix seen */
  uint8_t bytes[2];
} ce_kube_prefix_t;

/* Consumes the prefix from data; *skip receives the bytes of data that
 * belonged to it (the rest is payload). Returns 0 while the prefix is
 * incomplete or when it is done and equals port, -1 when it names another
 * port. */
int ce_kube_prefix_feed(ce_kube_prefix_t *p, uint16_t port, const uint8_t *data, size_t len,
                        size_t *skip);
static inline bool ce_kube_prefix_done(const ce_kube_prefix_t *p) { return p->have == 2; }

/* The exit code an exec Status means (the status channel's JSON):
 * Success is 0, NonZeroExitCode its ExitCode cause, otherwise a message
 * ending in "exit status N" is N. Returns true with *code set, false when
 * the Status says no code (or is not a Status). */
bool ce_kube_exit_code(const json_t *status, int *code);

/* Parsed ExecCredential.status. */
typedef struct {
  char *token;
  char *cert_pem;
  size_t cert_len;
  char *key_pem;
  size_t key_len;
  bool expires;
  time_t expiry;     /* UTC seconds, when expires */
} ce_kube_cred_t;

/* Parses an exec plugin's stdout: an ExecCredential of api_version with a
 * token or a client certificate and key. Returns CE_OK or CE_EINVAL /
 * CE_ENOMEM with err set. */
int ce_kube_cred_parse(const char *json, size_t len, const char *api_version,
                       ce_kube_cred_t *out, char *err, size_t errlen);

void ce_kube_cred_free(ce_kube_cred_t *c);

/* Parses an RFC 3339 time ("2026-01-02T03:04:05Z", fractions and offsets
 * accepted). Returns false when it is not one. */
bool ce_kube_rfc3339(const char *s, time_t *out);

/* Appends s percent-escaped for a URL query value to dst (cap bytes,
 * starting at *used). Returns false when it does not fit. */
bool ce_kube_query_escape(char *dst, size_t cap, size_t *used, const char *s, size_t n);

#endif
