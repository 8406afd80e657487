/* Tests for c_src/port/port.c and c_src/port/ops.c: the real binary run
 * as the BEAM runs it (`condukt-egress port`, {packet, 4} on pipes),
 * checking each operation's answer and error path, malformed and
 * oversized packets, and the exit on stdin EOF. Replies are compared as
 * Erlang text (support/term.h). An alarm() bounds every test (Criterion's
 * .timeout leaks under LeakSanitizer; see test_control.c). */
#include <criterion/criterion.h>
#include <ei.h>
#include <fcntl.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "port/port.h"
#include "support/port_proc.h"
#include "support/term.h"

#define TEST_ALARM_S 60
#define WAIT_MS 10000

static ce_test_port_t pp;
static char dir[64];

static void setup(void) {
  alarm(TEST_ALARM_S);
  ei_init();
  strcpy(dir, "/tmp/ce_test_port_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  ce_test_port_start(&pp);
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", dir);
}

TestSuite(port, .init = setup, .fini = teardown);

/* Closes stdin and expects a clean exit 0 with nothing more on stdout. */
static void finish_clean(void) {
  size_t n = 0;
  char *extra = NULL;
  close(pp.in);
  pp.in = -1;
  extra = ce_test_port_recv_raw(&pp, WAIT_MS, &n);
  cr_assert_null(extra, "a packet after stdin EOF");
  int code = ce_test_port_finish(&pp, WAIT_MS);
  cr_assert_eq(code, 0, "exit status %d", code);
}

static char *path_in_dir(const char *name) {
  static char buf[4][128];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
  return buf[k];
}

/* Extracts the binary printed as <<"...">> after `key => ` (test use). */
static char *binary_after(const char *text, const char *key) {
  const char *p = strstr(text, key);
  cr_assert_not_null(p, "%s not in %s", key, text);
  p = strstr(p, "<<\"");
  cr_assert_not_null(p);
  p += 3;
  const char *e = strstr(p, "\">>");
  char *out = malloc((size_t)(e - p) + 1);
  size_t n = 0;
  for (; p < e; p++) {
    if (p[0] == '\\' && p[1] == 'n') {
      out[n++] = '\n';
      p++;
    } else {
      out[n++] = *p;
    }
  }
  out[n] = '\0';
  return out;
}

/* ---- version and token_new -------------------------------------------------- */

Test(port, version) {
  ce_test_port_expect(&pp, "{call, 1, {version}}",
                      "{reply,1,{ok,#{version => <<\"" CE_VERSION "\">>,protocol => 1}}}");
  ce_test_port_expect(&pp, "{call, 18446744073709551615, {version}}",
                      "{reply,18446744073709551615,{ok,#{version => <<\"" CE_VERSION
                      "\">>,protocol => 1}}}");
  ce_test_port_expect(&pp, "{call, 2, {version, extra}}",
                      "{reply,2,{error,{badarg,<<\"version takes 0 arguments: {version}\">>}}}");
  finish_clean();
}

Test(port, token_new) {
  char *a = NULL, *b = NULL;
  ce_test_port_send(&pp, "{call, 1, {token_new, 16}}");
  a = ce_test_port_recv(&pp, WAIT_MS);
  ce_test_port_send(&pp, "{call, 2, {token_new, 16}}");
  b = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert_not_null(a);
  cr_assert_not_null(b);
  cr_assert_eq(strlen(a), strlen("{reply,1,{ok,<<\"\">>}}") + 32, "%s", a);
  cr_assert_str_neq(a + 16, b + 16, "two tokens are equal");
  for (const char *c = strstr(a, "<<\"") + 3; *c != '"'; c++)
    cr_assert(strchr("0123456789abcdef", *c) != NULL, "%s is not lowercase hex", a);
  free(a);
  free(b);
  ce_test_port_send(&pp, "{call, 3, {token_new, 128}}");
  a = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert_eq(strlen(a), strlen("{reply,3,{ok,<<\"\">>}}") + 256, "%s", a);
  free(a);
  ce_test_port_expect(&pp, "{call, 4, {token_new, 15}}",
                      "{reply,4,{error,{inval,<<\"token_new: Bytes must be 16 to 128, not 15\">>}}}");
  ce_test_port_expect(&pp, "{call, 5, {token_new, 129}}",
                      "{reply,5,{error,{inval,<<\"token_new: Bytes must be 16 to 128, not 129\">>}}}");
  ce_test_port_expect(&pp, "{call, 6, {token_new, <<\"16\">>}}",
                      "{reply,6,{error,{badarg,<<\"token_new: Bytes must be an integer from 16 to "
                      "128\">>}}}");
  ce_test_port_expect(&pp, "{call, 7, {token_new}}",
                      "{reply,7,{error,{badarg,<<\"token_new takes 1 argument: {token_new, "
                      "Bytes}\">>}}}");
  finish_clean();
}

/* ---- ca_new ------------------------------------------------------------------- */

static X509 *parse_cert(const char *pem) {
  BIO *bio = BIO_new_mem_buf(pem, -1);
  X509 *x = PEM_read_bio_X509(bio, NULL, NULL, NULL);
  BIO_free(bio);
  cr_assert_not_null(x, "not a PEM certificate: %s", pem);
  return x;
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s", path);
  char *s = calloc(1, 65536);
  size_t n = fread(s, 1, 65535, f);
  s[n] = '\0';
  fclose(f);
  return s;
}

Test(port, ca_new_in_memory) {
  ce_test_port_send(&pp, "{call, 1, {ca_new, #{common_name => <<\"Test CA\">>, days => 2}}}");
  char *r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert_not_null(r);
  cr_assert(strncmp(r, "{reply,1,{ok,#{cert_pem => <<\"-----BEGIN CERTIFICATE-----", 56) == 0,
            "%s", r);
  char *cert = binary_after(r, "cert_pem");
  char *key = binary_after(r, "key_pem");
  cr_assert(strncmp(key, "-----BEGIN PRIVATE KEY-----", 27) == 0, "%s", key);
  X509 *x = parse_cert(cert);
  char cn[64];
  X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn));
  cr_assert_str_eq(cn, "Test CA");
  cr_assert_eq(X509_check_ca(x), 1);
  BIO *kb = BIO_new_mem_buf(key, -1);
  EVP_PKEY *pk = PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL);
  cr_assert_not_null(pk);
  cr_assert_eq(X509_check_private_key(x, pk), 1, "the key does not match the certificate");
  EVP_PKEY_free(pk);
  BIO_free(kb);
  X509_free(x);
  free(cert);
  free(key);
  free(r);
  finish_clean();
}

