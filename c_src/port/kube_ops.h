/*
 * The Kubernetes operations of the port (docs/port-protocol.md,
 * "Kubernetes"): kube_open, kube_close, kube_request, kube_exec,
 * kube_forward, kube_forward_close. Arguments are decoded here; the work
 * is c_src/kube/client.c's, on the port's loop, and the replies of
 * kube_request and kube_exec are sent when it completes.
 */
#ifndef CE_PORT_KUBE_OPS_H
#define CE_PORT_KUBE_OPS_H

#include <stdint.h>

#include "port/port.h"

void ce__op_kube_open(ce_port_t *p, const char *buf, int i, uint64_t id);
void ce__op_kube_close(ce_port_t *p, const char *buf, int i, uint64_t id);
void ce__op_kube_request(ce_port_t *p, const char *buf, int i, uint64_t id);
void ce__op_kube_exec(ce_port_t *p, const char *buf, int i, uint64_t id);
void ce__op_kube_forward(ce_port_t *p, const char *buf, int i, uint64_t id);
void ce__op_kube_forward_close(ce_port_t *p, const char *buf, int i, uint64_t id);

/* Closes every handle and listener (the port is stopping); pending
 * replies are dropped with the port's output. */
void ce__kube_stop(ce_port_t *p);
/* After the loop has ended: frees what ce__kube_stop() left. */
void ce__kube_free(ce_port_t *p);

#endif
