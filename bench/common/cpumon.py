#!/usr/bin/env python3
"""Runs one benchmark command and reports how much CPU other processes used meanwhile.

    cpumon.py [--name NAME] [--timeout S] -- COMMAND [ARGS...]
Prints `NOISE <name> foreign_cores=F steal_cores=S wall_s=W` on stderr and exits with the
command's status (124 if it ran past --timeout; it is then sent SIGTERM and, 35 s later, SIGKILL,
to its whole process group). foreign_cores = (busy CPU time of the machine, from /proc/stat,
minus the CPU time of this command and its descendants) / wall time: about 1.0 means another
process held one core throughout. steal_cores is the time the hypervisor gave to other guests,
which /proc/stat sees only as steal. Standard library only; no torch import.
"""
import argparse
import os
import resource
import signal
import subprocess
import sys
import time


def cpu_ticks():
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    idle = fields[3] + fields[4]
    steal = fields[7] if len(fields) > 7 else 0
    busy = sum(fields[:8]) - idle - steal
    return busy, steal


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", default="run")
    p.add_argument("--timeout", type=float, default=0, help="seconds; 0 = none")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no COMMAND given")
    hz = os.sysconf("SC_CLK_TCK")

    busy0, steal0 = cpu_ticks()
    cpu0, t0 = children_cpu_s(), time.monotonic()
    proc = subprocess.Popen(cmd, start_new_session=True)
    rc = None
    try:
        rc = proc.wait(timeout=a.timeout or None)
    except subprocess.TimeoutExpired:
        print(f"cpumon: {a.name}: still running after {a.timeout:.0f} s; stopping it", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=35)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        rc = 124
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    wall = time.monotonic() - t0
    busy1, steal1 = cpu_ticks()
    own = children_cpu_s() - cpu0
    foreign = max(0.0, (busy1 - busy0) / hz - own) / wall
    steal = (steal1 - steal0) / hz / wall
    print(f"NOISE {a.name} foreign_cores={foreign:.2f} steal_cores={steal:.2f} "
          f"own_cores={own / wall:.2f} wall_s={wall:.1f}", file=sys.stderr)
    sys.exit(rc if rc >= 0 else 128 - rc)


if __name__ == "__main__":
    main()
