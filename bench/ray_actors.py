#!/usr/bin/env python3
"""The baselines of bench/ray.sh, in Ray's own actors.

  ray_actors.py ADDRESS          what `monarch-run --ray tests/support/ray_job.lua` does: 3 bundles
                                 of {CPU: 1}, one per node (STRICT_SPREAD), 2 actors in each (6
                                 workers), one call answered by all
  ray_actors.py ADDRESS floor N  Ray's floor for N hosts: N bundles of {CPU: 1} (STRICT_SPREAD), one
                                 trivial actor in each, one call answered: the least a job that runs
                                 one process per node through Ray's actors waits for

Either prints "first call" (flushed: the caller times the line) when the call is answered, then
ends as a Ray script does (ray.kill, remove_placement_group, ray.shutdown). The caller times the
whole process too, as it does monarch-run.
"""
import logging
import sys
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@ray.remote(num_cpus=0.5)
class Worker:
    def __init__(self, rank):
        self.rank = rank

    def rank_of(self):
        return self.rank


def main(argv):
    t0 = time.monotonic()
    address = argv[0]
    hosts, per_host = (int(argv[2]), 1) if argv[1:2] == ["floor"] else (3, 2)
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    pg = placement_group([{"CPU": 1}] * hosts, strategy="STRICT_SPREAD")
    ray.get(pg.ready())
    n = hosts * per_host
    ws = [Worker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=i // per_host)).remote(i) for i in range(n)]
    ranks = ray.get([w.rank_of.remote() for w in ws])
    assert ranks == list(range(n)), ranks
    print("workers %d first call %.3f s" % (n, time.monotonic() - t0), flush=True)
    for w in ws:
        ray.kill(w)
    remove_placement_group(pg)
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
