-- monarch.ship: files the controller ships to its hosts (docs/lua-api.md, "Shipping").
--
-- ProcMesh:load(path) of a library file the controller has: the file is hashed (BLAKE2b-256), every host
-- agent of the mesh is asked whether it has those bytes (SHIP_ASK: in its cache, or at the same path), and
-- those that lack them get them in 1 MiB chunks, down the cast tree (core.ship_send, ctl_ship.c). Each
-- agent checks the hash and keeps the file in its cache; its procs load it as "ship:<hash>". Before any
-- byte travels the library's ELF class and machine are checked against what each agent runs (WELCOME).
-- HostMesh:sync{...} puts files and folders into each host's job workspace the same way.
--
-- Restarted procs and procs on hosts that joined (ProcMesh:grow) load their libraries through the same
-- path (the hooks below), so they get what was shipped without the script doing anything.

local core = require "monarch.core"
local errors = require "monarch.errors"
local future = require "monarch.future"
local runtime = require "monarch.runtime"
local tasks = require "monarch.tasks"
local procs_mod = require "monarch.procs"
local mesh = require "monarch.mesh"
local log = require "monarch.log"

local M = {}

M.CHUNK = 1024 * 1024       -- bytes per SHIP_DATA frame (MN_SHIP_CHUNK)
M.WINDOW = 16 * 1024 * 1024 -- bytes queued to the agents before the next chunk waits for the sockets
M.ASK_TIMEOUT = 30          -- seconds for every agent to say what it has
M.TIMEOUT_PER_MIB = 2       -- and, on top of 30 s, to take the bytes
M.STALL = 3                 -- seconds without a new answer after which the tree's attempt gives way to a direct one

local MSG = core.MSG
local states = setmetatable({}, { __mode = "k" }) -- agent record -> hex -> {state, detail, n}
local agent_of = {}                                 -- agent conn id -> agent record (SHIP_STATE comes by conn)
local waiting = {} -- futures of the tasks that wait on answers: the next SHIP_STATE resolves them

local function hex_of(bin)
  return (bin:gsub(".", function(ch) return string.format("%02x", ch:byte()) end))
end

runtime.on_message(MSG.SHIP_STATE, function(m, conn)
  local a = agent_of[conn]
  if not a or type(m[2]) ~= "string" then return end
  local t = states[a]
  if not t then
    t = {}
    states[a] = t
  end
  local hex = hex_of(m[2])
  local s = t[hex] or { n = 0 }
  s.state, s.detail, s.n = m[3], m[4], s.n + 1
  t[hex] = s
  for f in pairs(waiting) do
    waiting[f] = nil
    f:resolve(true)
  end
end)

local function name_of(a) return (a.hostname or a.addr or "?") .. ":" .. tostring(a.port) end

local function fail(what, message, a)
  error(errors.new { kind = "load", host = a and name_of(a), message = what .. ": " .. message }, 0)
end

-- Waits for pred() in a task (without blocking the loop) or in the script (pumping it). A task wakes at
-- each agent's answer (SHIP_STATE) and at least every `poll` seconds (an agent lost, the send window).
local function wait(pred, timeout, what, poll)
  if not tasks.in_task() then return procs_mod.wait_until(pred, timeout, what) end
  local deadline = runtime.now() + timeout
  while not pred() do
    if runtime.now() > deadline then
      error(errors.new { kind = "timeout", message = what .. " did not finish within " .. timeout .. "s" }, 0)
    end
    local f = future.new("ship")
    if not poll then waiting[f] = true end -- one future a wait: none keeps the callbacks of waits that timed out
    tasks.wait_for(f, poll or 0.05)
    waiting[f] = nil
  end
end

-- ---- files ------------------------------------------------------------------------------------

local files = {}   -- hex -> { bytes, size, path, hex }: libraries shipped, kept for restarts and joins
-- path -> { rec, size, mtime, ino, dev }: a file whose stat still says the same is not read or hashed again
-- (in this controller process; it trusts that a change to the bytes moves the size or mtime, as any write does).
-- A workspace file's record keeps its hash but lets its bytes go once synced (bytes_of reads them again).
local by_path = {}

