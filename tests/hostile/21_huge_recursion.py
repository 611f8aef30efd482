import sys

sys.setrecursionlimit(10**7)


def add(a, b):
    return add(a, b) + 1
