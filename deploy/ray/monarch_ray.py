#!/usr/bin/env python3
"""monarch_ray: the Ray side of `monarch-run --ray` (lua/monarch/launch_ray.lua).

monarch-run starts this script as its child, with a pipe on stdin and a
status file on fd 3. It reserves one placement-group bundle per host
(STRICT_SPREAD: one bundle per Ray node), runs a long-lived actor in each
bundle, and has every actor start `monarch-worker --join CONTROLLER` as its
child process: the agents join the controller's join port like any host.
With --elastic, nodes that appear in the cluster later get an actor and an
agent too, and so join the running job.

The cluster token comes on the first line of stdin (never argv, never a
file), goes to each actor as the argument of a direct actor call, and from
the actor into its agent's environment only: it is in no runtime_env, job
metadata or other record that Ray keeps in its GCS.

Life: the actors and the placement group belong to this driver, so Ray
removes them when it exits, however it exits. It tears them down itself on
"stop" or at EOF on stdin (the controller ended, or was killed: the pipe
closes with it). Each agent runs with --parent ACTOR_PID (PR_SET_PDEATHSIG),
so it, and its procs, end with the actor's process; and with --once, with
the controller's connection. SIGINT is ignored: a terminal's Ctrl-C, which
reaches this launcher with monarch-run, is the REPL's (it stops a wait).

Status lines (fd 3), one per event, words separated by blanks:
  pid PID                        this launcher
  reserved N PGNAME              the placement group is placed, N bundles
  host I NODE HOSTNAME PID       bundle I's agent started (pid on its node)
  joined I NODE HOSTNAME PID     an agent on a node added later (--elastic)
  ended I REASON...              host I's actor or agent ended
  node-dead NODE WALLTIME        Ray marked a node of this job dead
  note TEXT...                   something to tell the user
  error TEXT...                  a failure: the launcher exits after it
  stopped                        teardown done

With --find it starts nothing: it asks the host actors of a running job
(monarch:NAME:hostI in namespace monarch; --name picks one of several) where
their agents listen, for `monarch-run --ray --status` and `--top`:
  agent I HOST:PORT              host I's agent
  found N NAME                   the job, N agents
"""
import argparse
import os
import select
import signal
import socket
import subprocess
import sys
import time

POLL = 0.2          # seconds between looks at stdin and the actors
WATCH_EVERY = 1.0   # seconds between asking each actor whether its agent still runs
NODES_EVERY = 0.5   # seconds between looks at the cluster's nodes
KILL_WAIT = 5.0     # seconds an agent gets after SIGTERM before SIGKILL, when its actor is stopped


def parse_args(argv):
    p = argparse.ArgumentParser(prog="monarch_ray", description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default=None, help="Ray cluster address (default: Ray's own discovery)")
    p.add_argument("--hosts", type=int, default=0, help="hosts to reserve (0: every node that fits a bundle)")
    p.add_argument("--cpus", type=float, default=1.0, help="CPUs per host bundle")
    p.add_argument("--gpus", type=float, default=0.0, help="GPUs per host bundle")
    p.add_argument("--elastic", action="store_true", help="offer nodes added later as joins")
    p.add_argument("--max-hosts", type=int, default=0, help="with --elastic, the most hosts (0: no limit)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to place the group and start agents")
    p.add_argument("--join", help="the controller's join port, HOST:PORT")
    p.add_argument("--worker", help="path of monarch-worker on every node")
    p.add_argument("--name", help="the job's name (placement group, actors); with --find, the job to find")
    p.add_argument("--find", action="store_true",
                   help="start nothing: say where the agents of a running job listen (for --status and --top)")
    args = p.parse_args(argv)
    if not args.find and not (args.join and args.worker and args.name):
        p.error("--join, --worker and --name are needed to start a job's hosts")
    return args


class Status:
    def __init__(self, fd):
        self.f = os.fdopen(fd, "w", buffering=1)

    def say(self, *words):
        self.f.write(" ".join(str(w) for w in words) + "\n")


def fits(node, bundle):
    have = node.get("Resources", {})
    return all(have.get(k, 0) >= v for k, v in bundle.items())


