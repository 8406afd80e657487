/* jansson's allocation failures, made visible (see json.h). */
#include "common/json.h"

#include <jansson.h>
#include <stdlib.h>

static _Thread_local bool oom;

static void *json_malloc_counted(size_t n) {
  void *p = malloc(n);
  if (p == NULL)
    oom = true;
  return p;
}

static void json_free_counted(void *p) { free(p); }

__attribute__((constructor)) static void json_install(void) {
  json_set_alloc_funcs(json_malloc_counted, json_free_counted);
}

void ce_json_oom_reset(void) { oom = false; }

bool ce_json_oom(void) { return oom; }