Test(port, ca_new_writes_files_once) {
  char req[512];
  snprintf(req, sizeof(req),
           "{call, 1, {ca_new, #{<<\"common_name\">> => <<\"Files\">>, days => 3650, "
           "cert_path => <<\"%s\">>, key_path => <<\"%s\">>}}}",
           path_in_dir("ca.pem"), path_in_dir("ca.key"));
  ce_test_port_send(&pp, req);
  char *r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert_not_null(r);
  char *cert = binary_after(r, "cert_pem");
  char *key = binary_after(r, "key_pem");
  char *cert_file = read_file(path_in_dir("ca.pem"));
  char *key_file = read_file(path_in_dir("ca.key"));
  cr_assert_str_eq(cert_file, cert);
  cr_assert_str_eq(key_file, key);
  struct stat st;
  cr_assert_eq(stat(path_in_dir("ca.key"), &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0600, "key mode %o", st.st_mode & 0777);
  free(cert);
  free(key);
  free(cert_file);
  free(key_file);
  free(r);

  /* Again: the key exists, nothing is overwritten. */
  ce_test_port_send(&pp, req);
  r = ce_test_port_recv(&pp, WAIT_MS);
  char expect[512];
  snprintf(expect, sizeof(expect),
           "{reply,1,{error,{io,<<\"ca_new: key_path: \\\"%s\\\" already exists; refusing to "
           "overwrite it\">>}}}",
           path_in_dir("ca.key"));
  cr_assert_str_eq(r, expect);
  free(r);

  /* A new key but an existing certificate: the key written is removed. */
  snprintf(req, sizeof(req),
           "{call, 2, {ca_new, #{common_name => <<\"Files\">>, days => 1, "
           "cert_path => <<\"%s\">>, key_path => <<\"%s\">>}}}",
           path_in_dir("ca.pem"), path_in_dir("other.key"));
  ce_test_port_send(&pp, req);
  r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert(strstr(r, "{reply,2,{error,{io,<<\"ca_new: cert_path: ") == r, "%s", r);
  free(r);
  cr_assert_neq(access(path_in_dir("other.key"), F_OK), 0, "the new key was left behind");

  /* A directory that does not exist. */
  snprintf(req, sizeof(req),
           "{call, 3, {ca_new, #{common_name => <<\"x\">>, days => 1, "
           "key_path => <<\"%s/no/such/dir/k\">>}}}", dir);
  ce_test_port_send(&pp, req);
  r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert(strstr(r, "No such file or directory") != NULL, "%s", r);
  cr_assert(strstr(r, "{reply,3,{error,{io,") == r, "%s", r);
  free(r);
  finish_clean();
}

Test(port, ca_new_refusals) {
  ce_test_port_expect(&pp, "{call, 1, {ca_new, #{days => 1}}}",
                      "{reply,1,{error,{badarg,<<\"ca_new: common_name is required\">>}}}");
  ce_test_port_expect(&pp, "{call, 2, {ca_new, #{common_name => <<\"x\">>}}}",
                      "{reply,2,{error,{badarg,<<\"ca_new: days is required\">>}}}");
  ce_test_port_expect(&pp, "{call, 3, {ca_new, #{common_name => <<\"x\">>, days => 0}}}",
                      "{reply,3,{error,{inval,<<\"ca_new: days must be 1 to 3650, not 0\">>}}}");
  ce_test_port_expect(&pp, "{call, 4, {ca_new, #{common_name => <<\"x\">>, days => 3651}}}",
                      "{reply,4,{error,{inval,<<\"ca_new: days must be 1 to 3650, not 3651\">>}}}");
  ce_test_port_expect(&pp, "{call, 5, {ca_new, #{common_name => <<\"x\">>, days => -1}}}",
                      "{reply,5,{error,{badarg,<<\"ca_new: days must be an integer from 1 to "
                      "3650\">>}}}");
  ce_test_port_expect(&pp, "{call, 6, {ca_new, #{common_name => <<\"x\">>, dayz => 1}}}",
                      "{reply,6,{error,{badarg,<<\"ca_new: unknown option \\\"dayz\\\" (expected "
                      "common_name, days, cert_path, key_path)\">>}}}");
  ce_test_port_expect(&pp, "{call, 7, {ca_new, #{common_name => <<>>, days => 1}}}",
                      "{reply,7,{error,{badarg,<<\"ca_new: common_name has the wrong length (1 "
                      "to 64 characters, no NUL)\">>}}}");
  ce_test_port_expect(&pp, "{call, 8, {ca_new, #{common_name => <<\"a\\nb\">>, days => 1}}}",
                      "{reply,8,{error,{inval,<<\"ca_new: common_name \\\"a\\\\x0ab\\\" must be 1 "
                      "to 64 printable UTF-8 characters\">>}}}");
  ce_test_port_expect(&pp,
                      "{call, 9, {ca_new, #{common_name => <<\"x\">>, days => 1, cert_path => "
                      "<<\"/tmp/same\">>, key_path => <<\"/tmp/same\">>}}}",
                      "{reply,9,{error,{inval,<<\"ca_new: cert_path and key_path name the same "
                      "file\">>}}}");
  ce_test_port_expect(&pp, "{call, 10, {ca_new, [{days, 1}]}}",
                      "{reply,10,{error,{badarg,<<\"ca_new: CaOpts must be a map\">>}}}");
  ce_test_port_expect(&pp, "{call, 11, {ca_new, #{1 => 2}}}",
                      "{reply,11,{error,{badarg,<<\"ca_new: CaOpts keys must be atoms or "
                      "binaries naming an option\">>}}}");
  ce_test_port_expect(&pp,
                      "{call, 12, {ca_new, #{common_name => <<\"x\">>, days => 1, key_path => "
                      "<<\"a\\x00b\">>}}}",
                      "{reply,12,{error,{badarg,<<\"ca_new: key_path contains a NUL byte (1 to "
                      "4000 bytes, no NUL)\">>}}}");
  finish_clean();
}

/* ---- policy_write ------------------------------------------------------------------ */

#define POLICY "{\"version\":1,\"default\":\"deny\",\"rules\":[{\"index\":0,\"kind\":\"allow\"," \
               "\"hosts\":[\"api.github.com\"]}]}"

Test(port, policy_write) {
  char req[1024];
  const char *path = path_in_dir("policy.json");
  /* An existing file is replaced, and the result is 0600 whatever it was. */
  int fd = open(path, O_WRONLY | O_CREAT, 0644);
  cr_assert(fd >= 0);
  cr_assert_eq(write(fd, "old", 3), 3);
  close(fd);
  snprintf(req, sizeof(req), "{call, 1, {policy_write, <<\"%s\">>, <<\"%s\">>}}", path,
           "{\\\"version\\\":1,\\\"default\\\":\\\"deny\\\",\\\"rules\\\":[{\\\"index\\\":0,"
           "\\\"kind\\\":\\\"allow\\\",\\\"hosts\\\":[\\\"api.github.com\\\"]}]}");
  ce_test_port_expect(&pp, req, "{reply,1,ok}");
  char *got = read_file(path);
  cr_assert_str_eq(got, POLICY);
  free(got);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0600, "mode %o", st.st_mode & 0777);
  cr_assert_neq(access(path_in_dir("policy.json.tmp"), F_OK), 0, "the .tmp file was left");

  /* Refused by the sidecar's loader: the file is untouched. */
  snprintf(req, sizeof(req),
           "{call, 2, {policy_write, <<\"%s\">>, <<\"{\\\"version\\\":1,\\\"default\\\":"
           "\\\"maybe\\\",\\\"rules\\\":[]}\">>}}",
           path);
  ce_test_port_send(&pp, req);
  char *r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert(strncmp(r, "{reply,2,{error,{inval,<<\"policy: $.default: ", 45) == 0, "%s", r);
  free(r);
  got = read_file(path);
  cr_assert_str_eq(got, POLICY);
  free(got);

  ce_test_port_expect(&pp, "{call, 3, {policy_write, <<\"/tmp/x\">>, <<\"not json\">>}}",
                      "{reply,3,{error,{inval,<<\"policy: invalid JSON at line 1, column 3: '[' "
                      "or '{' expected near 'not'\">>}}}");
  ce_test_port_expect(&pp, "{call, 4, {policy_write, \"/tmp/x\", <<\"{}\">>}}",
                      "{reply,4,{error,{badarg,<<\"policy_write: Path must be a binary (1 to "
                      "4000 bytes, no NUL)\">>}}}");
  ce_test_port_expect(&pp, "{call, 5, {policy_write, <<\"/tmp/x\">>, #{}}}",
                      "{reply,5,{error,{badarg,<<\"policy_write: Json must be a binary\">>}}}");
  snprintf(req, sizeof(req), "{call, 6, {policy_write, <<\"%s/no/dir/p.json\">>, <<\"%s\">>}}",
           dir,
           "{\\\"version\\\":1,\\\"default\\\":\\\"deny\\\",\\\"rules\\\":[]}");
  ce_test_port_send(&pp, req);
  r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert(strstr(r, "{reply,6,{error,{io,<<\"policy_write: cannot create \\\"") == r, "%s", r);
  free(r);
  /* The target is a directory: the rename fails and the .tmp is removed. */
  cr_assert_eq(mkdir(path_in_dir("adir"), 0700), 0);
  cr_assert_eq(mkdir(path_in_dir("adir/sub"), 0700), 0);
  snprintf(req, sizeof(req), "{call, 7, {policy_write, <<\"%s\">>, <<\"%s\">>}}",
           path_in_dir("adir"),
           "{\\\"version\\\":1,\\\"default\\\":\\\"deny\\\",\\\"rules\\\":[]}");
  ce_test_port_send(&pp, req);
  r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert(strstr(r, "{reply,7,{error,{io,<<\"policy_write: cannot rename") == r, "%s", r);
  free(r);
  cr_assert_neq(access(path_in_dir("adir.tmp"), F_OK), 0, "the .tmp file was left");
  finish_clean();
}

