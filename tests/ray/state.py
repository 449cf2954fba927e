#!/usr/bin/env python3
"""What a test asks a Ray cluster (tests/support/ray_cluster.lua): one line of words.

  state.py ADDRESS            -> "nodes N pgs P actors A": alive nodes, placement groups named
                                 monarch:* not yet removed, named actors alive in namespace monarch
  state.py ADDRESS dead-after T0 NODE_COUNT
                              -> waits until fewer than NODE_COUNT nodes are alive; prints
                                 "dead S" (seconds since the wall-clock time T0) or "alive" after 60 s
"""
import logging
import sys
import time

import ray


def alive():
    return sum(1 for n in ray.nodes() if n.get("Alive"))


def main(argv):
    ray.init(address=argv[0], logging_level=logging.ERROR, log_to_driver=False, namespace="monarch-test")
    if len(argv) > 1 and argv[1] == "dead-after":
        t0, before = float(argv[2]), int(argv[3])
        deadline = time.time() + 60
        while time.time() < deadline:
            if alive() < before:
                print("dead %.3f" % (time.time() - t0))
                return 0
            time.sleep(0.05)
        print("alive")
        return 0
    from ray.util import placement_group_table, list_named_actors
    pgs = sum(1 for v in placement_group_table().values()
              if v.get("name", "").startswith("monarch:") and v.get("state") != "REMOVED")
    actors = sum(1 for a in list_named_actors(all_namespaces=True) if a.get("namespace") == "monarch")
    print("nodes %d pgs %d actors %d" % (alive(), pgs, actors))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
