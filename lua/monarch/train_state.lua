--- A training run's state on its procs (monarch.train): the tensors by
-- name, each proc's own copy of them from the last snapshot step with a
-- tag that says which step that copy holds, and the replica groups (procs
-- whose state must be identical).
--
-- A snapshot is one call per proc (shard_snap: copy, then tag = step). After
-- a failure, or under a new controller, the step to go on from is the
-- newest snapshot step c found on any proc; a proc tagged c restores its
-- copy, and a proc with an older tag never ran step c's snapshot, which the
-- controller sends only after every proc finished step c - 1, so its live
-- state is step c already. See docs/training.md, "What each failure does".
local mesh_mod = require "monarch.mesh"
local errors = require "monarch.errors"

local M = {}

local S = {}
S.__index = S

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t or {}) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

--- The state of mesh m: tensors = {state = {name = t}, data = {...}, work = {...}} as the script's setup returned
-- them; replicate = nil (every proc holds the same state), a dimension name or a list of names (procs that differ
-- only in those coordinates hold the same state). snap and tag (made here when nil) are the copies and the tag tensor.
function M.new(m, tensors, replicate, snap, tag)
  local st = setmetatable({ mesh = m, live = tensors.state or {}, data = tensors.data or {},
    work = tensors.work or {}, replicate = replicate, snap = snap, tag = tag }, S)
  st.names = sorted_keys(st.live)
  if #st.names == 0 then error("train: setup returned no state tensors ({state = {name = tensor}})", 3) end
  for _, n in ipairs(st.names) do
    local t = st.live[n]
    if t.device then st.on_gpu = true end
  end
  if not st.on_gpu and not st.snap then
    st.snap = {}
    for _, n in ipairs(st.names) do st.snap[n] = m:tensor(st.live[n].dtype, st.live[n].shape) end
    st.tag = m:tensor("i64", { 1 })
    m:call("fill", st.tag, -1):get()
  end
  return st
end

--- Every tensor by a persistent name: "state.params", "snap.params", "data.X", "work.G", "tag".
function S:named()
  local out = { tag = self.tag }
  for kind, set in pairs { state = self.live, snap = self.snap or {}, data = self.data, work = self.work } do
    for n, t in pairs(set) do out[kind .. "." .. n] = t end
  end
  return out
end

--- The state of an attached mesh m, from its tensors by persistent name (S:named); nil, why when one is missing.
function M.from_named(m, tensors, names, replicate)
  local set = { state = {}, snap = {}, data = {}, work = {} }
  for full, t in pairs(tensors) do
    local kind, n = tostring(full):match("^(%a+)%.(.+)$")
    if kind and set[kind] then set[kind][n] = t end
  end
  for _, n in ipairs(names) do
    if not set.state[n] or not set.snap[n] then return nil, "tensor '" .. n .. "' is not on the procs" end
  end
  if not tensors.tag then return nil, "the snapshot tag is not on the procs" end
  return M.new(m, { state = set.state, data = set.data, work = set.work }, replicate, set.snap, tensors.tag)
end

--- Every tensor, for moving the state onto another mesh (shrink, grow).
function S:each(fn)
  for _, set in ipairs { self.live, self.snap or {}, self.data, self.work } do
    for n, t in pairs(set) do set[n] = fn(t) or t end
  end
  if self.tag then self.tag = fn(self.tag) or self.tag end
end

