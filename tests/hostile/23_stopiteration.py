def add(a, b):
    raise StopIteration
