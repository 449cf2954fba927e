/*
 * bulk.h - same-host bulk transfers: the proc copies between one of its CPU
 * tensors and the controller's own memory at the call's place in the proc's
 * order (the __bulk_ built-ins, protocol.md section 8). A big HostTensor
 * lives in a memfd that the proc maps once (bulk_map.c) and copies with
 * plain stores; other memory it copies with process_vm_readv/writev. One
 * copy and no socket either way; the controller falls back to
 * __tensor_put/__tensor_fetch where __bulk_probe says no.
 */
#ifndef MN_BULK_H
#define MN_BULK_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MN_BULK_PIECE (4u << 20)      /* bytes a thread claims at a time: cancel flag (and peer proof) checked between pieces */
#define MN_BULK_STRIPE_MIN (4u << 20) /* a copy gets one thread per this many bytes, up to the thread count */
#define MN_BULK_DEFAULT_THREADS 4     /* threads of one process_vm copy, at most the CPUs online (MONARCH_BULK_THREADS) */
#define MN_BULK_MAX_THREADS 16        /* most threads one copy uses, whatever MONARCH_BULK_THREADS says */
#define MN_BULK_MAPS 8                /* controller regions a proc keeps mapped at most; the least recently used goes */
#define MN_BULK_SWEEP_MS 1000         /* an idle proc holding maps checks this often that the controller still has them */

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

/* What this proc's copies took, since it started (__bulk_stats). */
typedef struct {
  uint64_t mapped_bytes;  /* copied through a map of the controller's region */
  uint64_t vm_bytes;      /* copied by process_vm_readv/writev */
  uint64_t maps_made;     /* regions mapped (each costs its page tables once) */
  char why_unmapped[160]; /* why the last call that named a region could not map it ("" if none) */
} mn_bulk_stats_t;

/*
 * 0 when peer proves itself (see mn_bulk_peer_t). Else with err: -errno of
 * process_vm_readv (EPERM: Yama's ptrace_scope or another user; ESRCH: no
 * such process, as from another host or PID namespace), or MN_EPEER for a
 * process that holds some other value there. MONARCH_BULK_LOCAL_SIMULATE=eperm
 * in the proc's environment makes it fail with -EPERM (tests of the fallback).
 */
int mn_bulk_check_peer(const mn_bulk_peer_t *peer, char *err, size_t errlen);

/*
 * Threads a copy of n bytes uses: MONARCH_BULK_THREADS, else 1 for a copy
 * through a map (mapped) and the CPUs online up to MN_BULK_DEFAULT_THREADS
 * for one by process_vm; at most MN_BULK_MAX_THREADS and one per
 * MN_BULK_STRIPE_MIN bytes; at least 1. A mapped copy on one thread runs
 * at memcpy's speed; a second one gains on an idle machine but waits on
 * the slower of the two whenever another process takes a core. The
 * kernel's copy runs at half that speed per thread, so it needs them.
 */
int mn_bulk_threads(size_t n, int mapped);

/*
 * Copies n bytes between local memory and peer's memory at remote: into
 * the peer when to_peer, else out of it. `mapped`, when not NULL, is our
 * own map of those peer bytes (mn_bulk_map): copied with plain loads and
 * streaming stores. Else process_vm_readv/writev, proving the peer before
 * each piece (its pid could be reused once it dies). mn_bulk_threads(n, mapped)
 * threads (the caller's among them) take MN_BULK_PIECE pieces in turn, so
 * a thread the scheduler holds back delays one piece, not a fixed share;
 * they stop when *cancel is set (cancel may be NULL). 0, or with err:
 * MN_ECANCELED, mn_bulk_check_peer's code, -errno of the copy, or MN_EPEER
 * when a copy moved nothing.
 */
int mn_bulk_copy(const mn_bulk_peer_t *peer, int to_peer, char *local, uint64_t remote, char *mapped, size_t n,
                 atomic_int *cancel, char *err, size_t errlen);

/*
 * Our map of bytes off .. off+len of the memfd the controller holds as its
 * fd `fd` (a big HostTensor), into *at. The region is mapped whole on first
 * use (page tables filled at once) and kept for the next transfers: that
 * setup costs about half as much as the copy itself. The file is opened
 * through /proc/<pid>/fd, the peer proved afterwards (so the file was its),
 * and known by its inode, so a reused fd number never reaches an old map.
 * 0; 1 when there is no map to be had (the file cannot be opened, a failed
 * mmap: why in stats and err; the caller copies with process_vm); else
 * mn_bulk_check_peer's code, or MN_EINVAL for an fd that is no memfd or a
 * range outside it, with err. Maps belong to the one thread that runs
 * calls (and the tests' own).
 */
int mn_bulk_map(const mn_bulk_peer_t *peer, int fd, uint64_t off, size_t len, char **at, char *err, size_t errlen);

/*
 * Drops the maps whose region the controller no longer holds (it freed the
 * HostTensor, or exited); returns how many are left. mn_bulk_map drops
 * those of any other controller itself.
 */
int mn_bulk_sweep(void);

/* Maps held now. */
int mn_bulk_maps_held(void);

/* Unmaps every region (tests, and a proc that stops). */
void mn_bulk_unmap_all(void);

/* The counters of mn_bulk_stats_t. */
const mn_bulk_stats_t *mn_bulk_stats(void);
void mn__bulk_count(int mapped, size_t n);

/* Copies n bytes with streaming stores where the CPU has them, four pages side by side; else memcpy. */
void mn__bulk_copy_stream(char *dst, const char *src, size_t n);

/* Registers the __bulk_ built-ins; 0, or MN_ELIMIT (MN_MAX_BUILTIN_MODULES). */
int mn_bulk_register(void);

#endif
