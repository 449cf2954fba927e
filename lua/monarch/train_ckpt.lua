--- Checkpoints of a training run (monarch.train), written and read by the
-- procs themselves: no tensor byte passes through the controller.
--
-- A checkpoint of step S in DIR is one file per replica group of the state
-- (train_state.lua): DIR/ckpt-S.bin from the first group (the main file,
-- an ordinary monarch.checkpoint file that checkpoint.read accepts), and
-- DIR/ckpt-S.bin.shard-K for group K > 0. One proc of each group writes its
-- file (kernel shard_write: a temp name, synced, renamed). The main file is
-- written last and names how many shards there are, so it is the manifest:
-- a checkpoint whose main file is missing or whose shards do not check is
-- torn, and resume skips it, saying why.
local ffi = require "ffi"
local checkpoint = require "monarch.checkpoint"
local mesh_mod = require "monarch.mesh"
local errors = require "monarch.errors"

local M = {}

pcall(ffi.cdef, "char *realpath(const char *path, char *resolved);")
pcall(ffi.cdef, "void free(void *p);")
pcall(ffi.cdef, "int getpid(void);")

local SIZE = { f32 = 4, f64 = 8, f16 = 2, bf16 = 2, i32 = 4, i64 = 8, u8 = 1 }

local function nbytes(t)
  local n = SIZE[t.dtype] or error("train: checkpoint of a tensor of dtype " .. tostring(t.dtype), 0)
  for _, d in ipairs(t.shape) do n = n * d end
  return n
end

--- The absolute path of dir (the procs' working directory is not the controller's).
function M.absolute(dir)
  local r = ffi.C.realpath(dir, nil)
  if r == nil then return dir end
  local s = ffi.string(r)
  ffi.C.free(r)
  return s
end

local function shard_path(main, k) return k == 0 and main or (main .. ".shard-" .. k) end

local function sections(st)
  local secs = {}
  for i, n in ipairs(st.names) do secs[i] = { name = n, nbytes = nbytes(st.live[n]) } end
  return secs
end

-- Has the first proc of group k write its shard of step to path; returns the Future of its CRC-32.
local function write_shard(st, g, k, path, step, meta)
  meta.shard = k
  local head = checkpoint.head(step, meta, sections(st))
  local sub = mesh_mod.flat({ g[1] }, st.mesh._libs)
  local args = {}
  for i, n in ipairs(st.names) do args[i] = st.live[n]:on(sub) end
  local tmp = string.format("%s.tmp.%d", path, ffi.C.getpid())
  return sub:call_one("shard_write", tmp, path, head, unpack(args))
end

-- Deletes all but the newest `keep` checkpoints in dir, with their shards, and shards left by torn ones.
local function prune(dir, keep)
  local all = checkpoint.list(dir)
  local kept = {}
  for i = math.max(1, #all - keep + 1), #all do kept[all[i].step] = true end
  for _, name in ipairs(checkpoint.entries(dir)) do
    local step = name:match("^ckpt%-(%d+)%.bin") -- the main file and its shards
    if step and not kept[tonumber(step)] and not name:find("%.tmp%.") then os.remove(dir .. "/" .. name) end
  end
end

--- Writes the live state at `step` into dir; meta = {k = v} (the job's identity). Returns the main file's path.
-- sent() (optional) runs once every write is on its way, before waiting for them.
function M.write(st, dir, step, meta, keep, sent)
  checkpoint.mkdirs(dir)
  dir = M.absolute(dir)
  local groups = st:groups()
  local main = dir .. "/" .. checkpoint.filename(step)
  local base = { shards = #groups }
  for k, v in pairs(meta) do base[k] = v end
  local futs = {}
  for k = 2, #groups do futs[#futs + 1] = write_shard(st, groups[k], k - 1, shard_path(main, k - 1), step, base) end
  if sent and #futs > 0 then sent() end
  for _, f in ipairs(futs) do f:get() end
  local last = write_shard(st, groups[1], 0, main, step, base)
  if sent and #futs == 0 then sent() end
  last:get()
  prune(dir, keep)
  return main
end

-- The message of a failed shard_read, without the mesh's wrapping (the kernel names the file).
local function reason(err)
  local msg = errors.is(err) and err.message or tostring(err)
  return (msg:match("shard_read[^:]*: (.*)$") or msg:match("(/.*)$") or msg)
end

--- Reads the checkpoint whose main file is `path` into the live state of every proc. Returns the record's header
-- ({step, meta}) or nil, reason (naming the file) when it is torn, corrupt, or does not fit the state; with job,
-- also when another job wrote it.
function M.read(st, path, job)
  local h, why = checkpoint.read_head(path)
  if not h then return nil, why end
  if job and h.meta.job and h.meta.job ~= job then
    return nil, path .. ": written by job '" .. h.meta.job .. "', not '" .. job .. "'"
  end
  local want = sections(st)
  if #h.sections ~= #want then
    return nil, string.format("%s: it has %d sections, this run's state has %d (%s)", path, #h.sections, #want,
      table.concat(st.names, ", "))
  end
  for i, s in ipairs(want) do
    local got = h.sections[i]
    if got.name ~= s.name or got.nbytes ~= s.nbytes then
      return nil, string.format("%s: section %d is '%s' of %d bytes; this run's is '%s' of %d bytes: a different model",
        path, i, got.name, got.nbytes, s.name, s.nbytes)
    end
  end
  local groups, shards = st:groups(), tonumber(h.meta.shards) or 1
  if shards ~= #groups then
    return nil, string.format("%s: written in %d shards, this run's state is in %d", path, shards, #groups)
  end
  local futs = {}
  for k, g in ipairs(groups) do
    local file = shard_path(path, k - 1)
    local sh, swhy = h, nil
    if k > 1 then sh, swhy = checkpoint.read_head(file) end
    if not sh then return nil, swhy .. " (the checkpoint is torn)" end
    local sub = mesh_mod.flat(g, st.mesh._libs)
    local args = {}
    for i, n in ipairs(st.names) do args[i] = st.live[n]:on(sub) end
    futs[#futs + 1] = sub:call("shard_read", file, sh.head_len, unpack(args))
  end
  for _, f in ipairs(futs) do
    local ok, err = pcall(f.get, f)
    if not ok then return nil, reason(err) end
  end
  return h
end

--- The checkpoints in dir, newest first: {step, path} each.
function M.candidates(dir)
  local all, out = checkpoint.list(M.absolute(dir)), {}
  for i = #all, 1, -1 do out[#out + 1] = all[i] end
  return out
end

return M
