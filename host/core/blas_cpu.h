/*
 * blas_cpu.h - the CPU's vector features, and the OpenBLAS core type they
 * call for. OpenBLAS picks its kernels by CPU model; on a model it does not
 * know (a cloud VM's generic "Intel Xeon Processor") it falls back to its
 * oldest ones ("Prescott"), at a sixth of the core's speed (issue 34). The
 * features themselves say what the core can run.
 */
#ifndef MN_BLAS_CPU_H
#define MN_BLAS_CPU_H

typedef struct {
  int x86;             /* 0: not an x86 CPU; nothing below is read */
  char vendor[13];     /* cpuid's vendor string: "GenuineIntel", "AuthenticAMD" */
  char brand[49];      /* cpuid's brand string: "AMD EPYC", "Intel(R) Xeon(R) Processor"; "" unknown */
  unsigned signature;  /* cpuid leaf 1's EAX: family, model and stepping */
  unsigned avx : 1, avx2 : 1, fma : 1;
  unsigned avx512f : 1, avx512bw : 1, avx512vl : 1, avx512dq : 1, avx512cd : 1, avx512_bf16 : 1;
} mn_cpu_features_t;

/*
 * Reads this CPU's features with cpuid. AVX and AVX-512 count only where
 * the OS saves their registers (XGETBV), as OpenBLAS itself requires.
 */
void mn_cpu_read(mn_cpu_features_t *f);
/*
 * Fills f from a /proc/cpuinfo "flags" line and a vendor string (recorded
 * CPUs, for tests).
 */
void mn_cpu_from_flags(mn_cpu_features_t *f, const char *vendor, const char *flags);
/*
 * The OpenBLAS core type (an OPENBLAS_CORETYPE value) for the features, or
 * NULL where nothing better than OpenBLAS's own choice is known.
 */
const char *mn_blas_pick(const mn_cpu_features_t *f);

#define MN_BLAS_MAX_CANDIDATES 4 /* core types tried beside OpenBLAS's own: each probe costs ~50 ms */

/*
 * The core types worth timing on this CPU, best guess first (mn_blas_pick),
 * then the others its features can run: AVX-512 F/BW/VL/DQ: SKYLAKEX,
 * COOPERLAKE (with AVX512_BF16), HASWELL; AVX2+FMA: HASWELL and ZEN (the same
 * kernels, other block sizes: ZEN measured 0.55-0.80x of HASWELL on an AMD
 * EPYC at the MLP's shapes), SANDYBRIDGE; AVX: SANDYBRIDGE. Fills out (room
 * for MN_BLAS_MAX_CANDIDATES) and returns how many; 0 for other CPUs.
 */
int mn_blas_candidates(const mn_cpu_features_t *f, const char **out);

/* One core type tried in a probe process (blas_choose.c). */
typedef struct {
  char name[24];  /* the OPENBLAS_CORETYPE value tried; "" for OpenBLAS's own choice */
  char core[32];  /* openblas_get_corename() in the probe, or "?" */
  int ok;         /* every shape's product matched the reference */
  double gflops;  /* the geometric mean over the probe's shapes, one core */
  char why[96];   /* when !ok: "killed by SIGILL", "32x10x128 nn differs from the reference", ... */
  int transient;  /* its failure says nothing lasting about the core type (no answer in time, no process) */
} mn_blas_trial_t;

/*
 * Which trial procs should run: t[0] is OpenBLAS's own choice, t[1..n-1]
 * the candidates. The fastest candidate that passed wins if it beats a
 * passing own choice by the factor gain (1.10: a margin over the probes'
 * noise, so a close call keeps OpenBLAS's default), or if the own choice
 * failed its check; otherwise 0.
 */
int mn_blas_decide(const mn_blas_trial_t *t, int n, double gain);

#endif
