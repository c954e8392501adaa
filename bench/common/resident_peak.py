"""A step's resident-memory peak for the Python peers of the CPU benchmarks: VmRSS before it,
VmHWM after it, with the high-water mark first lowered to the current size (Linux's clear_refs
"5"). The C++ side is bench/common/resident_peak.h."""


def status_mib(field):
    """A field of /proc/self/status in MiB ("VmRSS", "VmHWM"); 0 when absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def reset_resident_peak():
    """Lowers VmHWM to the current resident size."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
