/*
 * repl_lua.c - line editing for the REPL: the `monarch.lineedit` module.
 *
 * A thin binding of libedit (BSD editline): a prompt, a history file, and
 * Tab completion through a Lua function. While it waits for a key it keeps
 * the controller's loop turning by calling an idle Lua function every
 * MN_LE_IDLE_MS, so heartbeats flow and failures are noticed while the user
 * thinks. A Ctrl-C (see core.catch_interrupts) abandons the line being typed.
 *
 * libedit is loaded when the first editor is made (dlopen), not linked:
 * this file is part of monarch-run and of the core.so Lua module alike, and
 * neither then needs it to start. Where it is missing (or with
 * MONARCH_NO_LIBEDIT=1) lines are read plainly: the terminal's own line
 * editing, no history, no completion.
 *
 *   local ed = require("monarch.lineedit").new(history_path_or_nil)
 *   ed:set_completer(function(word) return insert, listing end)
 *   ed:readline(prompt, idle) -> line | nil (end of input) | false (Ctrl-C)
 *   ed:add_history(line); ed:close()
 */
#include "wire.h"

#include <dlfcn.h>
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wchar.h>

#if defined(__has_include)
#if __has_include(<histedit.h>)
#include <histedit.h>
#define MN_HAVE_LIBEDIT 1
#endif
#endif

#define MN_LE_IDLE_MS 50        /* longest wait for a key before the idle function runs again */
#define MN_LE_HISTORY 1000      /* lines kept in the history file */
#define MN_LE_MAX_PROMPT 256    /* longest prompt, bytes */
#define MN_LE_MAX_PATH 4096     /* longest history file path */
#define MN_LE_EDITOR "monarch.lineedit.editor" /* registry name of the metatable */

int mn_lua_interrupted(int clear); /* core_lua.c: Ctrl-C since last cleared */

typedef struct {
#ifdef MN_HAVE_LIBEDIT
  EditLine *el;    /* NULL: plain reading */
  History *hist;
#endif
  char history_path[MN_LE_MAX_PATH];
  char prompt[MN_LE_MAX_PROMPT];
  lua_State *L;    /* the state inside readline, for the callbacks; NULL outside */
  int idle_ref;    /* registry refs of the Lua callbacks, or LUA_NOREF */
  int complete_ref;
  int interrupted; /* the line ended with Ctrl-C */
  int closed;
  mbstate_t mb;
} editor_t;

static editor_t *check_editor(lua_State *L) {
  editor_t *ed = luaL_checkudata(L, 1, MN_LE_EDITOR);
  if (ed->closed) luaL_error(L, "line editor is closed");
  return ed;
}

static void redisplay(editor_t *ed);

/*
 * Runs the idle function; an error in it is reported, never thrown through
 * libedit. When it says it printed something, the line being typed is shown
 * again below that.
 */
static void run_idle(editor_t *ed) {
  lua_State *L = ed->L;
  if (L == NULL || ed->idle_ref == LUA_NOREF) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, ed->idle_ref);
  if (lua_pcall(L, 0, 1, 0) != 0) {
    fprintf(stderr, "monarch: REPL idle handler failed: %s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
    return;
  }
  int printed = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (printed) redisplay(ed);
}

/*
 * Waits until stdin is readable: 0, or MN_ECANCELED after a Ctrl-C, or
 * -errno from poll. Runs the idle function meanwhile.
 */
static int wait_key(editor_t *ed) {
  for (;;) {
    if (mn_lua_interrupted(1)) {
      ed->interrupted = 1;
      return MN_ECANCELED;
    }
    struct pollfd p = {STDIN_FILENO, POLLIN, 0};
    int r = poll(&p, 1, MN_LE_IDLE_MS);
    int e = errno;
    if (r > 0) return 0;
    if (r == 0) run_idle(ed);
    else if (e != EINTR) return -e;
  }
}

/* Reads one byte of input: the count read (1, or 0 at end of input), or wait_key's code (error or Ctrl-C). */
static int read_byte(editor_t *ed, char *c) {
  for (;;) {
    int w = wait_key(ed);
    if (w < 0) return w;
    ssize_t n = read(STDIN_FILENO, c, 1);
    if (n == 1) return 1;
    if (n == 0 || (errno != EINTR && errno != EAGAIN)) return 0; /* a hung-up terminal ends the input */
  }
}

