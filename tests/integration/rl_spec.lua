-- The RL example end to end: CartPole environments as actors on real procs,
-- the learner on the controller (examples/rl/).
local monarch = require "monarch"

package.path = "examples/?.lua;" .. package.path
local trainer = require "rl.trainer"

-- Stops `rank`'s proc for real: SIGKILL, as a crash would.
local function kill(procs, rank)
  for _, p in ipairs(procs:procs()) do
    if p.rank == rank then os.execute("kill -KILL " .. p.pid) end
  end
end

describe("examples/rl/run.lua", function()
  it("solves CartPole-v0 as a user runs it, through a killed env proc", function()
    local B = os.getenv("MONARCH_BUILD") or "build"
    local f = io.popen("timeout 120 " .. B .. "/bin/monarch-run examples/rl/run.lua --procs 2 --kill-at 5 2>&1; echo rc=$?")
    local out = f:read("*a")
    f:close()
    assert.matches("update   10  episodes", out, 1, true)
    assert.matches("env proc rank 1 failed (killed by SIGKILL): dropped its rollout in flight; continuing on the others",
      out, 1, true)
    assert.matches("solved: mean return 19%d%.%d over the last 100 episodes after %d+ episodes, [%d.]+ s wall", out)
    assert.matches("1 env proc failure(s)", out, 1, true)
    assert.matches("rc=0\n$", out)
  end)
end)

describe("CartPole rollouts on actors", function()
  it("produce episodes and drive learner updates (smoke run)", function()
    local procs = monarch.hosts():spawn_procs { procs = 2 }
    local s = trainer.train { procs = procs, envs = 8, max_updates = 5, max_seconds = 20 }
    assert.are.equal(5, s.updates)
    assert.are.equal(5, s.version)
    assert.is_true(s.episodes >= 5 * 16)
    assert.is_true(s.env_steps > 0)
    assert.is_true(s.episodes_by_rank[0] > 0 and s.episodes_by_rank[1] > 0)
    assert.is_true(s.mean100 >= 8 and s.mean100 <= 200) -- CartPole returns: 8 at worst, 200 at best
    assert.are.equal(0, #s.failures)
    local st = s.actors:call("stats"):get()
    for _, v in st:items() do assert.are.equal(8, v.envs) end
    procs:stop()
  end)

  it("learn to balance the pole: mean return >= 195 over 100 episodes", function()
    local procs = monarch.hosts():spawn_procs { procs = 2 }
    local s = trainer.train { procs = procs, envs = 16, seed = 3, max_seconds = 60 }
    assert.is_true(s.solved, "not solved: mean100 " .. s.mean100 .. " after " .. s.episodes .. " episodes")
    assert.is_true(s.solved_mean >= 195)
    procs:stop()
  end)

  it("go on with the other env procs when one is killed", function()
    local procs = monarch.hosts():spawn_procs { procs = 3 }
    local killed_at, after = nil, nil
    local s = trainer.train {
      procs = procs, envs = 8, max_seconds = 30,
      on_update = function(st)
        if st.updates == 3 then
          killed_at = st.episodes_by_rank[1] or 0
          kill(procs, 2)
        end
      end,
      stop_when = function(st)
        if #st.failures > 0 and not after then after = st.updates end
        return after ~= nil and st.updates >= after + 10
      end,
    }
    assert.are.equal(1, #s.failures)
    assert.are.equal("proc_failed", s.failures[1].kind)
    assert.are.equal(2, s.failures[1].rank)
    assert.is_true(s.episodes_by_rank[1] > killed_at) -- the survivors kept producing
    assert.is_true(s.updates >= after + 10)
    procs:stop()
  end)

  it("go on with a restarted env proc and its respawned actor", function()
    local procs = monarch.hosts():spawn_procs { procs = 2 }:options { restart = true }
    local before_restart, pid
    -- The kill is seen by the mesh whether or not a rollout was in flight on it
    -- at that moment (on a slow, sanitized build it may have been idle).
    local lost = 0
    procs:on_failure(function() lost = lost + 1 end)
    local s = trainer.train {
      procs = procs, envs = 8, max_seconds = 30,
      on_update = function(st)
        if st.updates == 3 then
          pid = procs:procs()[2].pid
          kill(procs, 1)
        end
      end,
      stop_when = function(st)
        if lost > 0 and not before_restart then before_restart = st.episodes_by_rank[1] or 0 end
        return before_restart ~= nil and (st.episodes_by_rank[1] or 0) > before_restart + 20
      end,
    }
    assert.are.equal(1, lost)
    assert.is_true(#s.failures <= 1)
    assert.are_not.equal(pid, procs:procs()[2].pid) -- a new process
    assert.is_true(s.episodes_by_rank[1] > before_restart + 20)
    procs:stop()
  end)
end)
