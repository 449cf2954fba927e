-- tests/support/netns.lua: real network cuts for specs, made with network namespaces
-- (needs root and iproute2; `netns.check` says why not). Two layouts:
--
--   local netns = require "support.netns"
--   -- one host behind a veth pair; the cut takes the whole link down
--   local p = netns.pair{ ns = netns.name("mn_part"), host_if = ..., ns_if = ..., net = netns.subnet(64) }
--   p:down() ... p:up() ... p:destroy()
--   -- several hosts on one bridge; a cut drops the traffic of two of them only
--   local b = netns.bridge{ tag = "mnt", hosts = 4, net = netns.subnet(128) }
--   b:cut(1, 2) ... b:heal(1, 2) ... b:destroy()   -- host 0 is this namespace (b.host_ip)
--
-- Every name carries this process's pid, so suites running side by side
-- (other checkouts on one machine) never share a namespace, an interface or a
-- subnet.
local sh = require("support.shell").quiet

local M = {}

local ffi = require "ffi"
pcall(ffi.cdef, "int getpid(void);") -- another spec may have declared it
M.ID = ffi.C.getpid()

--- prefix followed by this process's pid.
function M.name(prefix) return prefix .. M.ID end

--- "10.X.Y" for this process: X in base .. base+63, Y below 250. Specs pass distinct bases so that the
-- subnets of one process do not overlap either.
function M.subnet(base) return string.format("10.%d.%d", base + math.floor(M.ID / 250) % 64, M.ID % 250) end

--- true, or false and why this machine cannot make namespaces (probing with namespace ns).
function M.check(ns)
  if not sh("id -u | grep -qx 0") then return false, "not root" end
  if not sh("command -v ip") then return false, "iproute2 (ip) not installed" end
  sh("ip netns del " .. ns)
  if not sh("ip netns add " .. ns) then return false, "ip netns add failed (no network namespace support)" end
  sh("ip netns del " .. ns)
  return true
end

--- How many processes run in namespace ns.
function M.pids(ns)
  local f = io.popen("ip netns pids " .. ns .. " 2>/dev/null")
  local s = f:read("*a")
  f:close()
  local n = 0
  for _ in s:gmatch("%d+") do n = n + 1 end
  return n
end

--- Kills (SIGKILL) every process in namespace ns.
function M.kill_all(ns) sh("ip netns pids " .. ns .. " 2>/dev/null | xargs -r kill -9") end

-- ---- one host behind a veth pair ----------------------------------------------

local Pair = {}
Pair.__index = Pair

--- Namespace opts.ns, linked to this one by veth opts.host_if (address net.1) <-> opts.ns_if (net.2).
-- Leftovers of those names are removed first. Returns {ns, host_ip, ns_ip, wrap} with :down(), :up(),
-- :destroy(); raises if a step fails.
function M.pair(opts)
  local p = setmetatable({ ns = opts.ns, host_if = opts.host_if, ns_if = opts.ns_if,
    host_ip = opts.net .. ".1", ns_ip = opts.net .. ".2", wrap = "ip netns exec " .. opts.ns }, Pair)
  sh("ip netns del " .. p.ns)
  sh("ip link del " .. p.host_if)
  assert(sh("ip netns add " .. p.ns))
  assert(sh(("ip link add %s type veth peer name %s"):format(p.host_if, p.ns_if)))
  assert(sh(("ip link set %s netns %s"):format(p.ns_if, p.ns)))
  assert(sh(("ip addr add %s/24 dev %s && ip link set %s up"):format(p.host_ip, p.host_if, p.host_if)))
  assert(sh(("ip netns exec %s sh -c 'ip addr add %s/24 dev %s && ip link set %s up && ip link set lo up'")
    :format(p.ns, p.ns_ip, p.ns_if, p.ns_if)))
  return p
end

--- Cuts the link (our end down); true if it worked.
function Pair:down() return sh("ip link set " .. self.host_if .. " down") end

--- Heals it; true if it worked.
function Pair:up() return sh("ip link set " .. self.host_if .. " up") end

--- Kills what runs in the namespace and removes it and the veth. Safe to call twice.
function Pair:destroy()
  self:up()
  M.kill_all(self.ns)
  sh("ip netns del " .. self.ns)
  sh("ip link del " .. self.host_if)
end

-- ---- several hosts on one bridge ----------------------------------------------

