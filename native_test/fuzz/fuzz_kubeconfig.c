/*
 * libFuzzer target for c_src/kube/config.c (the kubeconfig loader) and
 * the ExecCredential parser of c_src/kube/proto.c.
 *
 * The input is a kubeconfig file as a user (or an attacker who can write
 * $KUBECONFIG) might leave it. Beyond "no crash, no leak, no sanitizer
 * report" the target checks what the port relies on:
 *
 * - the result is CE_OK or one of the codes config.h lists;
 * - on an error the message is non-empty, one line, names the file, and
 *   the config is left empty (nothing to free);
 * - on CE_OK the server is https://, the port is 1..65535, the host is
 *   non-empty, and the authentication kind agrees with the fields set.
 *
 * The same bytes are also fed to ce_kube_cred_parse: CE_OK gives a token
 * or a certificate and key, anything else CE_EINVAL.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kube/config.h"
#include "kube/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NAME "/fuzz/kubeconfig"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ce_kube_config_t c;
  char err[512];
  err[0] = '\0';
  int rc = ce_kube_config_parse((const char *)data, size, NAME, "/fuzz", NULL, &c, err,
                                sizeof(err));
  if (rc == CE_OK) {
    if (c.server == NULL || strncmp(c.server, "https://", 8) != 0 || c.host[0] == '\0' ||
        c.port < 1 || c.port > 65535 || c.path_prefix == NULL)
      abort();
    switch (c.auth) {
    case CE_KUBE_AUTH_TOKEN:
      if (c.token == NULL || c.token[0] == '\0')
        abort();
      break;
    case CE_KUBE_AUTH_TOKEN_FILE:
      if (c.token_file == NULL)
        abort();
      break;
    case CE_KUBE_AUTH_CLIENT_CERT:
      if (c.cert_pem == NULL || c.key_pem == NULL)
        abort();
      break;
    case CE_KUBE_AUTH_EXEC:
      if (c.exec.argv == NULL || c.exec.argv[0] == NULL || c.exec.env == NULL)
        abort();
      break;
    default:
      if (c.token != NULL || c.cert_pem != NULL || c.exec.argv != NULL)
        abort();
    }
    ce_kube_config_free(&c);
  } else {
    if (rc != CE_EINVAL && rc != CE_ENOMEM && rc != CE_ETOOBIG && rc != CE_ENOENT &&
        rc != CE_EIO)
      abort();
    if (err[0] == '\0' || strchr(err, '\n') != NULL || c.server != NULL)
      abort();
    if (strncmp(err, "kubeconfig \"", 12) == 0 && strstr(err, NAME) == NULL)
      abort();
  }

  ce_kube_cred_t cred;
  rc = ce_kube_cred_parse((const char *)data, size, "client.authentication.k8s.io/v1", &cred,
                          err, sizeof(err));
  if (rc == CE_OK) {
    if (cred.token == NULL && (cred.cert_pem == NULL || cred.key_pem == NULL))
      abort();
    ce_kube_cred_free(&cred);
  } else if (rc != CE_EINVAL && rc != CE_ENOMEM) {
    abort();
  }
  return 0;
}