-- The pairs (a1, b1, a2, b2, ...) for shard_snap, from set a to set b.
function S:pairs(from, to)
  local args = {}
  for _, n in ipairs(self.names) do
    args[#args + 1] = from[n]
    args[#args + 1] = to[n]
  end
  return args
end

--- Copies the live state to each proc's snapshot, tagged with step s (one call per proc; not waited for).
function S:snapshot(s)
  if self.on_gpu then return end
  local m = self.mesh
  if self.snap_for ~= m then -- the arguments, made again only when the mesh changed (they are its tensors)
    self.snap_for, self.snap_args = m, self:pairs(self.live, self.snap)
  end
  return m:call("shard_snap", self.tag, s, unpack(self.snap_args))
end

--- The snapshot step of each proc of `procs` (a list; default every proc): {[p] = step}; -1 for none.
function S:tags(procs)
  procs = procs or self.mesh:proc_list()
  local sub = mesh_mod.flat(procs, self.mesh._libs)
  local v = self.tag:on(sub):fetch():get()
  local out = {}
  for i, p in ipairs(procs) do out[p] = tonumber(v[i]:totable()[1]) end
  return out
end

--- The step every proc of `procs` can go back to (the newest snapshot tag among them), and restores it on the
-- procs tagged with it. Returns the step, or nil and why when no proc has a snapshot.
function S:restore(procs)
  procs = procs or self.mesh:proc_list()
  local tags, c = self:tags(procs), -1
  for _, t in pairs(tags) do c = math.max(c, t) end
  if c < 0 then return nil, "no proc holds a snapshot" end
  local back = {}
  for _, p in ipairs(procs) do
    if tags[p] == c then back[#back + 1] = p end
  end
  local sub = mesh_mod.flat(back, self.mesh._libs)
  local live, snap = {}, {}
  for _, n in ipairs(self.names) do
    live[n], snap[n] = self.live[n]:on(sub), self.snap[n]:on(sub)
  end
  sub:call("shard_snap", self.tag:on(sub), c, unpack(self:pairs(snap, live))):get()
  return c
end

-- The replica groups: lists of procs that hold the same state, in rank order.
function S:groups()
  local m, dim = self.mesh, self.replicate
  local list = m:proc_list()
  if not dim then return { list } end
  local names, sizes = m.shape.names, m.shape.sizes
  local along = {}
  for _, d in ipairs(type(dim) == "table" and dim or { dim }) do along[d] = true end
  local groups, by_key = {}, {}
  for i, p in ipairs(list) do
    local rest, key = i - 1, {}
    for d = #names, 1, -1 do
      local c = rest % sizes[d]
      rest = (rest - c) / sizes[d]
      if not along[names[d]] then table.insert(key, 1, c) end
    end
    local k = table.concat(key, ",")
    if not by_key[k] then
      by_key[k] = {}
      groups[#groups + 1] = by_key[k]
    end
    table.insert(by_key[k], p)
  end
  return groups
end

--- Fills the live state of procs `fresh` (restarted: their tensors are new and zeroed) from a healthy proc of
-- their replica group, proc to proc.
function S:refill(fresh)
  local is_fresh = {}
  for _, p in ipairs(fresh) do is_fresh[p] = true end
  for _, g in ipairs(self:groups()) do
    local src, dst = nil, {}
    for _, p in ipairs(g) do
      if is_fresh[p] then dst[#dst + 1] = p elseif not src then src = p end
    end
    if #dst > 0 then
      if not src then
        error(errors.new { kind = "proc_failed", message = "every proc holding one replica of the state was lost" }, 0)
      end
      local grp = mesh_mod.flat({ src, unpack(dst) }, self.mesh._libs)
      local futs = {}
      for _, n in ipairs(self.names) do futs[#futs + 1] = grp:broadcast_tensor(self.live[n]:on(grp), 0) end
      for _, f in ipairs(futs) do f:get() end
    end
  end
end

--- The CRC-32 of every state tensor on every proc; raises naming the first tensor and ranks that differ within
-- a replica group. Returns {name = crc of the first group's copy}.
function S:check_identical()
  local out = {}
  for _, n in ipairs(self.names) do
    local crcs = self.mesh:call("shard_crc", self.live[n]):get()
    local at = {}
    for i, p in ipairs(self.mesh:proc_list()) do at[p] = crcs[i] end
    for gi, g in ipairs(self:groups()) do
      for _, p in ipairs(g) do
        if at[p] ~= at[g[1]] then
          error(string.format("train: state '%s' differs between rank %d and rank %d (crc32 %08x, %08x)", n,
            g[1].rank, p.rank, at[g[1]], at[p]), 0)
        end
      end
      if gi == 1 then out[n] = at[g[1]] end
    end
  end
  return out
end

return M