/* ---- framing and malformed packets -------------------------------------------------- */

Test(port, malformed_packets_never_stop_the_port) {
  const unsigned char not_a_term[] = {0, 0, 0, 3, 1, 2, 3};
  ce_test_port_write(&pp, not_a_term, sizeof(not_a_term));
  char *r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert_str_eq(r, "{error,badterm,<<\"not an external term (the first byte must be 131, not "
                      "1) at byte 0 of the packet\">>}");
  free(r);
  const unsigned char empty[] = {0, 0, 0, 0};
  ce_test_port_write(&pp, empty, sizeof(empty));
  r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert_str_eq(r, "{error,badterm,<<\"an empty packet\">>}");
  free(r);
  const unsigned char truncated[] = {0, 0, 0, 3, 131, 'h', 2};
  ce_test_port_write(&pp, truncated, sizeof(truncated));
  r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert_str_eq(r, "{error,badterm,<<\"a count of 2 elements is more than the packet holds at "
                      "byte 3 of the packet\">>}");
  free(r);
  ce_test_port_expect(&pp, "{hello}",
                      "{error,badarg,<<\"expected {call, Id, Op}, {ack, Chan, N} or {post, Chan, Tag, "
                      "Frame}\">>}");
  ce_test_port_expect(&pp, "{call, -3, {version}}",
                      "{error,badarg,<<\"call: Id must be an integer from 0 to 2^64-1\">>}");
  ce_test_port_expect(&pp, "{call, 4, version}",
                      "{reply,4,{error,{badarg,<<\"call: Op must be a tuple {Name, Arg...}\">>}}}");
  ce_test_port_expect(&pp, "{call, 5, {launch_missiles}}",
                      "{reply,5,{error,{badarg,<<\"unknown operation \\\"launch_missiles\\\"\">>}}}");
  /* Acks for channels that do not exist are ignored (no reply). */
  ce_test_port_send(&pp, "{ack, 99, 1}");
  ce_test_port_expect(&pp, "{ack, 0, 1}", "{error,badarg,<<\"ack: Chan must be a positive integer\">>}");
  ce_test_port_expect(&pp, "{call, 6, {version}}",
                      "{reply,6,{ok,#{version => <<\"" CE_VERSION "\">>,protocol => 1}}}");
  finish_clean();
}

