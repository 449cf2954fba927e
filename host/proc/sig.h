/*
 * sig.h - kernel signatures (the letters of monarch_kernel.h), read the
 * same way for a CALL from the controller (exec.c) and for proc.call from
 * an actor (actor.c): how many arguments a kernel takes, and whether one
 * argument fits its letter. Converting the argument itself from msgpack or
 * from Lua stays with the caller; the rules and the error texts live here.
 */
#ifndef MN_SIG_H
#define MN_SIG_H

#include "monarch_kernel.h"
#include "wire.h"

#include <stddef.h>

typedef struct {
  const char *text;           /* the signature as written (never NULL), for messages */
  char letters[MN_MAX_ARGS];  /* one per positional argument */
  int max;                    /* positional arguments */
  int min;                    /* arguments that must be given */
  int rest;                   /* a trailing '*': any number of further arguments */
} mn_sig_t;

/*
 * Reads a signature (NULL reads as ""). The reading is the proc's long-standing
 * lenient one, which never fails: an unknown letter accepts any value, a '?'
 * with no letter before it is ignored, and letters past MN_MAX_ARGS or after
 * '*' are ignored.
 */
void mn_sig_parse(mn_sig_t *s, const char *sig);

/* Checks an argument count against s. Returns 0, or MN_EINVAL with err saying what
 * was expected ("expected 2 arguments, got 3 (signature \"nn\")"). */
int mn_sig_check_count(const mn_sig_t *s, int n, char *err, size_t errlen);

/* The letter of argument i (0-based); 'a' for one the '*' accepts. */
static inline char mn_sig_letter(const mn_sig_t *s, int i) { return i < s->max ? s->letters[i] : 'a'; }

/* What a letter asks for, as error messages say it ("integer"; "any value" for an unknown letter). */
const char *mn_sig_want_name(char letter);

/*
 * Makes argument a (already converted from its wire or Lua form) what letter
 * `want` asks for: an integer where a number is wanted becomes a number, an
 * integral number where an integer is wanted becomes an integer, a string
 * where bytes are wanted becomes bytes. Returns 0, or MN_EINVAL with err naming the
 * argument (argn is 1-based) and `got`, the name of what was passed.
 */
int mn_sig_coerce(mk_arg_t *a, char want, int argn, const char *got, char *err, size_t errlen);

#endif
