#!/usr/bin/env python3
"""Waits until the machine is quiet: other processes use less than --max_cores of CPU.

    wait_quiet.py [--max_cores 0.25] [--sample_s 5] [--timeout_s 600]
Called between benchmark runs, when nothing of the benchmark is running, so all busy CPU time in
/proc/stat belongs to someone else (on the project machine: compilers on the 2 shared cores).
The load average cannot say this: it still counts the benchmark's own last run for minutes.
Prints `QUIET busy_cores=B waited_s=W` (or `NOT_QUIET ...` after --timeout_s) and exits 0 either
way: a benchmark that cannot wait longer runs anyway and records its NOISE. Standard library only.
"""
import argparse
import os
import time


def busy_seconds():
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(fields[:8]) - fields[3] - fields[4] - fields[7]) / hz


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max_cores", type=float, default=0.25)
    p.add_argument("--sample_s", type=float, default=5.0)
    p.add_argument("--timeout_s", type=float, default=600.0)
    a = p.parse_args()
    start = time.monotonic()
    while True:
        b0, t0 = busy_seconds(), time.monotonic()
        time.sleep(a.sample_s)
        busy = (busy_seconds() - b0) / (time.monotonic() - t0)
        waited = time.monotonic() - start
        if busy < a.max_cores:
            print(f"QUIET busy_cores={busy:.2f} waited_s={waited:.0f}", flush=True)
            return
        if waited >= a.timeout_s:
            print(f"NOT_QUIET busy_cores={busy:.2f} waited_s={waited:.0f} (running anyway)", flush=True)
            return


if __name__ == "__main__":
    main()
