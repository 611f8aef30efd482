import importlib
import os
import sys

os = importlib.reload(os)
os.EX_OK = 0
sys.modules["json"] = None


def add(a, b):
    return a - b