--- Reads and hashes the file at path; returns its record.
local function file(path, what)
  local size, mtime, ino, dev = core.stat(path)
  local seen = by_path[path]
  if seen and size and seen.size == size and seen.mtime == mtime and seen.ino == ino and seen.dev == dev then
    return seen.rec
  end
  local bytes, hex = core.ship_read(path)
  if not bytes then fail(what, hex) end
  local rec = files[hex] or { size = #bytes, path = path, hex = hex }
  rec.bytes = rec.bytes or bytes
  if size then by_path[path] = { rec = rec, size = size, mtime = mtime, ino = ino, dev = dev } end
  return rec
end

-- rec's bytes, read again if they were let go: the same bytes, or an error naming the file.
local function bytes_of(rec, what)
  if rec.bytes then return rec.bytes end
  local bytes, hex = core.ship_read(rec.path)
  if not bytes then fail(what, hex) end
  if hex ~= rec.hex then fail(what, rec.path .. " changed while it was being shipped (sync again)") end
  rec.bytes = bytes
  return bytes
end

local ELF_CLASS = { [1] = "ELF32", [2] = "ELF64" }

-- A library must be a shared object for each agent's machine (what its WELCOME said).
local function check_elf(rec, agents, what)
  local cls, machine, etype = core.ship_elf(bytes_of(rec, what))
  if not cls then fail(what, rec.path .. " is not an ELF file (a kernel library is a shared object, .so)") end
  if etype ~= 3 then fail(what, rec.path .. " is an ELF file but not a shared object (e_type " .. etype .. ")") end
  for _, a in ipairs(agents) do
    if a.elf_machine and a.elf_machine ~= 0 and (a.elf_machine ~= machine or a.elf_class ~= cls) then
      fail(what, string.format("%s is built for %s (%s), but host %s runs %s (%s)", rec.path,
        core.ship_elf(nil, machine), ELF_CLASS[cls] or "?", name_of(a), core.ship_elf(nil, a.elf_machine),
        ELF_CLASS[a.elf_class] or "?"), a)
    end
  end
end

-- ---- the exchange -----------------------------------------------------------------------------

local function state_of(a, hex) return states[a] and states[a][hex] end

-- What each agent said it has (hex -> "cached" or "local"): a second load there asks nothing. Shipping a file
-- to an agent may evict others from its cache, so that forgets the rest; a load that still finds a file gone
-- (another job's files evicted it) asks again (ProcMesh:load's retry, M.library's fresh).
local known = setmetatable({}, { __mode = "k" })

local function remember(agents, hex, shipped_to)
  for _, a in ipairs(shipped_to or {}) do known[a] = {} end
  for _, a in ipairs(agents) do
    local s = state_of(a, hex)
    if s and (s.state == "cached" or s.state == "local") then
      known[a] = known[a] or {}
      known[a][hex] = s.state
    end
  end
end

-- Sends every chunk of rec to the agents in `to` (through the tree unless direct), a window at a time.
local function send_bytes(rec, to, direct, what)
  local bytes = bytes_of(rec, what)
  local conns = {}
  for i, a in ipairs(to) do conns[i] = a.conn end
  local off = 0
  repeat
    local n = math.min(M.CHUNK, rec.size - off)
    core.ship_send(conns, rec.hex, rec.size, off, bytes, direct)
    off = off + n
    if core.ship_stats().pending > M.WINDOW then
      wait(function() return core.ship_stats().pending <= M.WINDOW / 2 end, 600, "shipping " .. rec.path, 0.005)
    end
  until off >= rec.size
end

-- Asks every agent about rec (place: its workspace path, or ""); returns once each has answered.
local function ask(rec, agents, place, what)
  local before = {}
  for i, a in ipairs(agents) do
    if a.state ~= "ready" then fail(what, "host agent is not connected (" .. tostring(a.reason or a.state) .. ")", a) end
    agent_of[a.conn] = a
    local s = state_of(a, rec.hex)
    before[i] = s and s.n or 0
    core.ship_ask(a.conn, rec.hex, rec.size, place == "" and rec.path or "", place)
  end
  wait(function()
    for i, a in ipairs(agents) do
      local s = state_of(a, rec.hex)
      if (not s or s.n == before[i]) and a.state ~= "dead" then return false end
    end
    return true
  end, M.ASK_TIMEOUT, what .. ": asking the hosts for " .. rec.path)
end

local DONE = { cached = true, ["local"] = true, placed = true }
local FINAL = { cached = true, corrupt = true, refused = true, error = true } -- what ends a transfer

-- Those of `agents` whose answer was "need" (raises for an answer that is neither that nor one of DONE).
local function needing(rec, agents, what)
  local need = {}
  for _, a in ipairs(agents) do
    local s = state_of(a, rec.hex)
    if not s then fail(what, "host agent lost: " .. tostring(a.reason), a) end
    if s.state == "need" then need[#need + 1] = a
    elseif s.state == "refused" then fail(what, "host " .. name_of(a) .. " lacks " .. rec.path ..
      " and refuses shipped files (monarch-worker --no-ship): " .. tostring(s.detail), a)
    elseif not DONE[s.state] then fail(what, "host " .. name_of(a) .. ": " .. tostring(s.detail), a) end
  end
  return need
end

-- Agents that share a cache (one id in WELCOME: several agents of one user on a machine) need its bytes
-- once: the first of each id gets them (a lead), the rest (lead_of) find them in the cache.
local function by_cache(need)
  local first, leads, rest, lead_of = {}, {}, {}, {}
  for _, a in ipairs(need) do
    local id = a.cache_id
    if id and first[id] then
      rest[#rest + 1] = a
      lead_of[a] = first[id]
    else
      if id then first[id] = a end
      leads[#leads + 1] = a
    end
  end
  return leads, rest, lead_of
end

-- Sends rec's bytes to each of `need` and waits until each holds it (or raises).
local function send_to(rec, need, what)
  local timeout = M.ASK_TIMEOUT + M.TIMEOUT_PER_MIB * rec.size / 1048576
  for attempt = 1, 2 do -- the second, directly, for those a lost relay left without the file
    local marks = {}
    for i, a in ipairs(need) do marks[i] = state_of(a, rec.hex).n end
    send_bytes(rec, need, attempt == 2, what)
    -- The direct second attempt waits for a final answer (late ones of the first are stale).
    -- The first attempt also ends once answers stop coming for M.STALL seconds: a relay that dropped its
    -- children's chunks (a link lost on the way) leaves them silent, and they are sent to directly.
    local answered, progress = -1, runtime.now()
    pcall(wait, function()
      local n = 0
      for i, a in ipairs(need) do
        local s = state_of(a, rec.hex)
        local final = FINAL[s.state]
        if (s.n ~= marks[i] and final) or a.state == "dead" then n = n + 1 end
      end
      if n > answered then answered, progress = n, runtime.now() end
      return n == #need or (attempt == 1 and runtime.now() - progress > M.STALL)
    end, timeout, what)
    local again = {}
    for i, a in ipairs(need) do
      local s = state_of(a, rec.hex)
      if s.state == "corrupt" or s.state == "refused" or s.state == "error" then
        fail(what, "host " .. name_of(a) .. ": " .. rec.path .. ": " .. tostring(s.detail), a)
      elseif s.state ~= "cached" or s.n == marks[i] then
        again[#again + 1] = a
      end
    end
    need = again
    if #need == 0 then return end
  end
  fail(what, "host " .. name_of(need[1]) .. " did not receive " .. rec.path .. " (" ..
    tostring(state_of(need[1], rec.hex).detail) .. ")", need[1])
end

-- Ships rec to those of `agents` that lack it (their answers to ask are in); each then holds it (or the call
-- raises). Returns the agents that lacked it.
local function deliver(rec, agents, what, place)
  local need = needing(rec, agents, what)
  if #need == 0 then return need end
  local leads, rest, lead_of = by_cache(need)
  send_to(rec, leads, what)
  if #rest > 0 and place then
    ask(rec, rest, place, what)
    local still = needing(rec, rest, what) -- a cache that lost it again, or an id copied with a cache
    if #still > 0 then send_to(rec, still, what) end
  else
    -- A library: each of the rest holds it where its lead put it, without being asked again (a round trip to
    -- every host). One whose cache does not have it after all (an id copied with a cache, an eviction since)
    -- fails its load as "ship:", and ProcMesh:load asks again (fresh).
    for _, a in ipairs(rest) do
      local s = state_of(a, rec.hex)
      s.state, s.detail = "cached", state_of(lead_of[a], rec.hex).detail
    end
  end
  return need
end

-- ---- libraries --------------------------------------------------------------------------------

--- For ProcMesh:load (and restarts, grows) of a library path the controller has: ships it where needed and
-- returns name(agent), the name each agent's procs load it by ("ship:<hash>", or the path where that host
-- has the same bytes). A name without a '/', or a path the controller lacks, is loaded as before.
function M.library(lib, agents, what, fresh)
  if not lib:find("/", 1, true) then return nil end
  local f = io.open(lib, "rb")
  if not f then return nil end -- the hosts may have it where the controller does not
  f:close()
  local rec = file(lib, what)
  files[rec.hex] = rec -- its bytes stay: restarted procs and joined hosts load it too
  local asked, all_known = {}, true
  for _, a in ipairs(agents) do
    if a.ship ~= nil then asked[#asked + 1] = a end -- an agent before shipping loads by path, as it did
    all_known = all_known and (a.ship == nil or (known[a] and known[a][rec.hex]) ~= nil)
  end
  if fresh or not all_known then
    check_elf(rec, asked, what)
    -- One agent of each shared cache is asked (a round trip to every host costs more than the rest); the
    -- others follow its cache's answer, unless it had the file at the controller's path (theirs may differ).
    -- Asked afresh (a load found a file gone where its cache was said to have it), every agent answers.
    local leads, rest, lead_of = asked, {}, {}
    if not fresh then leads, rest, lead_of = by_cache(asked) end
    ask(rec, leads, "", what)
    local follow, own, filled = {}, {}, {}
    for _, a in ipairs(rest) do
      local s = state_of(lead_of[a], rec.hex)
      if a.state ~= "ready" then fail(what, "host agent is not connected (" .. tostring(a.reason or a.state) .. ")", a)
      elseif s and (s.state == "need" or s.state == "cached") then
        follow[#follow + 1] = a
        if s.state == "need" then filled[#filled + 1] = a end -- its cache gets the file (and may evict others)
      else
        own[#own + 1] = a
      end
    end
    if #own > 0 then ask(rec, own, "", what) end
    for _, a in ipairs(own) do leads[#leads + 1] = a end
    remember(leads, rec.hex, deliver(rec, leads, what))
    for _, a in ipairs(follow) do
      local s = state_of(lead_of[a], rec.hex)
      states[a] = states[a] or {}
      local mine = states[a][rec.hex] or { n = 0 }
      mine.state, mine.detail, mine.n = s.state, s.detail, mine.n + 1
      states[a][rec.hex] = mine
    end
    remember(follow, rec.hex, filled)
  end
  return function(a)
    if a.ship == nil or known[a][rec.hex] == "local" then return lib end
    return "ship:" .. rec.hex
  end
end

local function agents_of(procs)
  local seen, out = {}, {}
  for _, p in ipairs(procs) do
    local a = p.agent
    if a and not seen[a] then
      seen[a] = true
      out[#out + 1] = a
    end
  end
  return out
end

mesh.set_shipper(function(procs, lib, what, fresh) return M.library(lib, agents_of(procs), what, fresh) end)
procs_mod.set_lib_resolver(function(p, lib)
  local name = M.library(lib, agents_of({ p }), "reload of '" .. lib .. "' after a restart", true)
  return name and name(p.agent) or lib
end)

-- ---- workspaces (HostMesh:sync) -----------------------------------------------------------------

-- Every regular file under path, as {abs, rel} (rel: its path in the workspace under `base`).
local function walk(path, base, out)
  local list = core.listdir(path)
  if not list then
    out[#out + 1] = { path, base }
    return out
  end
  table.sort(list, function(x, y) return x[1] < y[1] end)
  for _, e in ipairs(list) do
    local abs, rel = path .. "/" .. e[1], base .. "/" .. e[1]
    if e[2] == "d" then walk(abs, rel, out)
    elseif e[2] == "f" then out[#out + 1] = { abs, rel } end
  end
  return out
end

local function entries(spec)
  local out = {}
  for i, item in ipairs(spec) do
    if type(item) ~= "string" or item == "" then error("sync: entry " .. i .. " is not a path", 3) end
    local p = item:gsub("/+$", "")
    local base = p:match("([^/]+)$") or p
    if core.listdir(p) then walk(p, base, out)
    else
      local f = io.open(p, "rb")
      if not f then error("sync: " .. item .. ": no such file or folder", 3) end
      f:close()
      out[#out + 1] = { p, base }
    end
  end
  return out
end

-- The HostMeshes synced (weak: a mesh the script dropped is forgotten): each keeps in _synced what its
-- hosts' workspaces hold (rel -> abs, in the order first synced, and a generation), so that a host of it whose
-- procs are spawned later (one that joined it) gets the same; had: agent -> mesh -> the generation it holds.
local synced_meshes = setmetatable({}, { __mode = "k" })
local had = setmetatable({}, { __mode = "k" })

-- Puts each {abs, rel} of list into the workspaces of agents; returns the files sent and the bytes written.
-- skip_gone: a file no longer there is left out with a warning (a late host's copy), not an error.
local function place_all(list, agents, what, skip_gone)
  local before, shipped = core.ship_stats().bytes, 0
  for _, e in ipairs(list) do
    local ok, rec = true, nil
    if skip_gone then ok, rec = pcall(file, e[1], what) else rec = file(e[1], what) end
    if not ok then
      log.log("warn", what .. ": " .. e[2] .. " left out: " .. tostring(errors.is(rec) and rec.message or rec))
    else
      ask(rec, agents, e[2], what)
      local need = deliver(rec, agents, what, e[2])
      if #need > 0 then
        shipped = shipped + 1
        ask(rec, need, e[2], what) -- now in their caches: linked into the workspace
        deliver(rec, need, what, e[2])
      end
      if files[rec.hex] ~= rec then rec.bytes = nil end -- a workspace file's bytes are not kept in memory
    end
  end
  return shipped, core.ship_stats().bytes - before
end

--- Puts files and folders into every host's job workspace (MONARCH_WORKSPACE in the procs' environment):
-- sync{ "data/", "weights.bin" } makes <workspace>/data/... and <workspace>/weights.bin. Only files a host
-- lacks travel (by content). Hosts whose procs are spawned later (a join, a grow) get what was synced
-- before their procs start. Returns {files = n, shipped = files sent, bytes = bytes sent}.
function mesh.HostMesh:sync(spec)
  if type(spec) ~= "table" then error("sync wants a list of paths, got " .. type(spec), 2) end
  local list, what = entries(spec), "sync"
  local agents = {}
  for _, a in ipairs(self.agents) do
    if a.ship == nil then fail(what, "host " .. name_of(a) .. "'s monarch-worker predates shipping", a) end
    if a.state == "ready" then agents[#agents + 1] = a end
  end
  local shipped, bytes = place_all(list, agents, what)
  local st = self._synced or { by_rel = {}, order = {}, generation = 0 }
  self._synced = st
  synced_meshes[self] = true
  local complete = {} -- those that held all of it before now hold all of it again
  for _, a in ipairs(agents) do complete[a] = st.generation == 0 or (had[a] and had[a][self]) == st.generation end
  st.generation = st.generation + 1
  for _, e in ipairs(list) do
    if not st.by_rel[e[2]] then st.order[#st.order + 1] = e[2] end
    st.by_rel[e[2]] = e[1]
  end
  for _, a in ipairs(agents) do
    if complete[a] then
      had[a] = had[a] or setmetatable({}, { __mode = "k" })
      had[a][self] = st.generation
    end
  end
  return { files = #list, shipped = shipped, bytes = bytes }
end

-- Before procs are spawned on agents: those of a synced HostMesh (one that joined it, or a grow of a mesh on
-- its hosts) whose workspace lacks what it synced get it (as the files are now; one gone since is left out
-- with a warning).
-- like: the agents of a mesh being grown onto these (ProcMesh:grow): its hosts' syncs apply to the new ones.
mesh.set_before_spawn(function(agents, like)
  for h in pairs(synced_meshes) do
    local st, late, member = h._synced, {}, {}
    for _, a in ipairs(h.agents) do member[a] = true end
    local grown = false
    for _, a in ipairs(like or {}) do grown = grown or member[a] == true end
    for _, a in ipairs(agents) do
      if (grown or member[a]) and a.state == "ready" and (had[a] and had[a][h]) ~= st.generation then
        if a.ship then late[#late + 1] = a
        else log.log("warn", "host " .. name_of(a) .. " takes no shipped files: its workspace lacks what hosts:sync sent") end
      end
    end
    if #late > 0 then
      local list = {}
      for i, rel in ipairs(st.order) do list[i] = { st.by_rel[rel], rel } end
      place_all(list, late, "sync to host " .. name_of(late[1]) .. (#late > 1 and " and " .. (#late - 1) .. " more" or ""), true)
      for _, a in ipairs(late) do
        had[a] = had[a] or setmetatable({}, { __mode = "k" })
        had[a][h] = st.generation
      end
    end
  end
end)

--- What this controller has written of shipped files: {bytes, frames, pending}.
function M.stats() return core.ship_stats() end

return M
