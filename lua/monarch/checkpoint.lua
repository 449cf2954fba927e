--- Training checkpoints: small binary files written atomically.
--   local checkpoint = require "monarch.checkpoint"
--   local path = checkpoint.write("checkpoints", {
--     step = 100, meta = { hidden = 128 },
--     sections = { { name = "params", bytes = p }, { name = "adam", bytes = s } },
--   }, { keep = 3 })
--   local ck, path = checkpoint.latest("checkpoints")   -- newest valid one
--
-- File layout (integers little-endian):
--   magic     8 bytes  "MNCKPT\r\n" (the \r\n catches text-mode mangling)
--   version   u32      VERSION
--   step      u64      steps completed when it was written
--   meta_len  u32, then meta_len bytes of "key=value\n" lines (sorted keys)
--   nsect     u32, then per section: name_len u16, name, nbytes u64
--   crc       u32      CRC-32 (zlib's polynomial) of every byte before it and of the payload
--   payload   the sections' bytes, in order
-- A file is named ckpt-<step, 9 digits>.bin; it is written to a hidden temp
-- name in the same directory, synced, and renamed into place, so a crash
-- leaves either the old set of files or the new one, never half a file.
local ffi = require "ffi"
local bit = require "bit"

local M = {}

M.MAGIC = "MNCKPT\r\n"
M.VERSION = 1
M.KEEP = 3                -- checkpoints kept by default; older ones are deleted
local MAX_META = 65536    -- largest meta block accepted, bytes
local MAX_SECTIONS = 64   -- most sections in one file
local MAX_NAME = 255      -- longest section name, bytes
local NAME_PATTERN = "^ckpt%-(%d+)%.bin$"

-- C functions for durable writes and directory listing. Each declaration is
-- made on its own so that one another module already made is no error.
local CDEFS = {
  "int open(const char *path, int flags, int mode);",
  "long write(int fd, const void *buf, unsigned long n);",
  "int fsync(int fd);",
  "int close(int fd);",
  "int mkdir(const char *path, unsigned int mode);",
  "char *strerror(int errnum);",
  "int getpid(void);",
  -- glibc's struct dirent on 64-bit Linux.
  "struct mn_ckpt_dirent { uint64_t d_ino; int64_t d_off; unsigned short d_reclen; unsigned char d_type; char d_name[256]; };",
  "void *opendir(const char *name);",
  "struct mn_ckpt_dirent *readdir(void *dir);",
  "int closedir(void *dir);",
}
for _, d in ipairs(CDEFS) do pcall(ffi.cdef, d) end
local C = ffi.C
local O_WRONLY, O_CREAT, O_EXCL, O_RDONLY = 1, 64, 128, 0 -- Linux values (generic and x86)
local EEXIST = 17

local function os_error(what, path)
  local e = ffi.errno()
  return string.format("%s %s: %s", what, path, ffi.string(C.strerror(e))), e
end

-- ---- CRC-32 ------------------------------------------------------------------------

local crc_table = ffi.new("uint32_t[256]")
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if bit.band(c, 1) ~= 0 then c = bit.bxor(0xEDB88320, bit.rshift(c, 1)) else c = bit.rshift(c, 1) end
  end
  crc_table[i] = c
end

--- CRC-32 of s (continuing from crc, default 0), as zlib's crc32() computes it.
function M.crc32(s, crc)
  local c = bit.bnot(crc or 0)
  local p = ffi.cast("const uint8_t *", s)
  for i = 0, #s - 1 do
    c = bit.bxor(crc_table[bit.band(bit.bxor(c, p[i]), 0xff)], bit.rshift(c, 8))
  end
  return tonumber(ffi.cast("uint32_t", bit.bnot(c)))
end

-- ---- encoding ---------------------------------------------------------------------------

local function u16(n) return string.char(n % 256, math.floor(n / 256) % 256) end
local function u32(n)
  return string.char(n % 256, math.floor(n / 256) % 256, math.floor(n / 65536) % 256, math.floor(n / 16777216) % 256)
end
local function u64(n) return u32(n % 4294967296) .. u32(math.floor(n / 4294967296)) end

local function meta_text(meta)
  local keys = {}
  for k in pairs(meta or {}) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  local lines = {}
  for _, k in ipairs(keys) do
    local v = tostring(meta[k])
    if k:find("[=\n]") or v:find("\n") then error("checkpoint meta '" .. k .. "' may hold no '=' in its key and no newline", 3) end
    lines[#lines + 1] = k .. "=" .. v .. "\n"
  end
  return table.concat(lines)
end

--- The header of a checkpoint of `step` with meta {k = v} and sections
-- {{name, nbytes}}: every byte before the CRC-32, which covers it and the
-- payload. A proc that writes its own shard appends the rest (kernels/cpu/shard.c).
function M.head(step, meta, sections)
  if type(step) ~= "number" or step < 0 or step ~= math.floor(step) or step >= 2 ^ 53 then
    error("checkpoint step must be a non-negative integer, got " .. tostring(step), 3)
  end
  local text = meta_text(meta)
  if #text > MAX_META then error("checkpoint meta is " .. #text .. " bytes; at most " .. MAX_META, 3) end
  if #sections > MAX_SECTIONS then error("checkpoint has " .. #sections .. " sections; at most " .. MAX_SECTIONS, 3) end
  local head = { M.MAGIC, u32(M.VERSION), u64(step), u32(#text), text, u32(#sections) }
  for i, sec in ipairs(sections) do
    if type(sec.name) ~= "string" or #sec.name == 0 or #sec.name > MAX_NAME or type(sec.nbytes) ~= "number" then
      error("checkpoint section " .. i .. " needs a name (1 to " .. MAX_NAME .. " bytes) and bytes (a string)", 3)
    end
    head[#head + 1] = u16(#sec.name) .. sec.name .. u64(sec.nbytes)
  end
  return table.concat(head)
end

--- Encodes a checkpoint record {step, meta = {k = v}, sections = {{name, bytes}}} as a string.
function M.encode(ck)
  local secs, payload = {}, {}
  for i, s in ipairs(ck.sections or {}) do
    if type(s.bytes) ~= "string" then error("checkpoint section " .. i .. " needs a name (1 to " .. MAX_NAME ..
      " bytes) and bytes (a string)", 2) end
    secs[i], payload[i] = { name = s.name, nbytes = #s.bytes }, s.bytes
  end
  local h = M.head(ck.step, ck.meta, secs)
  local crc = M.crc32(h)
  for _, p in ipairs(payload) do crc = M.crc32(p, crc) end
  return h .. u32(crc) .. table.concat(payload)
end

-- A cursor over a string; each read returns nil past the end.
local function reader(s)
  local pos = 1
  local r = {}
  function r.bytes(n)
    if n < 0 or pos + n - 1 > #s then return nil end
    local v = s:sub(pos, pos + n - 1)
    pos = pos + n
    return v
  end
  function r.uint(n)
    local b = r.bytes(n)
    if not b then return nil end
    local v = 0
    for i = n, 1, -1 do v = v * 256 + b:byte(i) end
    return v
  end
  function r.pos() return pos end
  return r
end

-- Parses the header of s (the whole file, or its first bytes); returns {step, meta, sections, head_len, crc,
-- total} or nil and the reason.
local function parse_head(s, bad)
  local r = reader(s)
  if r.bytes(#M.MAGIC) ~= M.MAGIC then return bad("not a monarch checkpoint (bad magic)") end
  local version = r.uint(4)
  if version ~= M.VERSION then
    return bad("checkpoint version " .. tostring(version) .. " is not supported (this is version " .. M.VERSION .. ")")
  end
  local step, mlen = r.uint(8), r.uint(4)
  if not mlen or mlen > MAX_META then return bad("truncated or corrupt header") end
  local meta_s = r.bytes(mlen)
  local nsect = r.uint(4)
  if not meta_s or not nsect or nsect > MAX_SECTIONS then return bad("truncated or corrupt header") end
  local secs, total = {}, 0
  for i = 1, nsect do
    local nl = r.uint(2)
    local name = nl and r.bytes(nl)
    local nb = name and r.uint(8)
    if not nb then return bad("truncated or corrupt header (section " .. i .. ")") end
    secs[i] = { name = name, nbytes = nb }
    total = total + nb
  end
  local head_len = r.pos() - 1
  local crc = r.uint(4)
  if not crc then return bad("truncated header") end
  local meta = {}
  for k, v in meta_s:gmatch("([^=\n]*)=([^\n]*)\n") do meta[k] = v end
  return { step = step, meta = meta, sections = secs, head_len = head_len, crc = crc, total = total }
end

--- Decodes a checkpoint; returns the record, or nil and the reason it is not valid.
-- where (a file name) prefixes the reason.
function M.decode(s, where)
  where = where or "checkpoint"
  local function bad(why) return nil, where .. ": " .. why end
  local h, why = parse_head(s, bad)
  if not h then return nil, why end
  local payload_at = h.head_len + 5
  if #s - payload_at + 1 ~= h.total then
    return bad(string.format("size is %d bytes but the header describes %d (truncated or padded)", #s,
      payload_at - 1 + h.total))
  end
  local got = M.crc32(s:sub(payload_at), M.crc32(s:sub(1, h.head_len)))
  if got ~= h.crc then
    return bad(string.format("checksum mismatch (stored %08x, computed %08x): the file is corrupt", h.crc, got))
  end
  local ck = { step = h.step, meta = h.meta, sections = {}, by_name = {} }
  local at = payload_at
  for i, sec in ipairs(h.sections) do
    sec.bytes = s:sub(at, at + sec.nbytes - 1)
    at = at + sec.nbytes
    ck.sections[i] = sec
    ck.by_name[sec.name] = sec.bytes
  end
  return ck
end

--- Reads only the header of the checkpoint file at path (the payload stays on disk, for the procs to read) and
-- checks the file's size against it. Returns {step, meta, sections = {{name, nbytes}}, head_len} or nil, reason.
function M.read_head(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, tostring(err) end
  local s = f:read(MAX_META + 64 + MAX_SECTIONS * (MAX_NAME + 10)) or ""
  local size = f:seek("end")
  f:close()
  local function bad(why) return nil, path .. ": " .. why end
  local h, why = parse_head(s, bad)
  if not h then return nil, why end
  if size ~= h.head_len + 4 + h.total then
    return bad(string.format("size is %d bytes but the header describes %d (truncated or padded)", size,
      h.head_len + 4 + h.total))
  end
  return h
end

-- ---- files --------------------------------------------------------------------------------

--- The file name of the checkpoint for step.
function M.filename(step) return string.format("ckpt-%09d.bin", step) end

--- Creates dir and its parents (like mkdir -p); raises on failure.
function M.mkdirs(dir)
  local path = dir:sub(1, 1) == "/" and "" or "."
  for part in dir:gmatch("[^/]+") do
    path = path .. "/" .. part
    if C.mkdir(path, tonumber("755", 8)) ~= 0 and ffi.errno() ~= EEXIST then
      error(os_error("cannot create directory", path), 2)
    end
  end
end

-- Writes s to path and syncs it to disk; returns true or nil, message.
local function write_synced(path, s)
  local fd = C.open(path, bit.bor(O_WRONLY, O_CREAT, O_EXCL), tonumber("644", 8))
  if fd < 0 then return nil, os_error("cannot create", path) end
  local off = 0
  while off < #s do
    local n = C.write(fd, ffi.cast("const char *", s) + off, #s - off)
    if n < 0 then
      local msg = os_error("cannot write", path)
      C.close(fd)
      return nil, msg
    end
    off = off + tonumber(n)
  end
  if C.fsync(fd) ~= 0 then
    local msg = os_error("cannot sync", path)
    C.close(fd)
    return nil, msg
  end
  if C.close(fd) ~= 0 then return nil, os_error("cannot close", path) end
  return true
end

-- Syncs a directory so that a rename in it survives a crash (best effort: not every filesystem allows it).
local function sync_dir(dir)
  local fd = C.open(dir, O_RDONLY, 0)
  if fd >= 0 then
    C.fsync(fd)
    C.close(fd)
  end
end

--- The names in directory dir (unsorted; "." and ".." included); {} if it does not exist.
function M.entries(dir)
  local d = C.opendir(dir)
  local out = {}
  if d == nil then return out end
  while true do
    local e = C.readdir(d)
    if e == nil then break end
    out[#out + 1] = ffi.string(e.d_name)
  end
  C.closedir(d)
  return out
end

--- Lists the checkpoint files in dir as {step, path}, oldest first; {} if dir does not exist.
function M.list(dir)
  local out = {}
  for _, name in ipairs(M.entries(dir)) do
    local step = name:match(NAME_PATTERN)
    if step then out[#out + 1] = { step = tonumber(step), path = dir .. "/" .. name } end
  end
  table.sort(out, function(a, b) return a.step < b.step end)
  return out
end

--- Writes ck into dir as ckpt-<step>.bin atomically, then deletes all but the
-- newest opts.keep (default KEEP) checkpoints. Returns the path; raises on failure.
function M.write(dir, ck, opts)
  local keep = (opts and opts.keep) or M.KEEP
  if type(keep) ~= "number" or keep < 1 then error("checkpoint keep must be at least 1", 2) end
  M.mkdirs(dir)
  local data = M.encode(ck)
  local path = dir .. "/" .. M.filename(ck.step)
  local tmp = string.format("%s/.%s.tmp.%d", dir, M.filename(ck.step), C.getpid())
  os.remove(tmp) -- a leftover of a crashed writer with our pid
  local ok, err = write_synced(tmp, data)
  if not ok then
    os.remove(tmp)
    error("checkpoint: " .. err, 2)
  end
  local rok, rerr = os.rename(tmp, path)
  if not rok then
    os.remove(tmp)
    error("checkpoint: cannot rename " .. tmp .. " to " .. path .. ": " .. tostring(rerr), 2)
  end
  sync_dir(dir)
  local all = M.list(dir)
  for i = 1, #all - keep do os.remove(all[i].path) end
  return path
end

--- Reads and validates one checkpoint file; returns the record or nil, reason.
function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, "cannot open checkpoint " .. tostring(err) end
  local s = f:read("*a")
  f:close()
  return M.decode(s, path)
end

--- The newest valid checkpoint in dir: record, path. Corrupt files are
-- skipped with their reasons in the third result (a list of strings);
-- with none valid, returns nil and a message that lists every reason.
function M.latest(dir)
  local all = M.list(dir)
  local rejected = {}
  for i = #all, 1, -1 do
    local ck, why = M.read(all[i].path)
    if ck then return ck, all[i].path, rejected end
    rejected[#rejected + 1] = why
  end
  if #all == 0 then return nil, "no checkpoint (ckpt-*.bin) in " .. dir, rejected end
  return nil, "no valid checkpoint in " .. dir .. ":\n  " .. table.concat(rejected, "\n  "), rejected
end

return M
