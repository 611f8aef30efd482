import time


def add(a, b):
    time.sleep(600)
    return a + b
