/*
 * bulk.h - same-host bulk transfers: the proc copies between one of its CPU
 * tensors and the controller's own memory with process_vm_readv/writev, at
 * the call's place in the proc's order (the __bulk_ built-ins, protocol.md
 * section 8). One copy and no socket; the controller falls back to
 * __tensor_put/__tensor_fetch where __bulk_probe says no.
 */
#ifndef MN_BULK_H
#define MN_BULK_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MN_BULK_PIECE (4u << 20)      /* bytes per process_vm_* call: cancel flag and peer proof checked between pieces */
#define MN_BULK_STRIPE_MIN (4u << 20) /* a copy gets one thread per this many bytes, up to the thread count */
#define MN_BULK_DEFAULT_THREADS 4     /* threads of one copy, at most the CPUs online (MONARCH_BULK_THREADS) */
#define MN_BULK_MAX_THREADS 16        /* most threads one copy uses, whatever MONARCH_BULK_THREADS says */

/*
 * The controller as a __bulk_ call names it: its pid, and the address of a
 * random cookie in its memory. A process that has `cookie` at cookie_addr is
 * that controller, on our kernel, and lets us copy its memory.
 */
typedef struct {
  pid_t pid;
  uint64_t cookie_addr;
  uint64_t cookie;
} mn_bulk_peer_t;

/*
 * 0 when peer proves itself (see mn_bulk_peer_t). Else with err: -errno of
 * process_vm_readv (EPERM: Yama's ptrace_scope or another user; ESRCH: no
 * such process, as from another host or PID namespace), or MN_EPEER for a
 * process that holds some other value there. MONARCH_BULK_LOCAL_SIMULATE=eperm
 * in the proc's environment makes it fail with -EPERM (tests of the fallback).
 */
int mn_bulk_check_peer(const mn_bulk_peer_t *peer, char *err, size_t errlen);

/*
 * Threads a copy of n bytes uses: MONARCH_BULK_THREADS, else the CPUs online
 * up to MN_BULK_DEFAULT_THREADS; at most MN_BULK_MAX_THREADS and one per
 * MN_BULK_STRIPE_MIN bytes; at least 1. One kernel copy runs at about half
 * of memcpy's speed, so a big one is striped over threads.
 */
int mn_bulk_threads(size_t n);

/*
 * Copies n bytes between local memory and peer's memory at remote: into
 * the peer when to_peer, else out of it, striped over mn_bulk_threads(n)
 * threads (the caller's among them). Each goes in MN_BULK_PIECE pieces,
 * proving the peer before each (its pid could be reused once it dies) and
 * stopping when *cancel is set (cancel may be NULL). 0, or with err (the
 * first failing stripe's):
 * MN_ECANCELED, mn_bulk_check_peer's code, -errno of the copy, or MN_EPEER
 * when a copy moved nothing.
 */
int mn_bulk_copy(const mn_bulk_peer_t *peer, int to_peer, char *local, uint64_t remote, size_t n, atomic_int *cancel,
                 char *err, size_t errlen);

/* Registers the __bulk_ built-ins; 0, or MN_ELIMIT (MN_MAX_BUILTIN_MODULES). */
int mn_bulk_register(void);

#endif
