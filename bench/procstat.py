"""What the benchmarks read about a server process from /proc (Linux)."""

import os


def user_system_seconds(pid):
    """User and system CPU time the process has used, in seconds (tick-sampled)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid):
    """User + system CPU time the process has used, in seconds."""
    return sum(user_system_seconds(pid))


def _status_mb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb(pid):
    """The process's peak resident set size (VmHWM) in MiB."""
    return _status_mb(pid, "VmHWM:")


def rss_mb(pid):
    """The process's resident set size now (VmRSS) in MiB."""
    return _status_mb(pid, "VmRSS:")


def steal_seconds():
    """CPU seconds the hypervisor has taken from this virtual machine's CPUs since boot
    (0 on bare metal). While it is high, wake-ups come late and every figure drops."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0
