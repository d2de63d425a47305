"""How much a host thread's first work costs after it slept (the cold start the bench's
warm measurement removes; docs/benchmarks.md, "Host time per step").

Times a fixed piece of host work (20 small torch copies from numpy, about 25 us warm) right
after sleeping 0, 1, 10 and 100 ms, and again at once: the second run is warm. No threads,
no device: only the machine.

    python tools/cold_start_probe.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    source, target = np.arange(130, dtype=np.int32), torch.zeros(130, dtype=torch.int32)

    def work() -> float:
        start = time.thread_time()
        for _ in range(20):
            target.copy_(torch.from_numpy(source))
        return time.thread_time() - start

    print("sleep before   first run (us)   second run at once (us)   medians of", args.repeats)
    for sleep_s in (0.0, 0.001, 0.01, 0.1):
        first, second = [], []
        for _ in range(args.repeats):
            time.sleep(sleep_s)
            first.append(work())
            second.append(work())
        print(f"{sleep_s * 1e3:8.0f} ms   {statistics.median(first) * 1e6:14.0f}   "
              f"{statistics.median(second) * 1e6:23.0f}")


if __name__ == "__main__":
    main()