#ifdef MN_HAVE_LIBEDIT
/* The libedit functions used, found by dlsym. */
static struct {
  EditLine *(*el_init)(const char *, FILE *, FILE *, FILE *);
  void (*el_end)(EditLine *);
  int (*el_set)(EditLine *, int, ...);
  int (*el_wset)(EditLine *, int, ...);
  int (*el_get)(EditLine *, int, ...);
  const char *(*el_gets)(EditLine *, int *);
  const LineInfo *(*el_line)(EditLine *);
  int (*el_insertstr)(EditLine *, const char *);
  int (*el_source)(EditLine *, const char *);
  History *(*history_init)(void);
  void (*history_end)(History *);
  int (*history)(History *, HistEvent *, int, ...);
} le;
static int le_loaded; /* 1 loaded, -1 unavailable, 0 not tried */

/* Loads libedit once; 0, or MN_ENOTFOUND when it is not installed (or MONARCH_NO_LIBEDIT=1). */
static int load_libedit(void) {
  static const char *const names[] = {"el_init", "el_end", "el_set", "el_wset", "el_get", "el_gets", "el_line",
                                      "el_insertstr", "el_source", "history_init", "history_end", "history"};
  void **slots[] = {(void **)&le.el_init, (void **)&le.el_end, (void **)&le.el_set, (void **)&le.el_wset,
                    (void **)&le.el_get, (void **)&le.el_gets, (void **)&le.el_line, (void **)&le.el_insertstr,
                    (void **)&le.el_source, (void **)&le.history_init, (void **)&le.history_end,
                    (void **)&le.history};
  if (le_loaded != 0) return le_loaded > 0 ? 0 : MN_ENOTFOUND;
  le_loaded = -1;
  const char *off = getenv("MONARCH_NO_LIBEDIT");
  if (off != NULL && strcmp(off, "1") == 0) return MN_ENOTFOUND;
  void *h = dlopen("libedit.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) h = dlopen("libedit.so", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return MN_ENOTFOUND;
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if ((*slots[i] = dlsym(h, names[i])) == NULL) return MN_ENOTFOUND; /* h stays open: harmless, and rare */
  le_loaded = 1;
  return 0;
}

static editor_t *editor_of(EditLine *el) {
  editor_t *ed = NULL;
  if (le.el_get(el, EL_CLIENTDATA, &ed) != 0) return NULL;
  return ed;
}

static const char *prompt_cb(EditLine *el) {
  editor_t *ed = editor_of(el);
  return ed ? ed->prompt : "> ";
}

/* libedit's character source: one wide character decoded from stdin's bytes.
 * libedit's convention: 1 for a character, 0 at end of input, -1 on error. */
static int getc_cb(EditLine *el, wchar_t *wc) {
  editor_t *ed = editor_of(el);
  char c;
  for (;;) {
    int r = read_byte(ed, &c);
    if (r < 0) return -1;
    if (r == 0) return 0;
    size_t k = mbrtowc(wc, &c, 1, &ed->mb);
    if (k == (size_t)-2) continue; /* the middle of a multibyte character */
    if (k == (size_t)-1) {
      memset(&ed->mb, 0, sizeof(ed->mb));
      *wc = (unsigned char)c; /* not valid in this locale: pass the byte on */
    }
    return 1;
  }
}

static int word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == ':';
}

/*
 * Tab: asks the completer about the word before the cursor. It returns the
 * text to insert and, when the choice is open, a listing to show under the
 * line.
 */
