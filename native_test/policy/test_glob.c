/* Tests for c_src/policy/glob.c: the '*' / '**' semantics of
 * docs/host-matching.md §3 and inputs that would make a backtracking
 * matcher explode. */
#include <criterion/criterion.h>
#include <string.h>

#include "policy/glob.h"
#include "policy/host.h"

static bool m(const char *pat, const char *name) {
  return ce_glob_match(pat, strlen(pat), name, strlen(name));
}

Test(glob, spec_examples) {
  cr_expect(m("*.example.com", "a.example.com"));
  cr_expect(!m("*.example.com", "example.com"));
  cr_expect(!m("*.example.com", "a.b.example.com"));
  cr_expect(m("**.example.com", "a.example.com"));
  cr_expect(m("**.example.com", "a.b.example.com"));
  cr_expect(!m("**.example.com", "example.com"));
  cr_expect(m("api*.example.com", "api-eu.example.com"));
  cr_expect(!m("api*.example.com", "api.example.com"));
}

Test(glob, star_is_one_or_more_non_dot_bytes) {
  cr_expect(m("*", "a"));
  cr_expect(m("*", "abc"));
  cr_expect(!m("*", ""));
  cr_expect(!m("*", "a.b"));
  cr_expect(!m("*", "."));
  cr_expect(m("a*c", "abc"));
  cr_expect(m("a*c", "abbbc"));
  cr_expect(!m("a*c", "ac"));
  cr_expect(!m("a*c", "a.c"));
  cr_expect(m("*.*", "a.b"));
  cr_expect(!m("*.*", "a.b.c"));
  cr_expect(m("*-*.x", "a-b.x"));
  cr_expect(m("*-*.x", "a-b-c.x"));
  cr_expect(!m("*-*.x", "-b.x"));
  cr_expect(m("x*", "xy"));
  cr_expect(!m("x*", "x"));
  cr_expect(!m("x*", "x."));
}

Test(glob, double_star_crosses_labels) {
  cr_expect(m("**", "a"));
  cr_expect(m("**", "a.b.c"));
  cr_expect(m("**", "."));
  cr_expect(!m("**", ""));
  cr_expect(m("a**b", "a.b"));
  cr_expect(m("a**b", "axxb"));
  cr_expect(!m("a**b", "ab"));
  cr_expect(m("**.com", "x.y.z.com"));
  cr_expect(m("**com", "x.com"));
  cr_expect(!m("**.com", ".com"));
  cr_expect(m("*.**", "a.b"));
  cr_expect(m("*.**", "a.b.c"));
  cr_expect(!m("*.**", "a"));
  cr_expect(m("**.**", "a.b"));
  cr_expect(!m("**.**", "ab"));
}

Test(glob, literals_need_exact_bytes) {
  cr_expect(m("example.com", "example.com"));
  cr_expect(!m("example.com", "example.co"));
  cr_expect(!m("example.com", "example.comx"));
  cr_expect(!m("example.com", "Example.com"), "matching is on normalised text");
  cr_expect(m("", ""));
  cr_expect(!m("", "a"));
  cr_expect(!m("a", ""));
}

Test(glob, literal_head_and_tail_cannot_overlap) {
  cr_expect(!m("a*a", "a"));
  cr_expect(!m("a*a", "aa"));
  cr_expect(m("a*a", "aba"));
  cr_expect(!m("ab*ba", "aba"));
  cr_expect(!m("ab*ba", "abba"));
  cr_expect(m("ab*ba", "abxba"));
  cr_expect(m("*a*", "bab"));
  cr_expect(!m("*a*", "ba"));
  cr_expect(m("x.*.y", "x.q.y"));
  cr_expect(!m("x.*.y", "x..y"));
  cr_expect(!m("x.*.y", "x.q.z"));
}

Test(glob, reads_only_the_given_spans) {
  cr_expect(ce_glob_match("*.comXXX", 5, "a.com", 5));
  cr_expect(ce_glob_match("*.com", 5, "a.comYYY", 5));
  cr_expect(!ce_glob_match("*.com", 5, "a.comYYY", 6));
}

Test(glob, over_long_inputs_never_match) {
  char name[CE_HOST_NAME_MAX + 2];
  memset(name, 'a', sizeof(name));
  cr_expect(ce_glob_match("**", 2, name, CE_HOST_NAME_MAX));
  cr_expect(!ce_glob_match("**", 2, name, CE_HOST_NAME_MAX + 1));
  cr_expect(!ce_glob_match(name, CE_HOST_NAME_MAX + 1, name, 1));
}

/* The classic exponential cases: a pattern of many stars against a name
 * that almost matches. A backtracking matcher takes ages here; the DP
 * finishes in |p| * |n| steps. Correctness only; no timing assertions. */
Test(glob, adversarial_many_stars, .timeout = 20) {
  char pat[CE_HOST_NAME_MAX + 1];
  char name[CE_HOST_NAME_MAX + 1];

  /* "*a*a*a...*a*b" against "aaaa...a" (no b): no match. */
  size_t p = 0;
  while (p + 3 <= 200) {
    pat[p++] = '*';
    pat[p++] = 'a';
  }
  pat[p++] = 'b';
  memset(name, 'a', CE_HOST_NAME_MAX);
  for (int round = 0; round < 2000; round++)
    cr_assert(!ce_glob_match(pat, p, name, CE_HOST_NAME_MAX));
  /* ...and with the b at the end of the name it matches. */
  name[CE_HOST_NAME_MAX - 1] = 'b';
  cr_assert(ce_glob_match(pat, p, name, CE_HOST_NAME_MAX));

  /* "**a**a**a...**b" against "a.a.a.a..." without b. */
  p = 0;
  while (p + 4 <= 240) {
    pat[p++] = '*';
    pat[p++] = '*';
    pat[p++] = 'a';
  }
  pat[p++] = 'b';
  for (size_t i = 0; i < CE_HOST_NAME_MAX; i++)
    name[i] = i % 2 ? '.' : 'a';
  for (int round = 0; round < 2000; round++)
    cr_assert(!ce_glob_match(pat, p, name, CE_HOST_NAME_MAX));

  /* Many single stars separated by dots against a deep name. */
  p = 0;
  while (p + 2 <= CE_HOST_NAME_MAX) {
    pat[p++] = '*';
    pat[p++] = '.';
  }
  pat[p++] = '*';
  for (size_t i = 0; i < CE_HOST_NAME_MAX; i++)
    name[i] = i % 2 ? '.' : 'x';
  /* 127 labels in the name and 127 stars in the pattern. */
  cr_assert(ce_glob_match(pat, p, name, CE_HOST_NAME_MAX));
  cr_assert(!ce_glob_match(pat, p - 2, name, CE_HOST_NAME_MAX));
}
