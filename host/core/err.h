/*
 * err.h - the one error convention of the C code.
 *
 * A function that can fail returns 0 on success (or a non-negative value it
 * documents: a port, a count, an index) and a negative code on failure:
 * -errno from a system call, or one of the MN_E* codes below. Where the
 * caller needs more than the code, it passes an err buffer (char *err,
 * size_t errlen) that the function fills with a message naming what was
 * wrong; the buffer is untouched on success. mn_strerror() names any code.
 */
#ifndef MN_ERR_H
#define MN_ERR_H

enum {
  MN_OK = 0,
  MN_EAGAIN = -1001,      /* need more bytes */
  MN_EFRAME = -1002,      /* frame larger than MN_MAX_FRAME */
  MN_EMSGPACK = -1003,    /* body is not exactly one valid msgpack object */
  MN_ELIMIT = -1004,      /* depth, length or count limit crossed */
  MN_EPROTO = -1005,      /* valid msgpack, but not a message we know */
  MN_EAUTH = -1006,       /* authentication failed */
  MN_EVERSION = -1007,    /* protocol version mismatch */
  MN_ENOMEM = -1008,
  MN_ECLOSED = -1009,     /* peer closed the connection */
  MN_ETIMEDOUT = -1010,
  MN_EINVAL = -1011,      /* a bad argument or request; err says which */
  MN_ENOTFOUND = -1012,   /* no such tensor, group, kernel, library or proc */
  MN_EPEER = -1013,       /* a peer failed, gave up or disagreed; err names it */
  MN_ECANCELED = -1014,   /* the caller's cancel flag was set */
  MN_EKERNEL = -1015,     /* a kernel (or actor endpoint) reported an error of its own */
  MN_EDEVICE = -1016,     /* a CUDA or NCCL call failed, or the device reported an error; err has its text */
};

/* A message for any code: MN_E* names, strerror for -errno. */
const char *mn_strerror(int code);

#endif
