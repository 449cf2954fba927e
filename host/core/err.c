/* err.c - names of the error codes (err.h). */
#include "err.h"

#include <string.h>

const char *mn_strerror(int code) {
  switch (code) {
  case MN_OK: return "ok";
  case MN_EAGAIN: return "need more data";
  case MN_EFRAME: return "frame too large";
  case MN_EMSGPACK: return "malformed msgpack";
  case MN_ELIMIT: return "limit exceeded";
  case MN_EPROTO: return "protocol error";
  case MN_EAUTH: return "authentication failed";
  case MN_EVERSION: return "protocol version mismatch";
  case MN_ENOMEM: return "out of memory";
  case MN_ECLOSED: return "connection closed";
  case MN_ETIMEDOUT: return "timed out";
  case MN_EINVAL: return "invalid argument";
  case MN_ENOTFOUND: return "not found";
  case MN_EPEER: return "a peer failed";
  case MN_ECANCELED: return "cancelled";
  case MN_EKERNEL: return "kernel error";
  case MN_EDEVICE: return "device error";
  default: return code < 0 && code > -1000 ? strerror(-code) : "unknown error";
  }
}
