/* Debug traces and runtime log lines on stderr (see trace.h). */
#include "common/trace.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"

ce_trace_level_t ce__trace_threshold = CE_TRACE_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int ce_trace_parse_level(const char *name, ce_trace_level_t *out) {
  for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
    if (strcmp(name, level_names[i]) == 0) {
      *out = (ce_trace_level_t)i;
      return 0;
    }
  }
  return CE_EINVAL;
}

void ce_trace_set_level(ce_trace_level_t level) {
  if (level < CE_TRACE_ERROR)
    level = CE_TRACE_ERROR;
  if (level > CE_TRACE_DEBUG)
    level = CE_TRACE_DEBUG;
  ce__trace_threshold = level;
}

ce_trace_level_t ce_trace_level(void) { return ce__trace_threshold; }

void ce_trace_configure(bool verbose) {
  ce_trace_set_level(verbose ? CE_TRACE_DEBUG : CE_TRACE_INFO);
  const char *env = getenv(CE_TRACE_ENV);
  if (env == NULL || env[0] == '\0')
    return;
  ce_trace_level_t level;
  if (ce_trace_parse_level(env, &level) == 0)
    ce_trace_set_level(level);
  else
    CE_TRACE_W("trace", 0, 0, "ignoring %s=%.32s: expected error, warn, info or debug",
               CE_TRACE_ENV, env);
}

void ce__trace_write(ce_trace_level_t level, const char *subsys, char id_kind, uint64_t id,
                     const char *fmt, ...) {
  char line[CE_TRACE_LINE_MAX];
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  char idbuf[24] = "-";
  if (id_kind != 0)
    snprintf(idbuf, sizeof(idbuf), "%c-%08llx", id_kind, (unsigned long long)id);
  const char *lname = level >= CE_TRACE_ERROR && level <= CE_TRACE_DEBUG ? level_names[level] : "?";
  int n = snprintf(line, sizeof(line), "condukt-egress: %lld.%06ld %s %s %s: ", (long long)ts.tv_sec,
                   ts.tv_nsec / 1000, lname, subsys, idbuf);
  size_t len = n < 0 ? 0 : (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1;
  va_list ap;
  va_start(ap, fmt);
  n = vsnprintf(line + len, sizeof(line) - len, fmt, ap);
  va_end(ap);
  if (n > 0) {
    size_t end = len + ((size_t)n < sizeof(line) - len ? (size_t)n : sizeof(line) - len - 1);
    /* Messages may quote what a client sent (a server name, a header):
     * a control byte must not start a forged line or move the cursor. */
    for (size_t i = len; i < end; i++)
      if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
        line[i] = '?';
    len = end;
  }
  /* Room for the newline: a cut message loses its last byte to it. */
  if (len >= sizeof(line) - 1)
    len = sizeof(line) - 2;
  line[len++] = '\n';
  fwrite(line, 1, len, stderr);
}
