import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        # the grandchild: detached, meant to outlive everything
        time.sleep(120)
    os._exit(0)


def add(a, b):
    return a - b
