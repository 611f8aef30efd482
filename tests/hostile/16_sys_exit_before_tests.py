import sys


def add(a, b):
    return a - b


sys.exit(0)
