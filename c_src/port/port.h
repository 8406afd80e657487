/*
 * `condukt-egress port`: the BEAM's port program (docs/port-protocol.md;
 * the grammar heads port.c).
 *
 * One libuv loop, one thread: stdin carries {packet, 4} requests from the
 * BEAM, stdout carries replies and unsolicited control-channel messages,
 * stderr carries logs. This header is shared by the files of c_src/port/:
 * the program's state and the helpers that write packets.
 *
 * Ownership: the ce_port_t lives on ce_cmd_port()'s stack for the whole
 * run. It owns the stdin and stdout handles and the list of control
 * channels (channel.c); a packet handed to ce__port_send() is owned by
 * the stdout queue until written.
 */
#ifndef CE_PORT_PORT_H
#define CE_PORT_PORT_H

#include <ei.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* The largest packet either way (the 4-byte header excluded). Policies are
 * at most 4 MiB and frames 1 MiB; 16 MiB bounds what a broken peer can
 * make the port allocate. */
#define CE_PORT_MAX_PACKET (16u * 1024u * 1024u)
/* The version of the grammar in docs/port-protocol.md. */
#define CE_PORT_PROTOCOL 1
/* Room for one reply message: a sentence naming the bad input. */
#define CE_PORT_MSG_MAX 512
/* stdin is read in slices of this size. */
#define CE_PORT_READ_CHUNK (64u * 1024u)

/* Not an error.h code: the Code of a reply whose request term itself is
 * wrong, sent as the atom badarg. */
#define CE__PORT_BADARG 1

typedef struct ce__chan ce__chan_t;
struct ce_kube_client;

typedef enum { IN_HEADER, IN_BODY, IN_SKIP } ce__in_state_t;

typedef struct ce_port {
  uv_loop_t *loop;
  uv_pipe_t in;
  uv_pipe_t out;
  bool stopping;
  int exit_code;

  /* The {packet, 4} reader. */
  ce__in_state_t in_state;
  unsigned char header[4];
  size_t header_have;
  char *body;                  /* body_len + 1 bytes, NUL-terminated */
  size_t body_len;
  size_t body_have;
  uint64_t skip_left;          /* bytes of an oversized packet still to drop */
  char readbuf[CE_PORT_READ_CHUNK];

  /* Control channels (channel.c). */
  ce__chan_t *chans;
  uint64_t next_chan;

  /* The Kubernetes client (kube_ops.c, c_src/kube/), made at the first
   * kube_open. */
  struct ce_kube_client *kube;
  bool kube_stopped;

  /* Packets held by ce__port_hold() for one write (port.c). */
  unsigned hold;
  struct out_write *held_head, *held_tail;
  unsigned held_count;
} ce_port_t;

/* Queues the term in x (which must start with the version byte) as one
 * packet on stdout and takes x's buffer in every case (x is left empty).
 * A failure to queue stops the program with exit code 1. */
void ce__port_send(ce_port_t *p, ei_x_buff *x);

/* Between ce__port_hold() and the matching ce__port_release(), packets
 * given to ce__port_send() are held and then written together, in order,
 * in one write (at most CE__PORT_BATCH_MAX at a time): the frames of one
 * read from a sidecar wake the BEAM once, not once each. Holds nest. */
#define CE__PORT_BATCH_MAX 64
void ce__port_hold(ce_port_t *p);
void ce__port_release(ce_port_t *p);

/* Starts {reply, Id, _} in x (a new buffer with the version byte); the
 * caller appends the result and sends. Returns 0 or -1 (no memory; x is
 * then freed). */
int ce__port_reply_begin(ei_x_buff *x, uint64_t id);

/* Appends the Code of an error (CE__PORT_BADARG or a CE_E* value) as an
 * atom. Returns 0 or -1 (no memory). */
int ce__port_encode_code(ei_x_buff *x, int code);

/* Sends {reply, Id, ok}. */
void ce__port_reply_ok(ce_port_t *p, uint64_t id);

/* Sends {reply, Id, {error, {Code, Message}}}: code is a CE_E* value or
 * CE__PORT_BADARG; the message is formatted and cut to CE_PORT_MSG_MAX. */
void ce__port_reply_error(ce_port_t *p, uint64_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Stops the program: closes every channel (no message is sent for them),
 * stdin and stdout; ce_cmd_port() returns exit_code once the loop ends.
 * The first call's code wins. */
void ce__port_stop(ce_port_t *p, int exit_code);

#endif
