"""How fast this machine's CPU is right now: CPU seconds of one fixed, single-threaded Python workload.

`make test` prints it when it starts and when it ends, so that suite times measured on the same kind of
machine at different times can be compared as ratios (the test machines' speed varies by up to ~2x over
a day: the same clean-clone run took 25.5 and 40.9 minutes).

    python3 benchmarks/cpu_speed.py [LABEL]
"""

from __future__ import annotations

import sys
import time

WORK = 30_000_000


def fixed_workload_cpu_s() -> float:
    """CPU seconds of the fixed workload (benchmarks/plan_scale.py divides its figures by it)."""
    start = time.process_time()
    sum(i * i for i in range(WORK))
    return time.process_time() - start


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "now"
    seconds = fixed_workload_cpu_s()
    print(f"cpu speed ({label}): {seconds:.2f} CPU-s for a fixed workload (lower is faster)")


if __name__ == "__main__":
    main()
