/*
 * The decide queue of the control channel (internal.h): asks in id order,
 * each with its own timer; every pending ask is sent to the peer when it
 * authenticates, and again to the next one after a drop. A failure is
 * delivered by a zero timer, never inside the call that asked.
 */
#include "control/internal.h"

#include <stdlib.h>

#include "common/error.h"

ask_t *ce__ctl_ask_find(ce_control_t *ctl, uint64_t id) {
  /* At most CE_CONTROL_MAX_PENDING_ASKS (plus a few failed ones waiting
   * for their callback) in id order: a scan is cheaper than any index at
   * this size, and it stops at the first larger id. */
  for (ask_t *a = ctl->asks_head; a != NULL && a->id <= id; a = a->next) {
    if (a->id == id)
      return a;
  }
  return NULL;
}

static void ask_closed_cb(uv_handle_t *h) {
  ask_t *a = h->data;
  ce_control_t *ctl = a->ctl;
  ce__line_unref(a->line);
  free(a);
  ce__ctl_handle_closed(ctl);
}

/* Takes the ask off the list and closes its timer; the ask is freed in the
 * timer's close callback. */
static void ask_forget(ask_t *a) {
  ce_control_t *ctl = a->ctl;
  if (a->prev != NULL)
    a->prev->next = a->next;
  else
    ctl->asks_head = a->next;
  if (a->next != NULL)
    a->next->prev = a->prev;
  else
    ctl->asks_tail = a->prev;
  a->prev = a->next = NULL;
  if (a->state == ASK_PENDING)
    ctl->pending--;
  a->state = ASK_DONE;
  uv_close((uv_handle_t *)&a->timer, ask_closed_cb);
}

void ce__ctl_ask_finish(ask_t *a, int status, bool allow, const char *reason,
                       bool cacheable) {
  ce_control_decision_cb cb = a->cb;
  void *data = a->data;
  ask_forget(a);
  if (status != CE_OK) {
    allow = false;
    reason = NULL;
    cacheable = false;
  }
  cb(data, status, allow, reason, cacheable);
}

static void ask_timer_cb(uv_timer_t *t) {
  ask_t *a = t->data;
  ce__ctl_ask_finish(a, a->state == ASK_FAILED ? a->status : CE_ETIMEDOUT, false, NULL,
                     false);
}

uint64_t ce_control_ask_with(ce_control_t *ctl, ce_control_write_fn write, const void *arg,
                             uint32_t timeout_ms, ce_control_decision_cb cb, void *data) {
  if (ctl->closing)
    return 0;
  ask_t *a = calloc(1, sizeof(*a));
  if (a == NULL)
    return 0;
  a->ctl = ctl;
  a->id = ++ctl->next_id;
  a->cb = cb;
  a->data = data;
  uv_timer_init(ctl->loop, &a->timer);
  a->timer.data = a;
  ctl->live_handles++;

  a->prev = ctl->asks_tail;
  if (ctl->asks_tail != NULL)
    ctl->asks_tail->next = a;
  else
    ctl->asks_head = a;
  ctl->asks_tail = a;

  int status = CE_OK;
  if (ctl->pending >= CE_CONTROL_MAX_PENDING_ASKS) {
    status = CE_EUNAVAIL;
  } else {
    status = ce__line_encode_frame_with("decision_request", "id", a->id, true, write, arg,
                                        &a->line);
    if (status == CE_ETOOBIG)
      status = CE_EINVAL;
  }

  if (status != CE_OK) {
    /* Failures are delivered by a zero timer, so the callback never runs
     * inside ce_control_ask, where the caller may not be ready for it. */
    a->state = ASK_FAILED;
    a->status = status;
    uv_timer_start(&a->timer, ask_timer_cb, 0, 0);
    return a->id;
  }
  a->state = ASK_PENDING;
  ctl->pending++;
  uv_timer_start(&a->timer, ask_timer_cb, timeout_ms, 0);
  /* After the events before it (its request's request_opened), in one
   * write. */
  if (ctl->peer != NULL)
    ce__ctl_flush_ring_then(ctl, a->line);
  return a->id;
}

uint64_t ce_control_ask(ce_control_t *ctl, json_t *request, uint32_t timeout_ms,
                        ce_control_decision_cb cb, void *data) {
  /* Anything but an object fails the ask with CE_EINVAL. */
  ce__json_fields_t f = {request, "id"};
  uint64_t id = ce_control_ask_with(ctl, ce__line_write_json_fields, &f, timeout_ms, cb, data);
  json_decref(request);
  return id;
}

void ce_control_cancel(ce_control_t *ctl, uint64_t id) {
  ask_t *a = ce__ctl_ask_find(ctl, id);
  if (a != NULL)
    ask_forget(a);
}
