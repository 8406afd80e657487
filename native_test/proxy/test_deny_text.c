/* Tests for ce_conn_deny_text (c_src/proxy/conn.c): the 403 text of a
 * policy refusal, shared by the HTTP/1.1 and h2 paths. A decider's reason
 * may be as long as the control channel allows (CE_CONTROL_MAX_REASON)
 * and the workspace reads all of it, on either protocol. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "control/control.h"
#include "proxy/conn_internal.h"

_Static_assert(CE_CONN_DENY_REASON_MAX == CE_CONTROL_MAX_REASON, "one limit: the control channel's");

Test(deny_text, a_reason_at_the_control_channel_limit_is_kept_whole) {
  char reason[CE_CONTROL_MAX_REASON + 1], host[CE_HOST_TEXT_MAX + 1], text[CE_CONN_DENY_TEXT_MAX];
  for (size_t i = 0; i < CE_CONTROL_MAX_REASON; i++)
    reason[i] = (char)('a' + i % 26);
  reason[CE_CONTROL_MAX_REASON] = '\0';
  /* The longest host and "who" too: nothing is cut. */
  memset(host, 'h', CE_HOST_TEXT_MAX);
  host[CE_HOST_TEXT_MAX] = '\0';
  char who[CE_CONN_DENY_WHO_MAX];
  memset(who, 'w', sizeof(who) - 1);
  who[sizeof(who) - 1] = '\0';

  ce_conn_deny_text(text, sizeof(text), host, who, reason);
  char want[CE_CONN_DENY_TEXT_MAX + 64];
  snprintf(want, sizeof(want),
           "condukt: the network policy of this sandbox refused the request to %s\n"
           "refused by: %s\nreason: %s\n",
           host, who, reason);
  cr_assert_lt(strlen(want), sizeof(text), "the text buffer is too small for the longest refusal");
  cr_assert_str_eq(text, want);
}

Test(deny_text, bytes_outside_printable_ascii_become_question_marks) {
  char text[CE_CONN_DENY_TEXT_MAX];
  ce_conn_deny_text(text, sizeof(text), "evil.com", "the decider of rule 2", "no\r\nX-Injected: 1 \xc3\xa9");
  cr_assert_str_eq(text,
                   "condukt: the network policy of this sandbox refused the request to evil.com\n"
                   "refused by: the decider of rule 2\nreason: no??X-Injected: 1 ??\n");
}

Test(deny_text, a_longer_reason_is_cut_at_the_limit) {
  static char reason[2 * CE_CONTROL_MAX_REASON + 1];
  memset(reason, 'r', sizeof(reason) - 1);
  char text[CE_CONN_DENY_TEXT_MAX];
  ce_conn_deny_text(text, sizeof(text), "a.example", "rule 0 (deny)", reason);
  const char *r = strstr(text, "reason: ");
  cr_assert_not_null(r);
  cr_assert_eq(strlen(r + 8), CE_CONTROL_MAX_REASON + 1); /* the reason, then "\n" */
  cr_assert_eq(text[strlen(text) - 1], '\n');
}
