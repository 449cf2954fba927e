/* sig.c - kernel signatures; see sig.h. */
#include "sig.h"

#include <stdio.h>

void mn_sig_parse(mn_sig_t *s, const char *sig) {
  int opt_from = -1;
  s->text = sig ? sig : "";
  s->max = 0;
  s->rest = 0;
  for (const char *p = s->text; *p && s->max < MN_MAX_ARGS; p++) {
    if (*p == '*') {
      s->rest = 1;
      break;
    }
    if (*p == '?') { /* the letter before '?' and every later one are optional */
      if (opt_from < 0 && s->max > 0) opt_from = s->max - 1;
      continue;
    }
    s->letters[s->max++] = *p;
  }
  s->min = opt_from >= 0 ? opt_from : s->max;
}

int mn_sig_check_count(const mn_sig_t *s, int n, char *err, size_t errlen) {
  if (n >= s->min && (s->rest || n <= s->max)) return 0;
  if (s->min == s->max)
    snprintf(err, errlen, "expected %d argument%s, got %d (signature \"%s\")", s->max, s->max == 1 ? "" : "s", n,
             s->text);
  else
    snprintf(err, errlen, "expected %d to %d arguments, got %d (signature \"%s\")", s->min, s->max, n, s->text);
  return MN_EINVAL;
}

const char *mn_sig_want_name(char letter) {
  switch (letter) {
  case 'n': return "number";
  case 'i': return "integer";
  case 's': return "string";
  case 'b': return "bytes";
  case 't': return "tensor";
  case 'B': return "boolean";
  case 'g': return "group";
  default: return "any value";
  }
}

int mn_sig_coerce(mk_arg_t *a, char want, int argn, const char *got, char *err, size_t errlen) {
  int ok = 1;
  switch (want) {
  case 'n':
    if (a->type == MK_ARG_INT) {
      a->type = MK_ARG_NUMBER;
      a->v.num = (double)a->v.i;
    }
    ok = a->type == MK_ARG_NUMBER;
    break;
  case 'i':
    /* Range check first: casting NaN or a huge double to int64 is undefined. */
    if (a->type == MK_ARG_NUMBER && a->v.num >= -9.2e18 && a->v.num <= 9.2e18 &&
        a->v.num == (double)(int64_t)a->v.num) {
      a->type = MK_ARG_INT;
      a->v.i = (int64_t)a->v.num;
    }
    ok = a->type == MK_ARG_INT;
    break;
  case 's': ok = a->type == MK_ARG_STRING; break;
  case 'b':
    if (a->type == MK_ARG_STRING) a->type = MK_ARG_BYTES;
    ok = a->type == MK_ARG_BYTES;
    break;
  case 't': ok = a->type == MK_ARG_TENSOR; break;
  case 'B': ok = a->type == MK_ARG_BOOL; break;
  case 'g': ok = a->type == MK_ARG_GROUP; break; /* exec.c binds groups; elsewhere (actors) none is held */
  default: break;
  }
  if (ok) return 0;
  snprintf(err, errlen, "argument %d: expected %s, got %s", argn, mn_sig_want_name(want), got);
  return MN_EINVAL;
}
