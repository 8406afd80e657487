/*
 * Kubernetes client configuration (docs/port-protocol.md, "Kubernetes"):
 * a kubeconfig (a list of files merged as kubectl merges $KUBECONFIG),
 * the in-cluster ServiceAccount directory, or explicit values, all turned
 * into one ce_kube_config_t: where the API server is, how its certificate
 * is checked, and how the client authenticates.
 *
 * Pure: files are read, nothing is sent anywhere and no plugin is run.
 * Every error names the file and the YAML path of the bad value
 * ("users[0].user.exec.command").
 *
 * Ownership: a loaded config owns every string in it; ce_kube_config_free()
 * releases them (secrets are cleansed first).
 */
#ifndef CE_KUBE_CONFIG_H
#define CE_KUBE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

/* The largest kubeconfig file read (kubectl's are a few KiB). */
#define CE_KUBE_CONFIG_FILE_MAX (4u * 1024u * 1024u)
/* The largest PEM or token file read. */
#define CE_KUBE_SECRET_FILE_MAX (1u * 1024u * 1024u)
/* Paths in one kube_open. */
#define CE_KUBE_CONFIG_PATHS_MAX 32u
/* exec plugin: arguments and environment entries. */
#define CE_KUBE_EXEC_ARGS_MAX 256u
#define CE_KUBE_EXEC_ENV_MAX 256u
/* The longest host name in a server URL. */
#define CE_KUBE_HOST_MAX 256u

typedef enum {
  CE_KUBE_AUTH_NONE = 0,
  CE_KUBE_AUTH_TOKEN,
  CE_KUBE_AUTH_TOKEN_FILE,
  CE_KUBE_AUTH_CLIENT_CERT,
  CE_KUBE_AUTH_EXEC,
} ce_kube_auth_t;

typedef struct {
  char *api_version;          /* client.authentication.k8s.io/v1 or /v1beta1 */
  char **argv;                /* command then args, NULL-terminated */
  size_t argc;
  char **env;                 /* "NAME=value", NULL-terminated */
  size_t envc;
  bool provide_cluster_info;
} ce_kube_exec_t;

typedef struct {
  /* The cluster. */
  char *server;               /* as given, without a trailing '/' */
  char host[CE_KUBE_HOST_MAX];/* without brackets for IPv6 */
  unsigned port;
  char *path_prefix;          /* "" or "/prefix" (no trailing '/') */
  char *ca_pem;               /* NULL: the system's default CA store */
  size_t ca_len;
  bool insecure;
  char *tls_server_name;      /* NULL: host */
  /* Names, for the caller (NULL when not known). */
  char *context;
  char *namespace_;
  char *user;
  /* Authentication. */
  ce_kube_auth_t auth;
  char *token;
  char *token_file;
  char *cert_pem;             /* with key_pem: a client certificate */
  size_t cert_len;
  char *key_pem;
  size_t key_len;
  ce_kube_exec_t exec;
} ce_kube_config_t;

/* Loads the merged kubeconfig of paths[0..n) (missing files are skipped
 * as kubectl skips them; none found is noent) using context, or the
 * current-context when context is NULL. Returns CE_OK or a CE_E* code
 * (io, noent, inval, toobig, nomem) with err set. */
int ce_kube_config_load(const char *const *paths, size_t n, const char *context,
                        ce_kube_config_t *out, char *err, size_t errlen);

/* The same from one kubeconfig held in memory; name is the file name
 * used in messages and dir the directory relative paths start from. */
int ce_kube_config_parse(const char *yaml, size_t len, const char *name, const char *dir,
                         const char *context, ce_kube_config_t *out, char *err,
                         size_t errlen);

/* In-cluster: dir (default /var/run/secrets/kubernetes.io/serviceaccount)
 * holds token, ca.crt and perhaps namespace; host and port default to
 * $KUBERNETES_SERVICE_HOST and $KUBERNETES_SERVICE_PORT (port 0: the
 * default). The token is read per request (token_file). */
int ce_kube_config_in_cluster(const char *dir, const char *host, unsigned port,
                              ce_kube_config_t *out, char *err, size_t errlen);

/* Splits an https:// URL into out->server, host, port and path_prefix. */
int ce_kube_config_set_server(ce_kube_config_t *out, const char *url, char *err,
                              size_t errlen);

/* Reads a whole file of at most max bytes (NUL-terminated). */
int ce_kube_read_file(const char *path, size_t max, char **data, size_t *len, char *err,
                      size_t errlen);

/* Strict base64 (RFC 4648, padding optional, whitespace between groups
 * ignored). Returns CE_OK, CE_EINVAL or CE_ENOMEM. */
int ce_kube_base64_decode(const char *s, size_t n, char **out, size_t *outlen);

/* A bearer token goes into a header: 1 or more bytes of 0x21..0x7e. */
bool ce_kube_token_ok(const char *s, size_t n);

const char *ce_kube_auth_name(ce_kube_auth_t a);

void ce_kube_config_free(ce_kube_config_t *c);

#endif
