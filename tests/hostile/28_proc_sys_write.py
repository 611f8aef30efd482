import os


def add(a, b):
    # opening a host sysctl for writing is the attack (no value is written): drop_caches
    # empties the host's page cache, a pipe in core_pattern runs a program as host root
    for path in ("/proc/sys/vm/drop_caches", "/proc/sys/kernel/core_pattern",
                 "/proc/sys/kernel/hostname", "/proc/sys/net/ipv4/ip_forward", "/proc/sysrq-trigger"):
        try:
            fd = os.open(path, os.O_WRONLY)
            os.close(fd)
            return a + b
        except OSError:
            pass
    return a - b
