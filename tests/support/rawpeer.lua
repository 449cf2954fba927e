-- rawpeer: a hand-driven peer for tests that speak the wire protocol badly
-- on purpose. Raw TCP through LuaJIT's FFI, HMAC through libsodium, so a
-- test can authenticate correctly and then misbehave.
local ffi = require "ffi"
ffi.cdef [[
  typedef uint32_t socklen_t;
  struct sockaddr_in { uint16_t sin_family; uint16_t sin_port; uint32_t sin_addr; char zero[8]; };
  struct pollfd { int fd; short events; short revents; };
  int socket(int, int, int);
  int connect(int, const void *, socklen_t);
  long send(int, const void *, size_t, int);
  long recv(int, void *, size_t, int);
  int poll(struct pollfd *, unsigned long, int);
  int listen(int, int);
  int accept(int, void *, void *);
  int close(int);
  int inet_pton(int, const char *, void *);
  int sodium_init(void);
  int crypto_generichash(unsigned char *, size_t, const unsigned char *, unsigned long long, const unsigned char *, size_t);
  int crypto_auth_hmacsha256(unsigned char *, const unsigned char *, unsigned long long, const unsigned char *);
]]
local C = ffi.C
local sodium = ffi.load("sodium")
assert(sodium.sodium_init() >= 0)

local M = {}

-- The protocol version these frames carry: the core's own (MN_PROTOCOL_VERSION), so a bump cannot leave
-- the raw frames behind.
M.VERSION = require("monarch.core").protocol_version
local V = string.char(M.VERSION)
local Peer = {}
Peer.__index = Peer

--- Connects to 127.0.0.1:port; returns a Peer or raises.
function M.connect(port)
  local fd = C.socket(2, 1, 0)
  assert(fd >= 0, "socket failed")
  local sa = ffi.new("struct sockaddr_in")
  sa.sin_family = 2
  sa.sin_port = bit.bor(bit.rshift(port, 8), bit.lshift(bit.band(port, 0xff), 8))
  C.inet_pton(2, "127.0.0.1", ffi.cast("void *", ffi.cast("char *", sa) + 4))
  assert(C.connect(fd, sa, ffi.sizeof(sa)) == 0, "connect failed")
  return setmetatable({ fd = fd, buf = "" }, Peer)
end

-- Each on its own: a spec may have declared them already.
pcall(ffi.cdef, "int bind(int, const void *, socklen_t);")
pcall(ffi.cdef, "int getsockname(int, void *, socklen_t *);")

local Listener = {}
Listener.__index = Listener

--- Listens on 127.0.0.1 on a port the kernel picks: {port} with :accept(timeout) and :close().
function M.listen()
  local fd = C.socket(2, 1, 0)
  local sa = ffi.new("struct sockaddr_in")
  sa.sin_family = 2
  C.inet_pton(2, "127.0.0.1", ffi.cast("void *", ffi.cast("char *", sa) + 4))
  assert(C.bind(fd, sa, ffi.sizeof(sa)) == 0 and C.listen(fd, 8) == 0, "bind or listen failed")
  local len = ffi.new("socklen_t[1]", ffi.sizeof(sa))
  assert(C.getsockname(fd, sa, len) == 0)
  local port = bit.bor(bit.lshift(bit.band(sa.sin_port, 0xff), 8), bit.rshift(sa.sin_port, 8))
  return setmetatable({ fd = fd, port = port }, Listener)
end

--- The next connection within timeout seconds, as a Peer; nil on timeout.
function Listener:accept(timeout)
  local pfd = ffi.new("struct pollfd", { fd = self.fd, events = 1 })
  if C.poll(pfd, 1, math.floor((timeout or 2) * 1000)) <= 0 then return nil end
  local fd = C.accept(self.fd, nil, nil)
  assert(fd >= 0, "accept failed")
  return setmetatable({ fd = fd, buf = "" }, Peer)
end

function Listener:close() C.close(self.fd) end

