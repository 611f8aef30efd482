block = bytearray(10 * 1024**3)


def add(a, b):
    return a + b + len(block)
