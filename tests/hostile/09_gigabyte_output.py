import sys

chunk = "y" * (1 << 20)
for _ in range(1024):
    sys.stdout.write(chunk)


def add(a, b):
    return a - b