static unsigned char complete_cb(EditLine *el, int ch) {
  editor_t *ed = editor_of(el);
  const LineInfo *li = le.el_line(el);
  if (ed == NULL || ed->L == NULL || ed->complete_ref == LUA_NOREF || li == NULL) return CC_REFRESH_BEEP;
  lua_State *L = ed->L;
  const char *start = li->cursor;
  while (start > li->buffer && word_char(start[-1])) start--;
  lua_rawgeti(L, LUA_REGISTRYINDEX, ed->complete_ref);
  lua_pushlstring(L, start, (size_t)(li->cursor - start));
  if (lua_pcall(L, 1, 2, 0) != 0) {
    fprintf(stderr, "\nmonarch: completion failed: %s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
    return CC_REDISPLAY;
  }
  const char *insert = lua_tostring(L, -2), *listing = lua_tostring(L, -1);
  int inserted = insert != NULL && insert[0] != '\0' && le.el_insertstr(el, insert) == 0;
  unsigned char rc = inserted ? CC_REFRESH : CC_REFRESH_BEEP;
  if (listing != NULL && listing[0] != '\0') {
    fprintf(stdout, "\n%s\n", listing);
    fflush(stdout);
    rc = CC_REDISPLAY;
  }
  lua_pop(L, 2);
  return rc;
}

static void redisplay(editor_t *ed) {
  if (ed->el != NULL && isatty(STDIN_FILENO)) le.el_set(ed->el, EL_REFRESH);
}

/* Sets up line editing for ed; 0, or load_libedit's MN_ENOTFOUND, or MN_ENOMEM. */
static int open_libedit(editor_t *ed) {
  HistEvent ev;
  int rc = load_libedit();
  if (rc != 0) return rc;
  ed->el = le.el_init("monarch", stdin, stdout, stderr);
  ed->hist = le.history_init();
  if (ed->el == NULL || ed->hist == NULL) return MN_ENOMEM;
  le.history(ed->hist, &ev, H_SETSIZE, MN_LE_HISTORY);
  le.history(ed->hist, &ev, H_SETUNIQUE, 1);
  if (ed->history_path[0] != '\0' && le.history(ed->hist, &ev, H_LOAD, ed->history_path) < 0) {
    /* No history yet (first run): it is created on the first line. */
  }
  le.el_set(ed->el, EL_CLIENTDATA, ed);
  le.el_set(ed->el, EL_EDITOR, "emacs");
  le.el_set(ed->el, EL_PROMPT, prompt_cb);
  le.el_set(ed->el, EL_HIST, le.history, ed->hist);
  le.el_set(ed->el, EL_GETCFN, getc_cb);
  /* The wide form: libedit keeps these pointers (the narrow one copies them and never frees the copies). */
  le.el_wset(ed->el, EL_ADDFN, L"monarch-complete", L"complete a Lua or monarch name", complete_cb);
  le.el_set(ed->el, EL_BIND, "^I", "monarch-complete", NULL);
  if (le.el_source(ed->el, NULL) != 0) {
    /* No ~/.editrc: the defaults above stand. */
  }
  return 0;
}

#else
static void redisplay(editor_t *ed) {}
#endif

/*
 * Reads a line without libedit into b (no newline): the count of lines read
 * (1, or 0 at end of input), or a negative code: read_byte's (MN_ECANCELED
 * on Ctrl-C) or MN_ENOMEM.
 */
static int read_plain(editor_t *ed, mn_buf_t *b) {
  if (isatty(STDIN_FILENO)) {
    fputs(ed->prompt, stdout);
    fflush(stdout);
  }
  for (;;) {
    char c;
    int r = read_byte(ed, &c);
    if (r < 0) return r;
    if (r == 0) return b->len > 0 ? 1 : 0;
    if (c == '\n') return 1;
    if (mn_buf_append(b, &c, 1) != 0) return MN_ENOMEM;
  }
}

/* lineedit.new([history_path]) -> editor */
static int l_new(lua_State *L) {
  const char *path = luaL_optstring(L, 1, NULL);
  if (path != NULL && strlen(path) >= MN_LE_MAX_PATH) return luaL_argerror(L, 1, "history path too long");
  editor_t *ed = lua_newuserdata(L, sizeof(*ed));
  memset(ed, 0, sizeof(*ed));
  ed->idle_ref = ed->complete_ref = LUA_NOREF;
  if (path != NULL) snprintf(ed->history_path, sizeof(ed->history_path), "%s", path);
  luaL_getmetatable(L, MN_LE_EDITOR);
  lua_setmetatable(L, -2);
#ifdef MN_HAVE_LIBEDIT
  if (open_libedit(ed) != 0) {
    if (ed->el) le.el_end(ed->el);
    if (ed->hist) le.history_end(ed->hist);
    ed->el = NULL;
    ed->hist = NULL;
  }
#endif
  return 1;
}

/* ed:readline(prompt, idle) -> line | nil at end of input | false after Ctrl-C */
static int l_readline(lua_State *L) {
  editor_t *ed = check_editor(L);
  const char *prompt = luaL_optstring(L, 2, "> ");
  if (!lua_isnoneornil(L, 3)) luaL_checktype(L, 3, LUA_TFUNCTION);
  if (ed->L != NULL) return luaL_error(L, "readline is already running");
  snprintf(ed->prompt, sizeof(ed->prompt), "%s", prompt);
  lua_pushvalue(L, 3);
  ed->idle_ref = lua_isnil(L, -1) ? (lua_pop(L, 1), LUA_NOREF) : luaL_ref(L, LUA_REGISTRYINDEX);
  ed->L = L;
  ed->interrupted = 0;
  mn_lua_interrupted(1); /* a Ctrl-C from before the prompt is stale */
  fflush(stdout);
  int got = 0;
#ifdef MN_HAVE_LIBEDIT
  if (ed->el != NULL) {
    int n = 0;
    const char *line = le.el_gets(ed->el, &n);
    if (line != NULL) {
      size_t len = strlen(line);
      if (len > 0 && line[len - 1] == '\n') len--;
      lua_pushlstring(L, line, len);
      got = 1;
    }
  }
#endif
  if (!got && !ed->interrupted) {
#ifdef MN_HAVE_LIBEDIT
    int plain = ed->el == NULL;
#else
    int plain = 1;
#endif
    if (plain) {
      mn_buf_t b;
      mn_buf_init(&b);
      int r = read_plain(ed, &b);
      if (r > 0) {
        lua_pushlstring(L, b.data ? b.data : "", b.len);
        got = 1;
      }
      mn_buf_free(&b);
    }
  }
  luaL_unref(L, LUA_REGISTRYINDEX, ed->idle_ref);
  ed->idle_ref = LUA_NOREF;
  ed->L = NULL;
  if (got) return 1;
  if (ed->interrupted) lua_pushboolean(L, 0);
  else lua_pushnil(L);
  return 1;
}

/* ed:set_completer(fn): fn(word) -> text to insert, listing to show (either may be nil) */
static int l_set_completer(lua_State *L) {
  editor_t *ed = check_editor(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  luaL_unref(L, LUA_REGISTRYINDEX, ed->complete_ref);
  lua_pushvalue(L, 2);
  ed->complete_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

/* ed:add_history(line): remembers a line, and saves the history file (readable by its owner only). */
static int l_add_history(lua_State *L) {
  editor_t *ed = check_editor(L);
  const char *line = luaL_checkstring(L, 2);
#ifdef MN_HAVE_LIBEDIT
  HistEvent ev;
  if (ed->hist != NULL && line[0] != '\0') {
    le.history(ed->hist, &ev, H_ENTER, line);
    if (ed->history_path[0] != '\0') {
      mode_t old = umask(077);
      int rc = le.history(ed->hist, &ev, H_SAVE, ed->history_path);
      umask(old);
      if (rc < 0) {
        lua_pushboolean(L, 0);
        return 1;
      }
    }
  }
#endif
  lua_pushboolean(L, 1);
  return 1;
}

/* ed.editing -> true when libedit is in use (editing, history, completion) */
static int l_editing(lua_State *L) {
  editor_t *ed = check_editor(L);
#ifdef MN_HAVE_LIBEDIT
  lua_pushboolean(L, ed->el != NULL);
#else
  lua_pushboolean(L, 0);
#endif
  return 1;
}

static int l_close(lua_State *L) {
  editor_t *ed = luaL_checkudata(L, 1, MN_LE_EDITOR);
  if (ed->closed) return 0;
  ed->closed = 1;
#ifdef MN_HAVE_LIBEDIT
  if (ed->el != NULL) le.el_end(ed->el);
  if (ed->hist != NULL) le.history_end(ed->hist);
  ed->el = NULL;
  ed->hist = NULL;
#endif
  luaL_unref(L, LUA_REGISTRYINDEX, ed->complete_ref);
  ed->complete_ref = LUA_NOREF;
  return 0;
}

int luaopen_monarch_lineedit(lua_State *L) {
  static const luaL_Reg methods[] = {{"readline", l_readline}, {"set_completer", l_set_completer},
                                     {"add_history", l_add_history}, {"editing", l_editing},
                                     {"close", l_close}, {NULL, NULL}};
  if (luaL_newmetatable(L, MN_LE_EDITOR)) {
    lua_createtable(L, 0, 6);
    luaL_register(L, NULL, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_close);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, l_new);
  lua_setfield(L, -2, "new");
  return 1;
}
