-- gen_corpus.lua: writes the seed corpora of the libFuzzer targets.
--   luajit tests/fuzz/gen_corpus.lua [dir]     (dir defaults to tests/fuzz/corpus)
-- A handful of small valid and invalid inputs per target, each named for
-- what it is. Deterministic: running it again rewrites the same files.
-- Seeds marked F1, F2, F6 reproduce bugs the fuzzers found (docs/security.md),
-- so that a regression fails at the start of every run.
local bit = require "bit"

local out = arg[1] or "tests/fuzz/corpus"

-- ---- a minimal msgpack encoder (what the seeds need, nothing more) --------

local function be(n, bytes)
  local t = {}
  for i = bytes, 1, -1 do
    t[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(t)
end

local mp = {}
local NIL, TRUE, FALSE = {}, {}, {}
mp.NIL, mp.TRUE, mp.FALSE = NIL, TRUE, FALSE

--- A bin value (a plain Lua string encodes as str).
function mp.bin(s) return { bin = s } end
--- A tensor handle: ext type 1, 8-byte big-endian id.
function mp.tensor(id) return { ext = 1, data = be(id, 8) } end
--- A float64.
function mp.f64(x) return { f64 = x } end
--- A map from a list of {key, value} pairs (keeps the order).
function mp.map(pairs_) return { map = pairs_ } end

local function enc(v)
  if v == NIL then return "\xc0" end
  if v == TRUE then return "\xc3" end
  if v == FALSE then return "\xc2" end
  local t = type(v)
  if t == "number" then
    assert(v == math.floor(v), "use mp.f64 for non-integers")
    if v >= 0 and v < 128 then return string.char(v) end
    if v < 0 and v >= -32 then return string.char(256 + v) end
    if v >= 0 and v < 65536 then return "\xcd" .. be(v, 2) end
    if v >= 0 then return "\xce" .. be(v, 4) end
    return "\xd2" .. be(2 ^ 32 + v, 4)
  elseif t == "string" then
    if #v < 32 then return string.char(0xa0 + #v) .. v end
    return "\xd9" .. string.char(#v) .. v
  elseif v.bin then
    return "\xc4" .. string.char(#v.bin) .. v.bin
  elseif v.i64 then
    return "\xd3" .. v.i64 -- int64, 8 raw big-endian bytes
  elseif v.ext then
    return "\xd7" .. string.char(v.ext) .. v.data -- fixext 8
  elseif v.f64 then
    local ffi = require "ffi"
    local d = ffi.new("double[1]", v.f64)
    local b = ffi.string(ffi.cast("const char *", d), 8)
    return "\xcb" .. b:reverse() -- little-endian host to big-endian wire
  elseif v.map then
    local s = { string.char(0x80 + #v.map) }
    for _, kv in ipairs(v.map) do s[#s + 1] = enc(kv[1]) .. enc(kv[2]) end
    return table.concat(s)
  else
    assert(#v < 16, "fixarray only")
    local s = { string.char(0x90 + #v) }
    for i = 1, #v do s[#s + 1] = enc(v[i]) end
    return table.concat(s)
  end
end

local function frame(body) return be(#body, 4) .. body end
local function msg(t) return frame(enc(t)) end

local nonce = string.rep("\x5a", 32)
local mac = string.rep("\xa5", 32)

-- ---- writing ---------------------------------------------------------------

local count = 0
local function put(target, name, bytes)
  os.execute("mkdir -p '" .. out .. "/" .. target .. "'")
  local f = assert(io.open(out .. "/" .. target .. "/" .. name, "wb"))
  f:write(bytes)
  f:close()
  count = count + 1
end

-- ---- fuzz_frame: byte streams as a peer sends them -------------------------

local F = "fuzz_frame"
put(F, "hello", msg { 1, 1, mp.bin(nonce), "proc" })
put(F, "auth", msg { 2, 1, mp.bin(nonce), mp.bin(mac) })
put(F, "welcome", msg { 3, mp.bin(mac), mp.map { { "hostname", "h" }, { "pid", 42 }, { "role", "proc" } } })
put(F, "error", msg { 4, 1005, "protocol error" })
put(F, "ping_pong", msg { 5, 7 } .. msg { 6, 7 })
put(F, "session_ack_call", msg { 22, 99, 0 } .. msg { 24, 3 } .. msg { 20, 1, "noop", {} })
put(F, "spawn", msg { 10, 1, mp.map { { "count", 2 }, { "rank0", 0 } } })
put(F, "result", msg { 21, 1, TRUE, { mp.f64(2.5), "s", NIL } })
put(F, "zero_length", "\0\0\0\0")
put(F, "oversized_prefix", "GET / HTTP/1.1\r\n\r\n")
put(F, "truncated", "\0\0\0\40\x94\x02")
put(F, "reserved_byte", frame "\xc1\xc1\xc1")
put(F, "trailing_bytes", frame(enc { 5, 1 } .. "\x00"))
put(F, "not_an_array", frame(enc "text"))
put(F, "empty_array", frame "\x90")
put(F, "deep_nesting", frame(("\x91"):rep(20) .. "\x01"))
put(F, "huge_array_count", frame "\xdd\x7f\xff\xff\xff") -- F1: 5 bytes asking for 48 GiB
put(F, "huge_map_count", frame "\xdf\x00\x10\x00\x01")
put(F, "huge_str_len", frame "\x92\x01\xdb\xff\xff\xff\xff")

-- ---- fuzz_handshake: first byte is the mode --------------------------------

local H = "fuzz_handshake"
put(H, "server_auth_wrong_mac", "\0" .. msg { 2, 1, mp.bin(nonce), mp.bin(mac) })
put(H, "server_spawn_not_auth", "\0" .. msg { 10, 1, mp.map { { "count", 1 } } })
put(H, "server_short_nonce", "\0" .. msg { 2, 1, mp.bin "abc", mp.bin(mac) })
put(H, "server_old_version", "\0" .. msg { 2, 9, mp.bin(nonce), mp.bin(mac) })
put(H, "server_garbage", "\0" .. "GET / HTTP/1.1\r\n\r\n")
put(H, "client_hello_welcome", "\1" .. msg { 1, 1, mp.bin(nonce), "agent" } .. msg { 3, mp.bin(mac), mp.map {} })
put(H, "client_error", "\1" .. msg { 4, -1006, "authentication failed: wrong cluster token" })
put(H, "client_not_hello", "\1" .. msg { 21, 1, TRUE, {} })
put(H, "server_huge_array_count", "\0" .. frame "\xdd\x7f\xff\xff\xff") -- F1
-- Structured modes: zeros build a valid message with a right MAC, so the
-- fuzzer starts from the success path; the others damage one field each.
put(H, "server_structured_valid", "\2" .. ("\0"):rep(80))
put(H, "server_structured_bitflip", "\2" .. ("\0"):rep(35) .. "\1\3\5" .. ("\0"):rep(40))
put(H, "client_structured_valid", "\3\1" .. ("\0"):rep(90))
put(H, "client_structured_error", "\3\0\2" .. "refused by the server")

-- ---- fuzz_join: first byte is the mode (0, 1, 2) ---------------------------

local J = "fuzz_join"
put(J, "controller_join_wrong_mac", "\0" .. msg { 32, 1, mp.bin(nonce), "10.0.0.7:7000", mp.bin(mac) })
put(J, "controller_auth_not_join", "\0" .. msg { 2, 1, mp.bin(nonce), mp.bin(mac) })
put(J, "controller_bad_addr", "\0" .. msg { 32, 1, mp.bin(nonce), "localhost:7000", mp.bin(mac) })
put(J, "controller_garbage", "\0" .. "GET / HTTP/1.1\r\n\r\n")
put(J, "agent_hello_joined", "\1" .. msg { 1, 1, mp.bin(nonce), "join" } .. msg { 33, mp.bin(mac) })
put(J, "agent_hello_of_an_agent", "\1" .. msg { 1, 1, mp.bin(nonce), "agent" })
put(J, "agent_refused", "\1" .. msg { 1, 1, mp.bin(nonce), "join" } .. msg { 4, -1006, "authentication failed" })
-- Structured: zeros build a valid JOIN for a valid address; then a damaged MAC, an address of raw bytes.
put(J, "structured_valid", "\2" .. ("\0"):rep(40))
put(J, "structured_bitflip", "\2" .. ("\0"):rep(35) .. "\1\3\5" .. ("\0"):rep(10))
put(J, "structured_raw_addr", "\2" .. ("\0"):rep(33) .. "\x80\x0e" .. "10.0.0.1:70000" .. ("\0"):rep(4))

-- ---- fuzz_exec: first byte is the mode (even: raw CALL frames) -------------

local X = "fuzz_exec"
local function calls(list)
  local s = { "\0" }
  for i, c in ipairs(list) do s[#s + 1] = msg { 20, i, c[1], c[2] or {} } end
  return table.concat(s)
end
put(X, "noop", calls { { "noop" } })
put(X, "echo_all_types", calls { { "echo", { NIL, TRUE, 7, -3, mp.f64(0.5), "str", mp.bin "\0\1" } } })
put(X, "tensor_life", calls {
  { "__tensor_new", { 1, "f32", { 4, 4 } } }, { "fill", { mp.tensor(1), mp.f64(2.5) } },
  { "sum", { mp.tensor(1) } }, { "iota", { mp.tensor(1) } }, { "scale", { mp.tensor(1), 2 } },
  { "__tensor_fetch", { mp.tensor(1) } }, { "__tensor_free", { 1 } },
})
put(X, "axpy_dot_sgemm", calls {
  { "__tensor_new", { 1, "f32", { 2, 2 } } }, { "__tensor_new", { 2, "f32", { 2, 2 } } },
  { "__tensor_new", { 3, "f32", { 2, 2 } } }, { "axpy", { mp.f64(1.5), mp.tensor(1), mp.tensor(2) } },
  { "dot", { mp.tensor(1), mp.tensor(2) } }, { "sgemm", { mp.tensor(1), mp.tensor(2), mp.tensor(3) } },
})
put(X, "tensor_put", calls {
  { "__tensor_new", { 2, "u8", { 4 } } }, { "__tensor_put", { mp.tensor(2), mp.bin "abcd" } },
})
put(X, "builtins", calls { { "__info" }, { "__kernels" }, { "__load", { "basic" } }, { "__nope" } })
put(X, "bad_args", calls {
  { "fill", { "not a tensor", 1 } }, { "sleep", { "soon" } }, { "rank", { 1, 2, 3 } },
  { "sum", { mp.tensor(99) } }, { "nosuch" }, { "__tensor_new", { 1, "f99", { 2 } } },
})
put(X, "seq_gap", "\0" .. msg { 20, 2, "noop", {} })
put(X, "resend", "\0" .. msg { 20, 1, "noop", {} } .. msg { 20, 1, "noop", {} })
put(X, "not_a_call", "\0" .. msg { 5, 1 })
put(X, "malformed_call", "\0" .. msg { 20, 1, 7, {} })
put(X, "empty_kernel_name", "\0" .. msg { 20, 1, "", {} }) -- F2
put(X, "fetch_range_overflow", calls { -- F6: offset + INT64_MAX overflowed
  { "__tensor_new", { 1, "u8", { 4 } } }, { "__tensor_fetch", { 1, 1, { i64 = "\x7f\xff\xff\xff\xff\xff\xff\xff" } } },
})
put(X, "huge_args_count", "\0" .. frame "\x94\x14\x01\xa4noop\xdd\x04\x00\x00\x00") -- F1
put(X, "raw_body", "\0" .. enc { 20, 1, "echo", { "x" } })
put(X, "structured_zeros", "\1" .. ("\0"):rep(64))
put(X, "structured_mixed", "\1" .. ("\1\2\3\4\5\6\7\8\9\10\11\12\13\14\15"):rep(8))

print(string.format("gen_corpus: wrote %d seeds under %s", count, out))
