/* Tests for c_src/proxy/privdrop.c (proxy --user). Each case runs in a
 * child process, since a drop cannot be undone; the child reports through
 * its exit status and a pipe. Needs root, as the sidecar does. */
#include <criterion/criterion.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/error.h"
#include "proxy/privdrop.h"

#define UID 4242

static void need_root(void) {
  if (geteuid() != 0)
    cr_skip_test("needs root");
}

/* The capability line "CapXxx:\t..." of /proc/self/status, as a number. */
static unsigned long long cap_line(const char *name) {
  char line[256];
  unsigned long long v = ~0ULL;
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL)
    return v;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, name, strlen(name)) == 0)
      v = strtoull(line + strlen(name) + 1, NULL, 16);
  }
  fclose(f);
  return v;
}

typedef int (*child_fn)(char *msg, size_t cap);

/* Runs fn in a child, as root; returns its exit status and its message. */
static int in_child(child_fn fn, char *msg, size_t cap) {
  need_root();
  int p[2];
  cr_assert_eq(pipe(p), 0);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    close(p[0]);
    char m[512] = "";
    int rc = fn(m, sizeof(m));
    ssize_t w = write(p[1], m, strlen(m));
    (void)w;
    _exit(rc);
  }
  close(p[1]);
  ssize_t n = read(p[0], msg, cap - 1);
  msg[n > 0 ? n : 0] = '\0';
  close(p[0]);
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st), "the child died: %s", msg);
  return WEXITSTATUS(st);
}

/* Runs fn in a child and expects exit 0 and, when want is given, a
 * message containing it. */
static void expect_child(child_fn fn, const char *want) {
  char msg[512];
  cr_assert_eq(in_child(fn, msg, sizeof(msg)), 0, "%s", msg);
  if (want != NULL)
    cr_assert_not_null(strstr(msg, want), "%s", msg);
}

static int drop_from_root(char *msg, size_t cap) {
  char err[CE_PRIVDROP_ERR_MAX];
  if (ce_privdrop(UID, err, sizeof(err)) != CE_OK) {
    snprintf(msg, cap, "drop failed: %s", err);
    return 1;
  }
  uid_t r, e, s;
  gid_t gr, ge, gs;
  getresuid(&r, &e, &s);
  getresgid(&gr, &ge, &gs);
  if (r != UID || e != UID || s != UID || gr != UID || ge != UID || gs != UID) {
    snprintf(msg, cap, "ids %u %u %u / %u %u %u", r, e, s, gr, ge, gs);
    return 2;
  }
  if (getgroups(0, NULL) != 0) {
    snprintf(msg, cap, "supplementary groups left");
    return 3;
  }
  unsigned long long want = 1ULL << CAP_NET_ADMIN;
  if (cap_line("CapEff:") != want || cap_line("CapPrm:") != want || cap_line("CapInh:") != 0 ||
      cap_line("CapAmb:") != 0 || cap_line("CapBnd:") != want) {
    snprintf(msg, cap, "caps eff %llx prm %llx inh %llx amb %llx bnd %llx", cap_line("CapEff:"),
             cap_line("CapPrm:"), cap_line("CapInh:"), cap_line("CapAmb:"), cap_line("CapBnd:"));
    return 4;
  }
  if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) {
    snprintf(msg, cap, "no_new_privs not set");
    return 5;
  }
  if (setuid(0) == 0 || setgid(0) == 0) {
    snprintf(msg, cap, "root came back");
    return 6;
  }
  /* What the proxy needs the capability for: SO_MARK. */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  unsigned mark = 0x539;
  int rc = setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof(mark));
  close(fd);
  if (rc != 0) {
    snprintf(msg, cap, "SO_MARK refused after the drop");
    return 7;
  }
  return 0;
}

Test(privdrop, root_becomes_the_uid_with_net_admin_alone) { expect_child(drop_from_root, NULL); }

/* Takes capability capno out of the effective, permitted and inheritable
 * sets of this process. Returns 0 or -1. */
static int remove_cap(int capno) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &h, d) != 0)
    return -1;
  d[0].permitted &= ~(1u << capno);
  d[0].effective &= ~(1u << capno);
  d[0].inheritable &= ~(1u << capno);
  return syscall(SYS_capset, &h, d) == 0 ? 0 : -1;
}

static int drop_without_net_admin(char *msg, size_t cap) {
  char err[CE_PRIVDROP_ERR_MAX];
  if (prctl(PR_CAPBSET_DROP, CAP_NET_ADMIN, 0, 0, 0) != 0 || remove_cap(CAP_NET_ADMIN) != 0)
    return 10;
  if (ce_privdrop(UID, err, sizeof(err)) != CE_OK) {
    snprintf(msg, cap, "drop failed: %s", err);
    return 1;
  }
  if (cap_line("CapEff:") != 0 || cap_line("CapPrm:") != 0) {
    snprintf(msg, cap, "caps left: %llx", cap_line("CapPrm:"));
    return 2;
  }
  return 0;
}

Test(privdrop, without_net_admin_no_capability_is_left) { expect_child(drop_without_net_admin, NULL); }

static int drop_as_other_uid(char *msg, size_t cap) {
  char err[CE_PRIVDROP_ERR_MAX];
  if (setresuid(65534, 65534, 65534) != 0)
    return 10;
  int rc = ce_privdrop(UID, err, sizeof(err));
  snprintf(msg, cap, "%s", err);
  return rc == CE_EPERM ? 0 : 1;
}

Test(privdrop, another_uid_is_refused) {
  expect_child(drop_as_other_uid, "--user 4242: the proxy runs as uid 65534, and only root can become another uid");
}

static int drop_when_already(char *msg, size_t cap) {
  char err[CE_PRIVDROP_ERR_MAX];
  if (setresgid(UID, UID, UID) != 0 || setresuid(UID, UID, UID) != 0)
    return 10;
  if (ce_privdrop(UID, err, sizeof(err)) != CE_OK) {
    snprintf(msg, cap, "%s", err);
    return 1;
  }
  return prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1 ? 0 : 2;
}

Test(privdrop, already_the_uid_is_fine) { expect_child(drop_when_already, NULL); }

static int drop_without_setuid(char *msg, size_t cap) {
  char err[CE_PRIVDROP_ERR_MAX];
  if (remove_cap(CAP_SETUID) != 0)
    return 10;
  int rc = ce_privdrop(UID, err, sizeof(err));
  snprintf(msg, cap, "%s", err);
  return rc == CE_EPERM && getuid() == 0 ? 0 : 1;
}

Test(privdrop, root_without_setuid_is_refused) {
  expect_child(drop_without_setuid, "without CAP_SETUID and CAP_SETGID");
}
