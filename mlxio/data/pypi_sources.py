"""Python sources of pinned PyPI packages, downloaded once by pip into the run's cache, for
mining (docstring, function) pairs beyond the standard library.

    fetch("sympy==1.13.3", cache_dir)  # -> Source(name, version, licence, root, archive)

A package is fetched with `pip download --no-deps --only-binary :all:` (the wheel: no build
step, so no build dependencies and no compiler) into `cache_dir/pypi/<name>-<version>/` and
unpacked there; later runs reuse the unpacked copy and never touch the network (the unpacked
`src/` alone, with its *.dist-info metadata, is enough: `dev/gpu/pack_pypi_cache.sh` packs just
that - the .py files and licence metadata - for machines without internet). A package that
is not cached and cannot be downloaded raises one `DataError` line naming it and the command
that fetches it. Only the packages a config names are used: never whatever happens to be
installed (a run must not depend on its environment).
"""

from __future__ import annotations

import email.parser
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import attrs

from mlxio.atomic import run_dir
from mlxio.errors import DataError

log = logging.getLogger(__name__)

# The default corpus beyond the stdlib (pure-Python sources, permissive licences). Versions
# are pinned so that every run mines the same code.
DEFAULT_PACKAGES: tuple[str, ...] = (
    "sympy==1.13.3",
    "networkx==3.4.2",
    "django==5.1.4",
    "sqlalchemy==2.0.36",
    "pytest==8.3.4",
    "pygments==2.18.0",
    "docutils==0.21.2",
    "scikit-learn==1.5.2",
)
# The `full` preset's wider training corpus: 16 more libraries of scientific, web and tooling
# code, ~21,000 more mined pairs; none vendors a held-out package.
WIDE_PACKAGES: tuple[str, ...] = DEFAULT_PACKAGES + (
    "astropy==6.1.6", "click==8.1.7", "dask==2024.11.2", "flask==3.1.0", "jinja2==3.1.4",
    "matplotlib==3.9.2", "numpy==2.1.3", "pandas==2.2.3", "requests==2.32.3", "scipy==1.14.1",
    "sphinx==8.1.3", "statsmodels==0.14.4", "tornado==6.4.2", "twisted==24.11.0", "werkzeug==3.1.3",
    "xarray==2024.11.0",
)
# Held out whole (never seen in training): the test of transfer to unseen libraries.
DEFAULT_HELDOUT: tuple[str, ...] = ("networkx", "pygments")

# The pip invocation (a list so that tests can replace it); the spec and --dest are appended.
PIP = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
       "--disable-pip-version-check", "--quiet"]


@attrs.frozen(kw_only=True)
class Source:
    """One unpacked package: `root` is the folder to mine; `licence` from its metadata;
    `archive` the downloaded wheel ("" when only the unpacked copy is cached)."""

    name: str
    version: str
    licence: str
    root: str
    archive: str

    def as_dict(self) -> dict:
        return attrs.asdict(self)


_SPEC = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*$")


def parse_spec(spec: str) -> tuple[str, str]:
    """"Name==version" -> (canonical name, version); anything unpinned is an error."""
    m = _SPEC.match(spec)
    if not m:
        raise DataError(f"package {spec!r}: expected a pinned 'name==version'")
    return canonical(m.group(1)), m.group(2)


def canonical(name: str) -> str:
    """PEP 503 normalised name ("Scikit_Learn" -> "scikit-learn")."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _licence(meta: email.message.Message) -> str:
    """Licence from core metadata: License-Expression, else a short License field, else the
    "License ::" classifiers; "unknown" when none says."""
    expression = (meta.get("License-Expression") or "").strip()
    if expression:
        return expression
    text = (meta.get("License") or "").strip()
    if text and "\n" not in text and len(text) <= 80 and text.upper() != "UNKNOWN":
        return text
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or []
                   if c.startswith("License ::")]
    if classifiers:
        return "; ".join(classifiers)
    if text:
        return text.splitlines()[0][:80]
    return "unknown"


def read_metadata(root: Path) -> tuple[str, str, str]:
    """(name, version, licence) from the unpacked wheel's *.dist-info/METADATA (or an sdist's
    PKG-INFO)."""
    found = sorted(root.glob("*.dist-info/METADATA")) or sorted(root.glob("*/PKG-INFO")) or sorted(
        root.glob("PKG-INFO"))
    if not found:
        raise DataError(f"{root}: no *.dist-info/METADATA or PKG-INFO (not an unpacked wheel / sdist)")
    meta = email.parser.Parser().parsestr(found[0].read_text(encoding="utf-8", errors="replace"))
    return canonical(meta.get("Name", "")), meta.get("Version", ""), _licence(meta)


def _archive(folder: Path, name: str, version: str) -> Path | None:
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for path in sorted(folder.iterdir()) if folder.is_dir() else ():
        base = path.name.lower()
        if (base.endswith(".whl") or base.endswith(".tar.gz") or base.endswith(".zip")) and \
                re.sub(r"[-_.]+", "_", base).startswith(f"{stem}_{re.sub(r'[-_.]+', '_', version)}"):
            return path
    return None


def _unpack(archive: Path, dest: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        if archive.name.endswith((".whl", ".zip")):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        else:
            shutil.unpack_archive(str(archive), str(tmp), format="gztar", filter="data")  # no links out, no devices
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch(spec: str, cache_dir: Path | str) -> Source:
    """The unpacked source of pinned package `spec` under `cache_dir/pypi/`, downloading it
    with pip only when no archive is cached (see the module docstring)."""
    name, version = parse_spec(spec)
    folder = Path(cache_dir) / "pypi" / f"{name}-{version}"
    unpacked = folder / "src"
    archive = _archive(folder, name, version)
    if archive is None and not unpacked.is_dir():  # an unpacked copy alone will do (a packed cache)
        run_dir(Path(cache_dir) / "pypi", "package cache")
        run_dir(folder, "package cache")  # pip writes into it: never through a planted link
        command = [*PIP, "--dest", str(folder), f"{name}=={version}"]
        log.info("downloading %s==%s's wheel with pip (once: later runs reuse %s)", name, version, folder)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            ok = done.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        archive = _archive(folder, name, version) if ok else None
        if archive is None:
            raise DataError(f"package {name}=={version} is not in the cache {folder} and could not be "
                            f"downloaded (offline?); fetch it once with: "
                            f"{sys.executable} -m pip download --no-deps --only-binary :all: "
                            f"--dest {folder} {name}=={version}")
    if not unpacked.is_dir():
        _unpack(archive, unpacked)
    meta_name, meta_version, licence = read_metadata(unpacked)
    if meta_version and meta_version != version:
        raise DataError(f"{archive or unpacked}: metadata says version {meta_version}, the config pins {version}")
    return Source(name=name, version=version, licence=licence, root=str(unpacked),
                  archive=str(archive) if archive else "")


def fetch_all(specs: Sequence[str], cache_dir: Path | str) -> list[Source]:
    """`fetch` of every spec, in order; duplicate names are an error."""
    names = [parse_spec(s)[0] for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DataError(f"packages: {dup} named more than once")
    return [fetch(s, cache_dir) for s in specs]
