#include "support/run.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int ce_test_run(const char *file, char *const argv[], const char *out_path,
                const char *err_path, const char *const *unset,
                const char *const *set) {
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
      _exit(127);
    for (size_t i = 0; unset != NULL && unset[i] != NULL; i++)
      unsetenv(unset[i]);
    for (size_t i = 0; set != NULL && set[i] != NULL; i++)
      putenv((char *)set[i]);
    execvp(file, argv);
    _exit(127);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "%s did not exit normally (signal %d)", file,
            WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return WEXITSTATUS(status);
}
