/*
 * term_lua.c - a full screen for Lua: the `monarch.term` module, a thin
 * binding of ncurses that `monarch-run --top` (lua/monarch/top.lua) draws on.
 *
 *   local scr, why = require("monarch.term").open()  -- nil and why without a usable terminal
 *   local rows, cols = scr:size()
 *   scr:draw{ {"text", "title"}, {"more", "bad"}, "plain" }  -- one line per row, from the top
 *   scr:key()    -- nil when no key is waiting (it never blocks), else its name
 *   scr:close()  -- the terminal as it was (also when the screen is collected)
 *
 * Lua builds the lines; ncurses works out what changed on the terminal and
 * sends only that. The terminal is put in raw mode, so Ctrl-C arrives as the
 * key "ctrl-c" rather than as SIGINT, and the caller restores the terminal
 * however it leaves. Styles: "title" (reverse video), "head" (bold), "bad"
 * (red, or bold without colours), "dim". Keys: printable characters as
 * themselves, "ctrl-c", "ctrl-l" (the next draw repaints the whole terminal),
 * "up", "down", "pgup", "pgdn", "home", "end", "resize" (the terminal
 * changed size), "other".
 */
#include <curses.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <term.h>
#include <unistd.h>

#define MN_TERM_SCREEN "monarch.term.screen" /* registry name of the metatable */
#define MN_TERM_MAX_LINE 1024                /* longest line drawn, bytes (wider terminals are cut there) */
#define MN_TERM_ESC_MS 25                    /* wait for the rest of an escape sequence (arrow keys) */
#define PAIR_BAD 1

typedef struct {
  SCREEN *scr; /* NULL once closed */
} term_t;

static int open_count; /* ncurses keeps one current screen: one open at a time */

static term_t *check_term(lua_State *L) {
  term_t *t = luaL_checkudata(L, 1, MN_TERM_SCREEN);
  if (t->scr == NULL) luaL_error(L, "the screen is closed");
  return t;
}

/* A terminfo string capability the terminal has (tigetstr answers (char *)-1 for a name that is not one). */
static int has_cap(const char *name) {
  const char *v = tigetstr(name);
  return v != NULL && v != (const char *)-1;
}

/* Why the terminal cannot be used (NULL: it can): no terminal, no TERM, a
 * TERM terminfo does not know, or one that cannot place its cursor ("dumb",
 * where ncurses would start but draw nothing). */
static const char *unusable(const char *term) {
  int err = 0;
  if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) return "standard input and output must be a terminal";
  if (term == NULL || term[0] == '\0') return "TERM is not set";
  if (setupterm(term, STDOUT_FILENO, &err) != OK)
    return err == 0 ? "the terminal type in TERM is not in the terminfo database"
                    : err == 1 ? "the terminal in TERM cannot move its cursor (a hardcopy terminal)"
                               : "no terminfo database found";
  int can_draw = has_cap("cup") && has_cap("clear");
  del_curterm(cur_term);
  return can_draw ? NULL : "the terminal in TERM cannot move its cursor or clear its screen";
}

/* Raw keys, no echo, no cursor, keypad keys decoded, reads that never block. */
static void set_modes(void) {
  raw();
  noecho();
  nonl();
  keypad(stdscr, TRUE);
  nodelay(stdscr, TRUE);
  set_escdelay(MN_TERM_ESC_MS);
  if (curs_set(0) == ERR) {
    /* the terminal cannot hide its cursor: it stays where the last line ends */
  }
  if (has_colors() && start_color() == OK) {
    if (use_default_colors() == OK) init_pair(PAIR_BAD, COLOR_RED, -1);
    else init_pair(PAIR_BAD, COLOR_RED, COLOR_BLACK);
  }
}

/* open() -> screen, or nil and why */
static int l_open(lua_State *L) {
  const char *term = getenv("TERM"), *why = unusable(term);
  if (why == NULL && open_count > 0) why = "a screen is open already";
  if (why != NULL) {
    lua_pushnil(L);
    lua_pushstring(L, why);
    return 2;
  }
  term_t *t = lua_newuserdata(L, sizeof(*t));
  t->scr = newterm(term, stdout, stdin);
  if (t->scr == NULL) {
    lua_pushnil(L);
    lua_pushfstring(L, "ncurses could not start a screen on terminal '%s'", term);
    return 2;
  }
  set_term(t->scr);
  open_count++;
  set_modes();
  luaL_getmetatable(L, MN_TERM_SCREEN);
  lua_setmetatable(L, -2);
  return 1;
}

static int l_size(lua_State *L) {
  check_term(L);
  lua_pushinteger(L, LINES);
  lua_pushinteger(L, COLS);
  return 2;
}