Test(port, packets_split_and_joined) {
  ei_x_buff a, b;
  ce_test_term(&a, "{call, 1, {version}}");
  ce_test_term(&b, "{call, 2, {token_new, 200}}");
  char buf[256];
  size_t n = 0;
  buf[n++] = 0, buf[n++] = 0, buf[n++] = 0, buf[n++] = (char)a.index;
  memcpy(buf + n, a.buff, (size_t)a.index);
  n += (size_t)a.index;
  buf[n++] = 0, buf[n++] = 0, buf[n++] = 0, buf[n++] = (char)b.index;
  memcpy(buf + n, b.buff, (size_t)b.index);
  n += (size_t)b.index;
  /* Both in one write, then the same one byte at a time. */
  ce_test_port_write(&pp, buf, n);
  for (size_t k = 0; k < n; k++) {
    ce_test_port_write(&pp, buf + k, 1);
    poll(NULL, 0, 1);
  }
  for (int round = 0; round < 2; round++) {
    char *r = ce_test_port_recv(&pp, WAIT_MS);
    cr_assert(strncmp(r, "{reply,1,{ok,", 13) == 0, "%s", r);
    free(r);
    r = ce_test_port_recv(&pp, WAIT_MS);
    cr_assert(strncmp(r, "{reply,2,{error,{inval,", 23) == 0, "%s", r);
    free(r);
  }
  ei_x_free(&a);
  ei_x_free(&b);
  finish_clean();
}

