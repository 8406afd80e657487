/*
 * Debug traces and runtime log lines, on stderr only (STYLE.md: "Every
 * state change can be traced at debug level with the connection and stream
 * id ... and never to the port's stdout"; curl's CURL_TRC_CF is the model).
 *
 * One line per call, written with a single fwrite to the unbuffered
 * stderr so that concurrent writers to a pod log do not interleave inside
 * it:
 *
 *   condukt-egress: 1234.567890 debug proxy c-0000002a: [HEAD] -> EXCHANGE
 *                   ^ CLOCK_MONOTONIC seconds
 *                               ^ level ^ subsystem ^ id (or "-")
 *
 * Levels, most severe first: error, warn, info, debug. A line is written
 * when its level is at or above the configured threshold; the default is
 * info, `--verbose` (proxy) lowers it to debug, and the environment variable
 * CONDUKT_EGRESS_TRACE=error|warn|info|debug sets it outright (docs/tracing.md).
 *
 * The CE_TRACE* macros compare the level before evaluating any argument, so
 * a disabled trace costs one load and one compare.
 */
#ifndef CE_COMMON_TRACE_H
#define CE_COMMON_TRACE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
  CE_TRACE_ERROR = 0,
  CE_TRACE_WARN = 1,
  CE_TRACE_INFO = 2,
  CE_TRACE_DEBUG = 3,
} ce_trace_level_t;

/* The environment variable read by ce_trace_configure(). */
#define CE_TRACE_ENV "CONDUKT_EGRESS_TRACE"

/* Longest line written, newline included; longer messages are cut. */
#define CE_TRACE_LINE_MAX 1024

/* The threshold: lines at a level <= this are written. Read by the macros;
 * set it through the functions below. */
extern ce_trace_level_t ce__trace_threshold;

/* Sets the threshold from the program's options: debug when verbose, else
 * info; then CONDUKT_EGRESS_TRACE, when set to a level name, overrides
 * both. An unknown value is reported with a warn line and ignored. Call
 * once at start-up, before any thread that traces exists. */
void ce_trace_configure(bool verbose);

/* Sets the threshold directly (tests, and callers with their own flag). */
void ce_trace_set_level(ce_trace_level_t level);
ce_trace_level_t ce_trace_level(void);

/* "error", "warn", "info", "debug" (case-sensitive) into *out. Returns 0,
 * or CE_EINVAL with *out untouched. */
int ce_trace_parse_level(const char *name, ce_trace_level_t *out);

/* Writes one line. id_kind is a letter naming what id counts ('c' for a
 * connection, 'r' for a request, 'p' for a control peer), or 0 for a line
 * about no particular object ("-"). Use the macros, which skip the call
 * (and the evaluation of its arguments) when the level is disabled. */
void ce__trace_write(ce_trace_level_t level, const char *subsys, char id_kind, uint64_t id,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define CE_TRACE(level, subsys, id_kind, id, ...)                                   \
  do {                                                                              \
    if ((level) <= ce__trace_threshold)                                             \
      ce__trace_write((level), (subsys), (id_kind), (id), __VA_ARGS__);             \
  } while (0)

#define CE_TRACE_E(subsys, id_kind, id, ...) CE_TRACE(CE_TRACE_ERROR, subsys, id_kind, id, __VA_ARGS__)
#define CE_TRACE_W(subsys, id_kind, id, ...) CE_TRACE(CE_TRACE_WARN, subsys, id_kind, id, __VA_ARGS__)
#define CE_TRACE_I(subsys, id_kind, id, ...) CE_TRACE(CE_TRACE_INFO, subsys, id_kind, id, __VA_ARGS__)
#define CE_TRACE_D(subsys, id_kind, id, ...) CE_TRACE(CE_TRACE_DEBUG, subsys, id_kind, id, __VA_ARGS__)

#endif