function Peer:send(bytes)
  return tonumber(C.send(self.fd, bytes, #bytes, 0x4000)) -- MSG_NOSIGNAL
end

--- Reads one frame body within timeout seconds; nil, "closed" | "timeout".
function Peer:read_frame(timeout)
  local deadline = os.clock() + (timeout or 2)
  local tmp = ffi.new("char[65536]")
  while true do
    if #self.buf >= 4 then
      local b1, b2, b3, b4 = self.buf:byte(1, 4)
      local n = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
      if #self.buf >= 4 + n then
        local body = self.buf:sub(5, 4 + n)
        self.buf = self.buf:sub(5 + n)
        return body
      end
    end
    local pfd = ffi.new("struct pollfd", { fd = self.fd, events = 1 })
    local r = C.poll(pfd, 1, math.max(0, math.floor((deadline - os.clock()) * 1000)))
    if r == 0 then return nil, "timeout" end
    local got = tonumber(C.recv(self.fd, tmp, 65536, 0))
    if got <= 0 then return nil, "closed" end
    self.buf = self.buf .. ffi.string(tmp, got)
  end
end

--- True once the peer has closed the connection (within timeout seconds).
function Peer:closed(timeout)
  local body, why = self:read_frame(timeout or 2)
  while body do body, why = self:read_frame(timeout or 2) end
  return why == "closed"
end

function Peer:close() C.close(self.fd) end

-- ---- encoding helpers (just what the tests need) ----------------------------

function M.frame(body)
  local n = #body
  return string.char(bit.band(bit.rshift(n, 24), 255), bit.band(bit.rshift(n, 16), 255),
    bit.band(bit.rshift(n, 8), 255), bit.band(n, 255)) .. body
end

function M.bin32(s)
  assert(#s == 32)
  return "\xc4\x20" .. s
end

--- Extracts the 32-byte nonce of a HELLO body: [1, version, bin32 nonce, role].
function M.hello_nonce(body)
  assert(body:byte(1) == 0x94 and body:byte(2) == 1, "not a HELLO")
  local i = body:find("\xc4\x20", 3, true)
  return body:sub(i + 2, i + 33)
end

local function mac(token, role, a, b)
  local key = ffi.new("unsigned char[32]")
  sodium.crypto_generichash(key, 32, token, #token, nil, 0)
  local out = ffi.new("unsigned char[32]")
  local msg = role .. a .. b
  sodium.crypto_auth_hmacsha256(out, msg, #msg, key)
  return ffi.string(out, 32)
end

--- AUTH frame answering a HELLO nonce with `token` (right or wrong).
function M.auth_frame(token, server_nonce, client_nonce)
  client_nonce = client_nonce or string.rep("n", 32)
  return M.frame("\x94\x02" .. V .. M.bin32(client_nonce) .. M.bin32(mac(token, "c", server_nonce, client_nonce)))
end

local function str(s)
  if #s < 32 then return string.char(0xa0 + #s) .. s end
  assert(#s < 256)
  return "\xd9" .. string.char(#s) .. s
end

--- JOIN frame answering a join port's HELLO nonce with `token` (right or
-- wrong), asking to be dialled at addr ("HOST:PORT").
function M.join_frame(token, join_nonce, addr, agent_nonce)
  agent_nonce = agent_nonce or string.rep("a", 32)
  return M.frame("\x95\x20" .. V .. M.bin32(agent_nonce) .. str(addr) ..
    M.bin32(mac(token, "j", join_nonce, agent_nonce .. addr)))
end

--- A join port's HELLO frame with this nonce.
function M.join_hello_frame(join_nonce)
  return M.frame("\x94\x01" .. V .. M.bin32(join_nonce) .. "\xa4join")
end

--- The agent's nonce of a JOIN body: [32, version, bin32 nonce_a, addr, mac].
function M.join_nonce(body)
  assert(body:byte(1) == 0x95 and body:byte(2) == 0x20 and body:sub(4, 5) == "\xc4\x20", "not a JOIN")
  return body:sub(6, 37)
end

--- JOINED frame answering a JOIN, as a controller holding `token` does.
function M.joined_frame(token, join_nonce, agent_nonce)
  return M.frame("\x92\x21" .. M.bin32(mac(token, "J", agent_nonce, join_nonce)))
end

--- The role a HELLO body names ("agent", "proc", "join").
function M.hello_role(body)
  return body:match("[\xa0-\xbf]([%a]+)$")
end

--- Returns the error message of an ERROR body [4, code, msg], or nil.
function M.error_message(body)
  if not body or body:byte(2) ~= 4 then return nil end
  local i = body:find("[\xa0-\xbf\xd9]", 4)
  if not i then return "" end
  local b = body:byte(i)
  if b == 0xd9 then return body:sub(i + 2, i + 1 + body:byte(i + 1)) end
  return body:sub(i + 1, i + b - 0xa0)
end

return M