Test(port, too_big_packets_are_skipped) {
  size_t len = CE_PORT_MAX_PACKET + 1;
  unsigned char h[4] = {(unsigned char)(len >> 24), (unsigned char)(len >> 16),
                        (unsigned char)(len >> 8), (unsigned char)len};
  ce_test_port_write(&pp, h, 4);
  char *r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert_str_eq(r, "{error,too_big,<<\"a packet of 16777217 bytes is over the limit of "
                      "16777216 bytes\">>}");
  free(r);
  /* Its bytes follow and are dropped; what comes after is a packet again.
   * The bytes look like a packet header, to show they are not parsed. */
  char *junk = malloc(len);
  memset(junk, 0, len);
  ce_test_port_write(&pp, junk, len);
  free(junk);
  ce_test_port_expect(&pp, "{call, 1, {version}}",
                      "{reply,1,{ok,#{version => <<\"" CE_VERSION "\">>,protocol => 1}}}");

  /* Exactly the limit is read and parsed: a 16 MiB policy reaches the
   * loader, which refuses it for its own 4 MiB limit. */
  ei_x_buff x;
  ei_x_new_with_version(&x);
  ei_x_encode_tuple_header(&x, 3);
  ei_x_encode_atom(&x, "call");
  ei_x_encode_ulong(&x, 2);
  ei_x_encode_tuple_header(&x, 3);
  ei_x_encode_atom(&x, "policy_write");
  ei_x_encode_binary(&x, "/tmp/never", 10);
  size_t room = CE_PORT_MAX_PACKET - (size_t)x.index - 5;
  char *big = malloc(room);
  memset(big, ' ', room);
  ei_x_encode_binary(&x, big, (int)room);
  free(big);
  cr_assert_eq((size_t)x.index, CE_PORT_MAX_PACKET);
  h[0] = (unsigned char)(x.index >> 24);
  h[1] = (unsigned char)(x.index >> 16);
  h[2] = (unsigned char)(x.index >> 8);
  h[3] = (unsigned char)x.index;
  ce_test_port_write(&pp, h, 4);
  ce_test_port_write(&pp, x.buff, (size_t)x.index);
  ei_x_free(&x);
  r = ce_test_port_recv(&pp, WAIT_MS);
  cr_assert(strncmp(r, "{reply,2,{error,{inval,<<\"policy: ", 34) == 0, "%s", r);
  free(r);
  finish_clean();
}

