#!/usr/bin/env python3
"""The baseline of bench/ray.sh: Ray's own actors doing what `monarch-run --ray
tests/support/ray_job.lua` does. 3 bundles of {CPU: 1}, one per node
(STRICT_SPREAD), 2 actors in each (6 workers), one call answered by all.
The whole process is timed by the caller, as monarch-run is.
  ray_actors.py ADDRESS
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


def main(address):
    t0 = time.monotonic()
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
    ray.get(pg.ready())
    ws = [Worker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i // 2))
          .remote(i) for i in range(6)]
    ranks = ray.get([w.rank_of.remote() for w in ws])
    assert ranks == list(range(6)), ranks
    print("workers 6 first call %.3f s" % (time.monotonic() - t0))
    for w in ws:
        ray.kill(w)
    remove_placement_group(pg)
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
