/*
 * Test support: runs a program the way the command-line tests need, with
 * its stdout and stderr captured in files, and fails the calling test when
 * it cannot start or does not exit normally.
 */
#ifndef CE_TEST_SUPPORT_RUN_H
#define CE_TEST_SUPPORT_RUN_H

/* Runs `file` (looked up in PATH unless it holds a '/') with argv, stdout
 * into out_path and stderr into err_path (both truncated). In the child,
 * the variables named in `unset` are removed and the "NAME=VALUE" strings
 * of `set` added first (either list NULL-terminated, or NULL). Returns the
 * exit status; a signal or a failed wait is a test failure. */
int ce_test_run(const char *file, char *const argv[], const char *out_path,
                const char *err_path, const char *const *unset,
                const char *const *set);

#endif
