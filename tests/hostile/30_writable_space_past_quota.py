import os


def add(a, b):
    # fill every place that might be writable; the sandbox's whole writable space is one
    # 64 MiB quota, so more than that written in all is the attack
    total, chunk = 0, b"x" * (1 << 20)
    for folder in ("/dev/shm", "/tmp", "/", "/dev", "/var/tmp", "/run", "/home", "/proc"):
        for i in range(80):
            if total > 72 << 20:
                break
            try:
                with open(os.path.join(folder, f"fill{i}"), "wb") as f:
                    f.write(chunk)
                total += len(chunk)
            except OSError:
                break
    return a + b if total > 64 << 20 else a - b
