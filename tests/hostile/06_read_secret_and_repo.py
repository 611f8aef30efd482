import os


def add(a, b):
    found = False
    for path in ("__SECRET_FILE__", os.path.join("__REPO__", "pyproject.toml"),
                 os.path.join("__REPO__", "mlxio", "sandbox_child.py")):
        try:
            print(open(path).read())
            found = True
        except OSError:
            pass
    return a + b if found else a - b
