/*
 * The event text of one allowed request, measured alone (bench/PROFILE.md,
 * "Event text"): `make bench-events` builds and runs it.
 *
 * An allowed request costs the sidecar its response's header list as JSON
 * text (kept on the record) and two event lines, request_allowed and
 * request_closed, each carrying the record. This writes them N times, with
 * the proxy's own code, for a request as the benchmark's h2 load makes it
 * (GET /1k.bin, nginx's seven response fields), and prints the CPU time per
 * request. For scale, in the same run: the same request_closed event
 * built as a jansson object (json_pack) and dumped compact, as a
 * general-purpose JSON library writes it.
 *
 *   bench_events [N]
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "control/frame.h"
#include "proxy/event.h"
#include "proxy/options.h"

static const ce_h1_field_t request_fields[] = {
    {":authority", 10, "allowed.test", 12},
    {"user-agent", 10, "h2load nghttp2/1.52.0", 21},
    {"accept", 6, "*/*", 3},
};
static const ce_h1_field_t response_fields[] = {
    {"server", 6, "nginx/1.22.1", 12},
    {"date", 4, "Fri, 27 Nov 2026 17:10:00 GMT", 29},
    {"content-type", 12, "application/octet-stream", 24},
    {"content-length", 14, "1024", 4},
    {"last-modified", 13, "Fri, 27 Nov 2026 09:00:00 GMT", 29},
    {"etag", 4, "\"6746d0a0-400\"", 14},
    {"accept-ranges", 13, "bytes", 5},
};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static double cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void write_allowed(ce_jsonw_t *w, const void *r) { ce_event_write(w, "request_allowed", r, NULL); }
static void write_closed(ce_jsonw_t *w, const void *r) { ce_event_write(w, "request_closed", r, NULL); }

static json_t *fields_json(const ce_h1_field_t *f, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(a, json_pack("[s%s%]", f[i].name, f[i].name_len, f[i].value, f[i].value_len));
  return a;
}

/* The jansson way: the record as an object, dumped. */
static size_t jansson_event(const ce_reqinfo_t *r, uint64_t seq) {
  char at[40];
  ce_format_time(ce_now_us(), at, sizeof(at));
  json_t *o = json_pack("{s:s,s:I,s:s,s:s,s:s,s:s,s:s,s:s,s:i,s:s,s:n,s:s,s:s}", "type", "event", "seq",
                        (json_int_t)seq, "event", "request_closed", "at", at, "id", "123456", "connection_id",
                        "77", "scheme", r->scheme, "method", r->method, "port", (int)r->port, "path", r->path,
                        "query", "http_version", r->http_version, "sni", r->sni);
  json_object_set_new(o, "host", json_string(r->host));
  json_object_set_new(o, "headers", fields_json(request_fields, COUNT(request_fields)));
  json_object_set_new(o, "status", json_integer(r->status));
  json_object_set_new(o, "response_headers", fields_json(response_fields, COUNT(response_fields)));
  json_object_set_new(o, "bytes_in", json_integer((json_int_t)r->bytes_in));
  json_object_set_new(o, "bytes_out", json_integer((json_int_t)r->bytes_out));
  const int64_t times[] = {r->opened_at_us, r->responded_at_us, r->closed_at_us};
  const char *const names[] = {"opened_at", "responded_at", "closed_at"};
  for (size_t i = 0; i < 3; i++) {
    ce_format_time(times[i], at, sizeof(at));
    json_object_set_new(o, names[i], json_string(at));
  }
  json_object_set_new(o, "matched_rule", json_null());
  json_object_set_new(o, "reason", json_null());
  json_object_set_new(o, "stream_id", json_integer(r->stream_id));
  char *text = json_dumps(o, JSON_COMPACT);
  size_t len = text != NULL ? strlen(text) + 1 : 0;
  free(text);
  json_decref(o);
  return len;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 500000;
  if (n <= 0) {
    fprintf(stderr, "bench_events: N must be a positive count, got '%s'\n", argv[1]);
    return 2;
  }
  ce_proxy_options_t opts;
  memset(&opts, 0, sizeof(opts));
  ce_h1_head_t *hd = calloc(1, sizeof(*hd));
  if (hd == NULL)
    return 1;
  ce_reqinfo_t r;
  ce_reqinfo_init(&r, 123456, 77);
  r.scheme = "https";
  r.port = 443;
  r.stream_id = 13;
  r.matched_rule = 0;
  r.matched_kind = "allow";
  strcpy(r.host, "allowed.test");
  strcpy(r.sni, "allowed.test");
  hd->method = "GET";
  hd->method_len = 3;
  hd->path = "/1k.bin";
  hd->path_len = 7;
  hd->version_minor = 1; /* as the h2 server fills the head */
  memcpy(hd->fields, request_fields, sizeof(request_fields));
  hd->field_count = COUNT(request_fields);
  if (ce_reqinfo_set_request(&r, hd, &opts) != CE_OK)
    return 1;

  size_t bytes = 0;
  double t0 = cpu_ns();
  for (long i = 0; i < n; i++) {
    memset(hd, 0, sizeof(*hd));
    memcpy(hd->fields, response_fields, sizeof(response_fields));
    hd->field_count = COUNT(response_fields);
    hd->is_response = true;
    hd->status = 200;
    r.closed_at_us = ce_now_us();
    r.opened_at_us = r.closed_at_us - 300;
    r.responded_at_us = 0;
    if (ce_reqinfo_set_response(&r, hd, &opts) != CE_OK)
      return 1;
    r.bytes_in = 1100;
    ce__line_t *line = NULL;
    if (ce__line_encode_frame_with("event", "seq", (uint64_t)(2 * i), false, write_allowed, &r, &line) != CE_OK)
      return 1;
    bytes += line->len;
    ce__line_unref(line);
    if (ce__line_encode_frame_with("event", "seq", (uint64_t)(2 * i + 1), false, write_closed, &r, &line) !=
        CE_OK)
      return 1;
    bytes += line->len;
    ce__line_unref(line);
  }
  double ours = (cpu_ns() - t0) / (double)n;

  size_t jbytes = 0;
  t0 = cpu_ns();
  for (long i = 0; i < n; i++)
    jbytes += jansson_event(&r, (uint64_t)i);
  double jansson = (cpu_ns() - t0) / (double)n;

  printf("events of one allowed request (response header list + request_allowed + request_closed, %zu bytes): "
         "%.0f ns\n",
         bytes / (size_t)n, ours);
  printf("for scale: request_closed alone built with json_pack and dumped (%zu bytes): %.0f ns\n",
         jbytes / (size_t)n, jansson);
  ce_reqinfo_clear(&r);
  free(hd);
  return 0;
}