-- A cut points the two ends' neighbour entries for each other at this address, which no interface has:
-- their frames still leave, and the bridge floods them to ports that drop them. Nothing is refused or
-- reset, as when a switch between two hosts loses their traffic; every other pair still talks. (A packet
-- filter would do the same, but iptables and tc's classifiers are often missing where iproute2 is not.)
local NOWHERE = "02:00:00:00:00:01"

local Bridge = {}
Bridge.__index = Bridge

-- Removes what an earlier run of this tag left behind if that process is gone (killed by a timeout before
-- its own cleanup ran); another live process's namespaces are left alone.
local function sweep(tag)
  local f = io.popen("ip -o link show type bridge 2>/dev/null; ip netns list 2>/dev/null")
  local s = f:read("*a")
  f:close()
  local gone = {}
  for pid in s:gmatch(tag .. "(%d+)") do
    if tonumber(pid) ~= M.ID and not sh("kill -0 " .. pid) then gone[pid] = true end
  end
  for pid in pairs(gone) do
    for ns in s:gmatch("(" .. tag .. pid .. "n%d+)") do
      M.kill_all(ns)
      sh("ip netns del " .. ns)
    end
    sh("ip link del " .. tag .. pid .. "br")
  end
end

--- opts.hosts namespaces, each with one veth on a bridge in this namespace. Names: bridge TAG<pid>br,
-- namespace i TAG<pid>n<i>, veth TAG<pid>h<i> (here) <-> TAG<pid>v<i> (there); addresses net.1 (here,
-- host 0), net.(i+1) (host i). tag: at most 3 characters (interface names have 15). Returns
-- {hosts = {{ns, ip, wrap, dev}, ...}, host_ip, dev} with :cut(a, b), :heal(a, b), :heal_all() and
-- :destroy(); raises if a step fails (after removing what it made).
function M.bridge(opts)
  assert(#opts.tag <= 3 and opts.hosts <= 99, "netns.bridge: tag of at most 3 characters, at most 99 hosts")
  sweep(opts.tag)
  local pre = opts.tag .. M.ID
  local b = setmetatable({ pre = pre, dev = pre .. "br", host_ip = opts.net .. ".1", hosts = {}, cuts = {} }, Bridge)
  for i = 1, opts.hosts do
    local ns = pre .. "n" .. i
    b.hosts[i] = { ns = ns, ip = opts.net .. "." .. (i + 1), wrap = "ip netns exec " .. ns, dev = pre .. "v" .. i,
      host_dev = pre .. "h" .. i }
  end
  b:destroy() -- leftovers of these very names
  -- and of a refusing cut made here by a run killed before it healed (a route outlives the bridge)
  local f = io.popen("ip -o route show type unreachable 2>/dev/null")
  local routes = f:read("*a")
  f:close()
  for ip in routes:gmatch("unreachable (" .. opts.net:gsub("%.", "%%.") .. "%.%d+)") do
    sh("ip route del unreachable " .. ip .. "/32")
  end
  local ok, err = pcall(function()
    assert(sh(("ip link add %s type bridge && ip addr add %s/24 dev %s && ip link set %s up")
      :format(b.dev, b.host_ip, b.dev, b.dev)), "cannot make bridge " .. b.dev)
    for _, h in ipairs(b.hosts) do
      assert(sh("ip netns add " .. h.ns), "cannot add namespace " .. h.ns)
      assert(sh(("ip link add %s type veth peer name %s && ip link set %s netns %s")
        :format(h.host_dev, h.dev, h.dev, h.ns)), "cannot make veth " .. h.host_dev)
      assert(sh(("ip link set %s master %s && ip link set %s up"):format(h.host_dev, b.dev, h.host_dev)))
      assert(sh(("%s sh -c 'ip addr add %s/24 dev %s && ip link set %s up && ip link set lo up'")
        :format(h.wrap, h.ip, h.dev, h.dev)), "cannot address " .. h.ns)
    end
  end)
  if not ok then
    b:destroy()
    error(err, 2)
  end
  return b
end

-- The namespace command prefix ("" for host 0), the device and the address of host i.
function Bridge:_end(i)
  if i == 0 then return "", self.dev, self.host_ip end
  local h = assert(self.hosts[i], "no such host")
  return h.wrap .. " ", h.dev, h.ip
end

--- Drops all traffic between hosts a and b (0 is this namespace: the controller and whatever runs here),
-- both ways, and nothing else. Unless opts.refuse, nothing tells either end: a connect waits for an
-- answer that never comes. With opts.refuse, a's own sends fail at once instead ("no route to host"), as
-- when a's interface towards b is down. Returns true if both ends took it.
function Bridge:cut(a, b, opts)
  local wa, da, ia = self:_end(a)
  local wb, db, ib = self:_end(b)
  local refuse = opts and opts.refuse
  self.cuts[a .. "-" .. b] = { a = a, b = b, refuse = refuse }
  local at_a = refuse and ("%sip route replace unreachable %s/32"):format(wa, ib)
    or ("%sip neigh replace %s lladdr %s nud permanent dev %s"):format(wa, ib, NOWHERE, da)
  return sh(at_a) and sh(("%sip neigh replace %s lladdr %s nud permanent dev %s"):format(wb, ia, NOWHERE, db))
end

--- Undoes cut(a, b): both ends reach each other again. Returns true if both ends took it.
function Bridge:heal(a, b)
  local wa, da, ia = self:_end(a)
  local wb, db, ib = self:_end(b)
  local c = self.cuts[a .. "-" .. b] or {}
  self.cuts[a .. "-" .. b] = nil
  local at_a = c.refuse and ("%sip route del unreachable %s/32"):format(wa, ib)
    or ("%sip neigh del %s dev %s"):format(wa, ib, da)
  return sh(at_a) and sh(("%sip neigh del %s dev %s"):format(wb, ia, db))
end

--- Heals every cut still in place.
function Bridge:heal_all()
  for _, c in pairs(self.cuts) do self:heal(c.a, c.b) end
end

--- Kills what runs in the namespaces, removes them (their veths go with them) and the bridge. Safe to
-- call twice, and on a bridge only half made.
function Bridge:destroy()
  self:heal_all() -- the routes and neighbours of host 0 (this namespace) go with nothing else
  for _, h in ipairs(self.hosts) do
    M.kill_all(h.ns)
    sh("ip netns del " .. h.ns)
    sh("ip link del " .. h.host_dev)
  end
  sh("ip link del " .. self.dev)
end

return M