def host_actor_class(ray):
    @ray.remote
    class MonarchHost:
        """One host of a Monarch job: the agent is this actor's child process."""

        def start(self, token, worker, join):
            env = dict(os.environ)
            env["MONARCH_TOKEN"] = token
            env.pop("MONARCH_TOKEN_FILE", None)
            # Popen forks from this (the actor's main) thread, so --parent's death signal follows the actor.
            r, w = os.pipe()
            argv = [worker, "--listen", "0.0.0.0:0", "--once", "--parent", str(os.getpid()), "--join", join,
                    "--port-fd", str(w)]
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, pass_fds=(w,))
            os.close(w)
            with os.fdopen(r) as f:  # the agent's port once it listens; "" if it exited first
                port = f.readline().strip()
            ip = ray.util.get_node_ip_address()
            self.addr = ("[%s]" % ip if ":" in ip else ip) + ":" + port if port else None
            return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                    "pid": self.proc.pid}

        def address(self):
            """Where the agent listens (HOST:PORT), for --status and --top under --ray; None if it never did."""
            return self.addr

        def poll(self):
            """The agent's exit status, or None while it runs. It answers at once: an actor runs one call
            at a time, and a call that waited for the agent's exit would hold back address()."""
            return self.proc.poll()

    return MonarchHost


