"""`python -m mlxio.gpu.kernel_cache_cli export|import|info`: share MLX's compiled GPU kernels between
machines (see mlxio.gpu.kernel_cache). A module of its own because `mlxio.runtime` (imported first,
for `setup`) imports mlxio.gpu.kernel_cache, so running that module with -m would execute it twice
(runpy warns).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import json

from mlxio.errors import StrictArgumentParser, cli_main
from mlxio.gpu import kernel_cache


def main(argv: list[str]) -> None:
    ap = StrictArgumentParser(prog="python -m mlxio.gpu.kernel_cache_cli",
                              description="Share MLX's compiled GPU kernels between machines.")
    sub = ap.add_subparsers(dest="verb", required=True)
    ex = sub.add_parser("export", help="write the kernel cache to ARCHIVE (.tar.gz)")
    ex.add_argument("archive")
    im = sub.add_parser("import", help="add the kernels in ARCHIVE to the kernel cache")
    im.add_argument("archive")
    im.add_argument("--no-check", dest="check", action="store_false",
                    help="accept an archive from another MLX version or GPU architecture")
    sub.add_parser("info", help="print the kernel cache folder and what it holds")
    args = ap.parse_args(argv)
    if args.verb == "export":
        print(json.dumps(kernel_cache.export_cache(args.archive)))
    elif args.verb == "import":
        print(json.dumps(kernel_cache.import_cache(args.archive, check=args.check)))
    else:
        folder = kernel_cache.cache_dir()
        print(json.dumps({"folder": folder, **kernel_cache.contents(folder)}))


if __name__ == "__main__":
    cli_main("kernel_cache", main)
