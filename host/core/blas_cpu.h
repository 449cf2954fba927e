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

#endif
