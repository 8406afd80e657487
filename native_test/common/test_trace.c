/* Tests for c_src/common/trace.c: level filtering, the line format, that a
 * disabled trace neither writes nor evaluates its arguments, and the
 * configuration from --verbose and CONDUKT_EGRESS_TRACE. stderr (fd 2) is
 * pointed at a temporary file while a test writes. */
#include <criterion/criterion.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/trace.h"

static FILE *captured;
static int saved_fd = -1;
static char out[4 * CE_TRACE_LINE_MAX];

static void capture_begin(void) {
  fflush(stderr);
  captured = tmpfile();
  cr_assert_not_null(captured);
  saved_fd = dup(STDERR_FILENO);
  cr_assert_geq(saved_fd, 0);
  cr_assert_geq(dup2(fileno(captured), STDERR_FILENO), 0);
}

static const char *capture_end(void) {
  fflush(stderr);
  dup2(saved_fd, STDERR_FILENO);
  close(saved_fd);
  rewind(captured);
  size_t n = fread(out, 1, sizeof(out) - 1, captured);
  out[n] = '\0';
  fclose(captured);
  return out;
}

static size_t count_lines(const char *s) {
  size_t n = 0;
  for (; *s != '\0'; s++)
    n += *s == '\n';
  return n;
}

static int evaluated;
static int side_effect(void) { return ++evaluated; }

Test(trace, default_level_is_info) {
  ce_trace_configure(false);
  cr_expect_eq(ce_trace_level(), CE_TRACE_INFO);
}

Test(trace, line_format) {
  ce_trace_set_level(CE_TRACE_DEBUG);
  capture_begin();
  CE_TRACE_D("proxy", 'c', 42, "[%s] -> %s", "head", "exchange");
  CE_TRACE_W("control", 0, 0, "no id here");
  const char *s = capture_end();
  regex_t re;
  cr_assert_eq(regcomp(&re,
                       "^condukt-egress: [0-9]+\\.[0-9]{6} debug proxy c-0000002a: \\[head\\] -> exchange\n"
                       "condukt-egress: [0-9]+\\.[0-9]{6} warn control -: no id here\n$",
                       REG_EXTENDED),
               0);
  cr_expect_eq(regexec(&re, s, 0, NULL, 0), 0, "got:\n%s", s);
  regfree(&re);
}

Test(trace, levels_filter) {
  static const ce_trace_level_t levels[] = {CE_TRACE_ERROR, CE_TRACE_WARN, CE_TRACE_INFO,
                                            CE_TRACE_DEBUG};
  for (size_t i = 0; i < 4; i++) {
    ce_trace_set_level(levels[i]);
    capture_begin();
    CE_TRACE_E("t", 0, 0, "e");
    CE_TRACE_W("t", 0, 0, "w");
    CE_TRACE_I("t", 0, 0, "i");
    CE_TRACE_D("t", 0, 0, "d");
    const char *s = capture_end();
    cr_expect_eq(count_lines(s), i + 1, "threshold %zu wrote:\n%s", i, s);
    cr_expect_eq(strstr(s, " debug ") != NULL, levels[i] == CE_TRACE_DEBUG);
    cr_expect_not_null(strstr(s, " error t -: e\n"));
  }
}

Test(trace, disabled_writes_and_evaluates_nothing) {
  ce_trace_set_level(CE_TRACE_ERROR);
  evaluated = 0;
  capture_begin();
  CE_TRACE_D("proxy", 'c', (uint64_t)side_effect(), "%d", side_effect());
  CE_TRACE_I("proxy", 'c', 1, "%d", side_effect());
  CE_TRACE_W("proxy", 'c', 1, "%d", side_effect());
  const char *s = capture_end();
  cr_expect_str_eq(s, "");
  cr_expect_eq(evaluated, 0);
  ce_trace_set_level(CE_TRACE_WARN);
  capture_begin();
  CE_TRACE_W("proxy", 'c', 1, "%d", side_effect());
  capture_end();
  cr_expect_eq(evaluated, 1);
}

Test(trace, configure_from_verbose_and_environment) {
  unsetenv(CE_TRACE_ENV);
  ce_trace_configure(true);
  cr_expect_eq(ce_trace_level(), CE_TRACE_DEBUG);
  setenv(CE_TRACE_ENV, "warn", 1);
  ce_trace_configure(true);
  cr_expect_eq(ce_trace_level(), CE_TRACE_WARN);
  setenv(CE_TRACE_ENV, "debug", 1);
  ce_trace_configure(false);
  cr_expect_eq(ce_trace_level(), CE_TRACE_DEBUG);

  setenv(CE_TRACE_ENV, "loud\n", 1);
  capture_begin();
  ce_trace_configure(false);
  const char *s = capture_end();
  cr_expect_eq(ce_trace_level(), CE_TRACE_INFO);
  cr_expect_not_null(strstr(s, " warn trace -: ignoring CONDUKT_EGRESS_TRACE=loud?: expected"), "%s", s);
  unsetenv(CE_TRACE_ENV);
}

Test(trace, parse_level) {
  ce_trace_level_t l = CE_TRACE_INFO;
  cr_expect_eq(ce_trace_parse_level("error", &l), 0);
  cr_expect_eq(l, CE_TRACE_ERROR);
  cr_expect_eq(ce_trace_parse_level("debug", &l), 0);
  cr_expect_eq(l, CE_TRACE_DEBUG);
  cr_expect_eq(ce_trace_parse_level("DEBUG", &l), CE_EINVAL);
  cr_expect_eq(ce_trace_parse_level("", &l), CE_EINVAL);
  cr_expect_eq(l, CE_TRACE_DEBUG);
}

Test(trace, control_bytes_and_long_lines) {
  ce_trace_set_level(CE_TRACE_INFO);
  capture_begin();
  CE_TRACE_I("proxy", 'c', 1, "sni %s", "evil\ncondukt-egress: forged\x1b[2J");
  char big[3 * CE_TRACE_LINE_MAX];
  memset(big, 'x', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  CE_TRACE_I("proxy", 'c', 1, "%s", big);
  const char *s = capture_end();
  cr_expect_eq(count_lines(s), 2, "%s", s);
  cr_expect_not_null(strstr(s, "sni evil?condukt-egress: forged?[2J\n"), "%s", s);
  const char *second = strchr(s, '\n') + 1;
  cr_expect_eq(strlen(second), CE_TRACE_LINE_MAX - 1);
  cr_expect_eq(second[CE_TRACE_LINE_MAX - 2], '\n');
}
