#include "proxy/privdrop.h"

#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/error.h"

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return CE_EPERM;
}

/* The kernel's capability sets as two 32-bit words each (version 3). */
typedef struct {
  struct __user_cap_header_struct hdr;
  struct __user_cap_data_struct data[2];
} caps_t;

static int caps_get(caps_t *c) {
  memset(c, 0, sizeof(*c));
  c->hdr.version = _LINUX_CAPABILITY_VERSION_3;
  return (int)syscall(SYS_capget, &c->hdr, c->data);
}

static bool permitted(const caps_t *c, int capno) { return (c->data[capno / 32].permitted >> (capno % 32)) & 1u; }

static bool effective(const caps_t *c, int capno) { return (c->data[capno / 32].effective >> (capno % 32)) & 1u; }

int ce_privdrop(uint32_t uid, char *err, size_t cap) {
  uid_t r, e, s;
  if (getresuid(&r, &e, &s) != 0)
    return fail(err, cap, "getresuid: %s", strerror(errno));
  /* Nothing a later execve could gain, whatever happens below. */
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return fail(err, cap, "cannot set no_new_privs: %s", strerror(errno));
  /* Ambient capabilities would survive an execve; the proxy never execs,
   * but nothing should be left to inherit. EINVAL: a kernel before 4.3. */
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
    return fail(err, cap, "cannot clear the ambient capabilities: %s", strerror(errno));
  if (r == uid && e == uid && s == uid)
    return CE_OK;
  if (e != 0)
    return fail(err, cap, "--user %u: the proxy runs as uid %u, and only root can become another uid", uid,
                (unsigned)e);

  caps_t c;
  if (caps_get(&c) != 0)
    return fail(err, cap, "capget: %s", strerror(errno));
  const bool keep_admin = permitted(&c, CAP_NET_ADMIN);
  if (!effective(&c, CAP_SETUID) || !effective(&c, CAP_SETGID))
    return fail(err, cap,
                "--user %u: root without CAP_SETUID and CAP_SETGID cannot change uid (add them to the "
                "sidecar's capabilities)",
                uid);
  /* The bounding set limits what any later execve could grant. Cutting it
   * needs CAP_SETPCAP; a pod that drops it already has a bounding set of
   * only what it added, and no_new_privs keeps file capabilities out. */
  if (effective(&c, CAP_SETPCAP)) {
    for (int k = 0; k <= 63; k++) {
      if (k == CAP_NET_ADMIN || prctl(PR_CAPBSET_READ, k, 0, 0, 0) != 1)
        continue;
      if (prctl(PR_CAPBSET_DROP, k, 0, 0, 0) != 0)
        return fail(err, cap, "cannot drop capability %d from the bounding set: %s", k, strerror(errno));
    }
  }
  /* Keep the permitted set across setresuid, then cut it to NET_ADMIN. */
  if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0)
    return fail(err, cap, "PR_SET_KEEPCAPS: %s", strerror(errno));
  if (setgroups(0, NULL) != 0)
    return fail(err, cap, "setgroups: %s", strerror(errno));
  if (setresgid(uid, uid, uid) != 0)
    return fail(err, cap, "setresgid(%u): %s", uid, strerror(errno));
  if (setresuid(uid, uid, uid) != 0)
    return fail(err, cap, "setresuid(%u): %s", uid, strerror(errno));
  if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) != 0)
    return fail(err, cap, "PR_SET_KEEPCAPS: %s", strerror(errno));
  caps_t want;
  memset(&want, 0, sizeof(want));
  want.hdr.version = _LINUX_CAPABILITY_VERSION_3;
  if (keep_admin)
    want.data[0].permitted = want.data[0].effective = 1u << CAP_NET_ADMIN;
  if (syscall(SYS_capset, &want.hdr, want.data) != 0)
    return fail(err, cap, "capset: %s", strerror(errno));

  /* Check rather than trust: the uid is taken for good, and root is out of
   * reach. */
  if (getresuid(&r, &e, &s) != 0 || r != uid || e != uid || s != uid)
    return fail(err, cap, "the uid is not %u after setresuid", uid);
  if (setresuid(0, 0, 0) == 0 || caps_get(&c) != 0 ||
      c.data[0].permitted != want.data[0].permitted || c.data[1].permitted != 0 ||
      c.data[0].inheritable != 0 || c.data[1].inheritable != 0)
    return fail(err, cap, "the capabilities are not what --user %u asks for after the drop", uid);
#if defined(__SANITIZE_ADDRESS__)
  /* Changing uid made the process non-dumpable, which keeps LeakSanitizer
   * from inspecting it at exit. Sanitizer builds (tests) only. */
  (void)prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
#endif
  return CE_OK;
}
