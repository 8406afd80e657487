/* The resolver the tests control (resolver.h). */
#include "support/resolver.h"

#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

int __real_uv_getaddrinfo(uv_loop_t *loop, uv_getaddrinfo_t *req, uv_getaddrinfo_cb cb,
                          const char *node, const char *service, const struct addrinfo *hints);
int __wrap_uv_getaddrinfo(uv_loop_t *loop, uv_getaddrinfo_t *req, uv_getaddrinfo_cb cb,
                          const char *node, const char *service, const struct addrinfo *hints);

#define FAKE_ADDRS_MAX 8
#define PENDING_MAX 64

static char g_name[256];
static char g_addrs[FAKE_ADDRS_MAX][64];
static size_t g_n;
static unsigned g_calls;
static char g_service[16];

/* The callers' callbacks, by request, while a fake answer is on its way. */
static struct {
  uv_getaddrinfo_t *req;
  uv_getaddrinfo_cb cb;
} g_pending[PENDING_MAX];

void ce_test_resolver_set(const char *name, const char *const *addrs, size_t n) {
  g_name[0] = '\0';
  g_n = 0;
  g_calls = 0;
  if (name == NULL)
    return;
  strncpy(g_name, name, sizeof(g_name) - 1);
  for (size_t i = 0; i < n && i < FAKE_ADDRS_MAX; i++) {
    strncpy(g_addrs[i], addrs[i], sizeof(g_addrs[i]) - 1);
    g_n++;
  }
}

unsigned ce_test_resolver_calls(void) { return g_calls; }

/* The fake answer: each literal through getaddrinfo (numeric only), the
 * chains joined, so that uv_freeaddrinfo() frees them node by node as
 * usual. */
static void fake_cb(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  uv_freeaddrinfo(res);
  uv_getaddrinfo_cb cb = NULL;
  for (size_t i = 0; i < PENDING_MAX; i++)
    if (g_pending[i].req == req) {
      cb = g_pending[i].cb;
      g_pending[i].req = NULL;
      break;
    }
  if (status < 0 || g_n == 0) {
    cb(req, status < 0 ? status : UV_EAI_NONAME, NULL);
    return;
  }
  struct addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  struct addrinfo *head = NULL, **tail = &head;
  for (size_t i = 0; i < g_n; i++) {
    struct addrinfo *one = NULL;
    if (getaddrinfo(g_addrs[i], g_service, &hints, &one) != 0)
      continue;
    *tail = one;
    while (*tail != NULL)
      tail = &(*tail)->ai_next;
  }
  cb(req, head != NULL ? 0 : UV_EAI_NONAME, head);
}

int __wrap_uv_getaddrinfo(uv_loop_t *loop, uv_getaddrinfo_t *req, uv_getaddrinfo_cb cb,
                          const char *node, const char *service, const struct addrinfo *hints) {
  if (g_name[0] == '\0' || node == NULL || strcmp(node, g_name) != 0 || cb == NULL)
    return __real_uv_getaddrinfo(loop, req, cb, node, service, hints);
  g_calls++;
  strncpy(g_service, service != NULL ? service : "0", sizeof(g_service) - 1);
  size_t slot = PENDING_MAX;
  for (size_t i = 0; i < PENDING_MAX && slot == PENDING_MAX; i++)
    if (g_pending[i].req == NULL)
      slot = i;
  if (slot == PENDING_MAX)
    return UV_ENOMEM;
  g_pending[slot].req = req;
  g_pending[slot].cb = cb;
  /* A real (numeric, so instant) lookup on the thread pool: the answer
   * comes back on the loop as a real one would. */
  struct addrinfo h;
  memset(&h, 0, sizeof(h));
  h.ai_flags = AI_NUMERICHOST;
  int rc = __real_uv_getaddrinfo(loop, req, fake_cb, "127.0.0.1", service, &h);
  if (rc != 0)
    g_pending[slot].req = NULL;
  return rc;
}
