"""Build the extension: python -m mlxio.gpu.cuda_ext [--build-dir DIR] (see the package docstring)."""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build-dir", default=None, help="CMake's build directory (default: a temporary one)")
    ap.add_argument("--fmt-root", default=None, help="a directory holding fmt/format.h (default: the system's)")
    args = ap.parse_args(argv)
    import mlx.core as mx

    cuda = getattr(mx, "cuda", None)
    if cuda is None or not cuda.is_available():
        print("mlxio.gpu.cuda_ext: needs MLX's CUDA build (pip install 'mlx[cuda]') on a machine with an NVIDIA GPU",
              file=sys.stderr)
        return 2
    for tool, hint in (("cmake", "pip install cmake"), ("nvcc", "the CUDA toolkit (for cuBLASLt's headers)")):
        if shutil.which(tool) is None and not (tool == "nvcc" and Path("/usr/local/cuda/bin/nvcc").exists()):
            print(f"mlxio.gpu.cuda_ext: {tool} not found; install {hint}", file=sys.stderr)
            return 2
    try:
        import nanobind  # noqa: F401
    except ImportError:
        print('mlxio.gpu.cuda_ext: nanobind not found; pip install "nanobind>=3.0,<3.2" (the ABI of MLX 0.32.4)', file=sys.stderr)
        return 2
    build = Path(args.build_dir or tempfile.mkdtemp(prefix="mlxcore-cuda-ext-"))
    cuda = "/usr/local/cuda" if Path("/usr/local/cuda").exists() else None
    configure = ["cmake", "-S", str(HERE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DPython_EXECUTABLE={sys.executable}"] + ([f"-DCUDAToolkit_ROOT={cuda}"] if cuda else []) \
        + ([f"-DFMT_ROOT={Path(args.fmt_root).resolve()}"] if args.fmt_root else [])
    for cmd in (configure, ["cmake", "--build", str(build), "-j"]):
        if subprocess.run(cmd).returncode:
            print(f"mlxio.gpu.cuda_ext: failed: {' '.join(cmd)}", file=sys.stderr)
            return 1
    built = sorted(build.glob("_gemm_epilogue*.so"))
    if not built:
        print(f"mlxio.gpu.cuda_ext: no _gemm_epilogue*.so under {build}", file=sys.stderr)
        return 1
    for so in built:
        shutil.copy2(so, HERE / so.name)
        print(HERE / so.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