static attr_t style_attr(const char *style) {
  if (style == NULL) return A_NORMAL;
  if (strcmp(style, "title") == 0) return A_REVERSE;
  if (strcmp(style, "head") == 0) return A_BOLD;
  if (strcmp(style, "bad") == 0) return has_colors() ? COLOR_PAIR(PAIR_BAD) | A_BOLD : A_BOLD;
  if (strcmp(style, "dim") == 0) return A_DIM;
  return A_NORMAL;
}

/* Draws one line at row y: bytes that are not printable ASCII become '?'. */
static void draw_line(int y, const char *s, size_t n, attr_t attr) {
  char buf[MN_TERM_MAX_LINE];
  if (n > sizeof(buf)) n = sizeof(buf);
  if (n > (size_t)COLS) n = (size_t)COLS;
  for (size_t i = 0; i < n; i++) buf[i] = s[i] >= 32 && s[i] < 127 ? s[i] : '?';
  attrset(attr);
  if (mvaddnstr(y, 0, buf, (int)n) == ERR) {
    /* the bottom-right cell cannot be written without scrolling: that one character is left out */
  }
  if (attr & A_REVERSE) /* a title bar spans the whole row */
    for (int x = (int)n; x < COLS; x++) mvaddch(y, x, ' ');
  attrset(A_NORMAL);
}

/* draw(lines): each a string or {text, style}; rows past the last line are blank. */
static int l_draw(lua_State *L) {
  check_term(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  erase();
  int n = (int)lua_objlen(L, 2);
  for (int i = 1; i <= n && i <= LINES; i++) {
    lua_rawgeti(L, 2, i); /* stack: scr, lines, line */
    const char *style = NULL;
    size_t len = 0;
    const char *s;
    if (lua_istable(L, -1)) {
      lua_rawgeti(L, -1, 1);
      lua_rawgeti(L, -2, 2); /* stack: scr, lines, line, text, style */
      s = luaL_optlstring(L, -2, "", &len);
      style = lua_tostring(L, -1);
      draw_line(i - 1, s, len, style_attr(style));
      lua_pop(L, 3);
    } else {
      s = luaL_checklstring(L, -1, &len);
      draw_line(i - 1, s, len, A_NORMAL);
      lua_pop(L, 1);
    }
  }
  refresh();
  return 0;
}

/* A terminal that changed size without a SIGWINCH reaching ncurses (another handler took it). */
static int size_changed(void) {
  struct winsize ws;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0 || ws.ws_row == 0 || ws.ws_col == 0) return 0;
  if (!is_term_resized(ws.ws_row, ws.ws_col)) return 0;
  return resizeterm(ws.ws_row, ws.ws_col) == OK;
}

static const char *key_label(int ch) {
  static char one[2];
  switch (ch) {
  case 3: return "ctrl-c";
  case 12: return "ctrl-l";
  case KEY_RESIZE: return "resize";
  case KEY_UP: return "up";
  case KEY_DOWN: return "down";
  case KEY_PPAGE: return "pgup";
  case KEY_NPAGE: return "pgdn";
  case KEY_HOME: return "home";
  case KEY_END: return "end";
  default:
    if (ch < 32 || ch >= 127) return "other";
    one[0] = (char)ch;
    one[1] = '\0';
    return one;
  }
}

/* key() -> the next key's name, or nil when none is waiting */
static int l_key(lua_State *L) {
  check_term(L);
  int ch = getch();
  if (ch == ERR) {
    if (!size_changed()) return 0;
    ch = KEY_RESIZE;
  }
  if (ch == 12 && clearok(curscr, TRUE) == ERR) {
    /* no full repaint then: the next draw still sends what changed */
  }
  lua_pushstring(L, key_label(ch));
  return 1;
}

static int l_close(lua_State *L) {
  term_t *t = luaL_checkudata(L, 1, MN_TERM_SCREEN);
  if (t->scr == NULL) return 0;
  if (endwin() == ERR) {
    /* the terminal was gone already (a hung-up ssh session): nothing left to restore */
  }
  delscreen(t->scr);
  t->scr = NULL;
  open_count--;
  return 0;
}

int luaopen_monarch_term(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"size", l_size}, {"draw", l_draw}, {"key", l_key}, {"close", l_close}, {NULL, NULL}};
  if (luaL_newmetatable(L, MN_TERM_SCREEN)) {
    lua_newtable(L);
    luaL_register(L, NULL, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_close);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_newtable(L);
  lua_pushcfunction(L, l_open);
  lua_setfield(L, -2, "open");
  return 1;
}