class Launcher:
    def __init__(self, ray, args, token, status):
        self.ray, self.args, self.token, self.st = ray, args, token, status
        self.bundle = {"CPU": args.cpus}
        if args.gpus > 0:
            self.bundle["GPU"] = args.gpus
        self.pg = None
        self.hosts = {}     # index -> {"actor", "node", "poll": ObjectRef or None, "next": when to ask again}
        self.starting = {}  # start ObjectRef -> index
        self.known_nodes = set()
        self.dead_nodes = set()
        self.cls = host_actor_class(ray)

    def alive_nodes(self):
        return [n for n in self.ray.nodes() if n.get("Alive")]

    def describe_cluster(self):
        nodes = self.alive_nodes()
        fit = sum(1 for n in nodes if fits(n, self.bundle))
        return "%d alive node(s), %d with %s in all" % (len(nodes), fit, self.bundle_text())

    def bundle_text(self):
        return "{" + ", ".join("%s: %g" % kv for kv in sorted(self.bundle.items())) + "}"

    def spawn(self, index, strategy):
        a = self.cls.options(name="monarch:%s:host%d" % (self.args.name, index), num_cpus=self.args.cpus,
                             num_gpus=self.args.gpus, scheduling_strategy=strategy, max_restarts=0).remote()
        self.hosts[index] = {"actor": a, "node": None, "poll": None, "next": None}
        self.starting[a.start.remote(self.token, self.args.worker, self.args.join)] = index

    def reserve(self):
        from ray.util.placement_group import placement_group, placement_group_table
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        nodes = self.alive_nodes()
        self.known_nodes = {n["NodeID"] for n in nodes}
        n = self.args.hosts or sum(1 for x in nodes if fits(x, self.bundle))
        if n == 0:
            raise Failure("no node of the Ray cluster has %s (%s)" % (self.bundle_text(), self.describe_cluster()))
        name = "monarch:" + self.args.name
        self.pg = placement_group([dict(self.bundle) for _ in range(n)], strategy="STRICT_SPREAD", name=name)
        # The actors are asked for before the group is placed: Ray starts each one as soon as its bundle
        # is, with no round trip of ours in between (teardown kills them if the group never is).
        for i in range(n):
            self.spawn(i, PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i))
        if not self.pg.wait(timeout_seconds=self.args.timeout):
            raise Failure("Ray could not place %d host bundle(s) of %s, one per node (STRICT_SPREAD), within %gs: "
                          "the cluster has %s (--ray-hosts, --ray-cpus, --ray-gpus, --ray-timeout)"
                          % (n, self.bundle_text(), self.args.timeout, self.describe_cluster()))
        self.st.say("reserved", n, name)
        bundle_nodes = placement_group_table(self.pg).get("bundles_to_node_id", {})
        for i in range(n):
            self.hosts[i]["node"] = bundle_nodes.get(i)
        return n

    def started(self, deadline, wait):
        """Collects the agents' start reports, waiting up to `wait` seconds for the first; the first
        hosts' must all arrive before deadline."""
        if not self.starting:
            return
        ready, _ = self.ray.wait(list(self.starting), num_returns=1, timeout=wait)
        if ready:
            ready, _ = self.ray.wait(list(self.starting), num_returns=len(self.starting), timeout=0)
        for ref in ready:
            i = self.starting.pop(ref)
            h = self.hosts[i]
            try:
                info = self.ray.get(ref)
            except Exception as e:  # the actor or its node died first, or the worker cannot run
                self.st.say("ended", i, "could not start its agent:", one_line(e))
                h["actor"] = None
                continue
            h["node"] = info["node"]
            h["poll"] = h["actor"].poll.remote()
            self.st.say("joined" if h.get("late") else "host", i, info["node"], info["host"], info["pid"])
        if deadline and self.starting and time.monotonic() > deadline:
            raise Failure("%d of %d host agents did not start within %gs (see the actors' logs in Ray's dashboard)"
                          % (len(self.starting), len(self.hosts), self.args.timeout))

    def watch(self):
        """Reports hosts whose agent or actor ended; asks the others again every WATCH_EVERY seconds."""
        now = time.monotonic()
        for h in self.hosts.values():
            if h["poll"] is None and h["next"] is not None and now >= h["next"]:
                h["poll"], h["next"] = h["actor"].poll.remote(), None
        refs = {h["poll"]: i for i, h in self.hosts.items() if h["poll"] is not None}
        if not refs:
            return
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            i = refs[ref]
            h = self.hosts[i]
            h["poll"] = None
            try:
                code = self.ray.get(ref)
            except Exception as e:
                self.st.say("ended", i, "actor died: " + one_line(e))
                continue
            if code is None:
                h["next"] = now + WATCH_EVERY
            else:
                self.st.say("ended", i, "agent exited with status %s" % code)

    def nodes(self):
        """Notes dead nodes of this job, and with --elastic offers new nodes."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        nodes = self.ray.nodes()
        ours = {h["node"] for h in self.hosts.values()}
        for n in nodes:
            nid = n["NodeID"]
            if not n.get("Alive") and nid in ours and nid not in self.dead_nodes:
                self.dead_nodes.add(nid)
                self.st.say("node-dead", nid, "%.3f" % time.time())
            if not n.get("Alive") or nid in self.known_nodes:
                continue
            self.known_nodes.add(nid)
            if not self.args.elastic:
                continue
            active = sum(1 for h in self.hosts.values() if h["actor"] is not None and h["node"] not in self.dead_nodes)
            if self.args.max_hosts and active >= self.args.max_hosts:
                self.st.say("note", "Ray node %s is not added: the job has --ray-max-hosts %d" % (nid, self.args.max_hosts))
            elif not fits(n, self.bundle):
                self.st.say("note", "Ray node %s is not added: it has no %s" % (nid, self.bundle_text()))
            else:
                i = max(self.hosts) + 1 if self.hosts else 0
                self.spawn(i, NodeAffinitySchedulingStrategy(node_id=nid, soft=False))
                self.hosts[i]["node"], self.hosts[i]["late"] = nid, True

    def teardown(self):
        from ray.util.placement_group import remove_placement_group
        for h in self.hosts.values():
            if h["actor"] is not None:
                try:
                    self.ray.kill(h["actor"], no_restart=True)
                except Exception:
                    pass  # already gone with its node
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:
                pass
        self.hosts.clear()


class Failure(Exception):
    pass


def one_line(e):
    s = str(e).strip().splitlines()
    return (s[-1] if s else type(e).__name__)[:300]


def stdin_says(timeout):
    """'stop' when the controller asks or is gone (EOF), None if it said nothing within timeout seconds."""
    r, _, _ = select.select([sys.stdin], [], [], timeout)
    if not r:
        return None
    line = sys.stdin.readline()
    return "stop" if line == "" or line.strip() == "stop" else None


def check_reachable(address, timeout):
    """A HOST:PORT address nothing listens at fails here at once (ray.init would retry for half a minute)."""
    if not address or "://" in address or address in ("auto", "local"):
        return
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=min(timeout, 10)).close()
    except OSError as e:
        raise Failure("no Ray cluster at %s: %s (--ray ADDRESS, or RAY_ADDRESS)" % (address, e.strerror or e))


def run(ray, args, token, st):
    import logging
    from ray.job_config import JobConfig
    check_reachable(args.address, args.timeout)
    ray.init(address=args.address, namespace="monarch", logging_level=logging.WARNING,
             log_to_driver=os.environ.get("MONARCH_RAY_AGENT_LOGS", "") not in ("", "0"),
             job_config=JobConfig(metadata={"monarch_job": args.name}))
    host, _, port = args.join.rpartition(":")
    if host.strip("[]") in ("", "0.0.0.0", "::"):  # the controller listens everywhere: this node's address
        ip = ray.util.get_node_ip_address()
        args.join = ("[%s]" % ip if ":" in ip else ip) + ":" + port
    la = Launcher(ray, args, token, st)
    try:
        la.reserve()
        deadline = time.monotonic() + args.timeout
        last_nodes = 0.0
        # While agents start, the wait is on their reports (so "host" lines, which order the hosts,
        # follow their joins at once); after, on stdin.
        while stdin_says(0 if la.starting else POLL) != "stop":
            la.started(deadline, POLL)
            if not la.starting:
                deadline = None  # the first hosts are up; later ones start when they can
            la.watch()
            if time.monotonic() - last_nodes >= NODES_EVERY:
                last_nodes = time.monotonic()
                la.nodes()
    finally:
        la.teardown()
    st.say("stopped")


def job_actors(ray):
    """The running jobs of this cluster: {job name: [its host actors' names, in host order]}."""
    jobs = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        parts = a.get("name", "").split(":")
        if a.get("namespace") == "monarch" and len(parts) == 3 and parts[0] == "monarch" \
                and parts[2].startswith("host") and parts[2][4:].isdigit():
            jobs.setdefault(parts[1], []).append(a["name"])
    for names in jobs.values():
        names.sort(key=lambda n: int(n.rsplit(":host", 1)[1]))
    return jobs


def find(ray, args, st):
    """--find: "agent I HOST:PORT" for each host of the job, asked of its actor, then "found N NAME"."""
    import logging
    check_reachable(args.address, args.timeout)
    ray.init(address=args.address, namespace="monarch", logging_level=logging.WARNING, log_to_driver=False)
    jobs = job_actors(ray)
    if args.name and args.name not in jobs:
        raise Failure("no monarch job %s runs on this Ray cluster (%s)" % (args.name, ", ".join(sorted(jobs)) or "none"))
    if not args.name and len(jobs) != 1:
        raise Failure("no monarch job runs on this Ray cluster" if not jobs else
                      "%d monarch jobs run on this Ray cluster: %s (pick one with --ray-job NAME)"
                      % (len(jobs), ", ".join(sorted(jobs))))
    name = args.name or next(iter(jobs))
    refs = [ray.get_actor(n, namespace="monarch").address.remote() for n in jobs[name]]
    addrs = ray.get(refs, timeout=args.timeout)
    for n, addr in zip(jobs[name], addrs):
        if addr:
            st.say("agent", n.rsplit(":host", 1)[1], addr)
    st.say("found", sum(1 for a in addrs if a), name)


def main(argv):
    args = parse_args(argv)
    if not args.find:
        # The terminal's Ctrl-C reaches the whole foreground group, this launcher too: in `monarch-run --ray -i`
        # it stops the REPL's wait, and must not end the job's hosts. The controller ends us (stop, or EOF).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    st = Status(3)
    st.say("pid", os.getpid())
    token = None if args.find else sys.stdin.readline().strip()
    if not token and not args.find:
        st.say("error", "no cluster token on stdin")
        return 2
    try:
        import ray
    except ImportError as e:
        st.say("error", "cannot import ray (%s) in %s: pip install ray there, or set MONARCH_RAY_PYTHON "
               "to a Python that has it" % (e, sys.executable))
        return 2
    rc = 0
    try:
        find(ray, args, st) if args.find else run(ray, args, token, st)
    except Failure as e:
        st.say("error", str(e))
        rc = 1
    except Exception as e:  # Ray's own errors (no cluster at the address, say): one line
        st.say("error", "%s: %s" % (type(e).__name__, one_line(e)))
        rc = 1
    # No ray.shutdown() and no interpreter teardown: together they take a few tenths of a second that
    # the controller would wait for at every job's end. run() has killed the actors and removed the
    # group; whatever of this driver's Ray still holds goes when its connection closes, as on a kill -9.
    st.f.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