Test(port, stdin_eof_mid_packet_exits_0) {
  const unsigned char partial[] = {0, 0, 0, 100, 131};
  ce_test_port_write(&pp, partial, sizeof(partial));
  finish_clean();
}

/* ---- the command line --------------------------------------------------------------- */

static int run_port(const char *arg, bool stdin_devnull) {
  const char *bin = getenv("CONDUKT_EGRESS_BIN");
  char fallback[512];
  if (bin == NULL) {
    snprintf(fallback, sizeof(fallback), "%s/priv/condukt-egress", CE_SOURCE_ROOT);
    bin = fallback;
  }
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    int fds[2];
    if (pipe(fds) != 0)
      _exit(126);
    dup2(stdin_devnull ? null : fds[0], 0);
    dup2(fds[1], 1); /* a pipe nobody reads: only the exit matters */
    dup2(null, 2);
    if (arg != NULL)
      execl(bin, bin, "port", arg, (char *)NULL);
    else
      execl(bin, bin, "port", (char *)NULL);
    _exit(127);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status));
  return WEXITSTATUS(status);
}

Test(port, command_line) {
  cr_assert_eq(run_port("extra", false), 2);
  cr_assert_eq(run_port("--help", false), 0);
  cr_assert_eq(run_port(NULL, true), 2, "stdin that is not a pipe");
  finish_clean();
}

Test(port, stdout_closed_exits_1) {
  /* The BEAM's end of stdout is gone: the first reply fails and the
   * program stops with status 1 rather than spinning or dying of SIGPIPE. */
  close(pp.out);
  pp.out = -1;
  ce_test_port_send(&pp, "{call, 1, {version}}");
  /* stdin stays open: the port must stop on its own. */
  int status = 0;
  pid_t r = 0;
  for (int k = 0; k < WAIT_MS / 10 && r == 0; k++) {
    r = waitpid(pp.pid, &status, WNOHANG);
    if (r == 0)
      poll(NULL, 0, 10);
  }
  cr_assert_eq(r, pp.pid, "the port did not stop");
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %d", status);
  close(pp.in);
  unlink(pp.err_path);
}
