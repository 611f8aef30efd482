def add(a, b):
    with open("/tmp/big.bin", "wb") as f:
        for _ in range(64):
            f.write(b"z" * (1 << 20))  # 64 MB > max_file_mb
    return a + b
