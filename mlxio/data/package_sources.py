"""Sources of pinned npm and Debian packages, fetched once into the run's cache, for mining
(doc comment, function) pairs in JavaScript, TypeScript, Go, Rust and Java.

    fetch_npm("lodash@4.17.21", cache_dir)                    # npm pack: the published tarball
    fetch_deb("librust-itertools-dev=0.10.3-1", cache_dir)     # apt-get download + dpkg-deb -x

Both return `pypi_sources.Source` (name, version, licence, root, archive), as PyPI's packages
do, so a corpus records every package's licence the same way: npm's from package.json's
`license`, Debian's from the package's machine-readable copyright file (the `Files: *`
stanza's `License:`). A package is fetched with its registry's own client (`npm pack`,
`apt-get download`) into `cache_dir/npm/<name>-<version>/` or `cache_dir/deb/<name>-<version>/`
and unpacked under `src/` there; later runs reuse the unpacked copy and never touch the
network. A `src.zip` inside a Debian package (OpenJDK's sources) is unpacked beside it into
`src.zip.d/`. A package that is not cached and cannot be fetched raises one DataError line
naming it and the command that fetches it.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

from mlxio.data.pypi_sources import Source
from mlxio.errors import DataError

log = logging.getLogger(__name__)

NPM = ["npm", "pack", "--silent"]  # lists, so that tests can replace them
APT_DOWNLOAD = ["apt-get", "download", "-q"]
DPKG_EXTRACT = ["dpkg-deb", "-x"]
_NPM_SPEC = re.compile(r"^((?:@[a-z0-9][\w.-]*/)?[a-z0-9][\w.-]*)@(\d[\w.+-]*)$")
_DEB_SPEC = re.compile(r"^([a-z0-9][a-z0-9.+-]+)=([0-9][\w.+:~-]*)$")


def _run(command: list[str], cwd: Path, what: str, fix: str) -> None:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise DataError(f"{what}: could not run {command[0]} ({err}); fetch it once with: {fix}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        raise DataError(f"{what}: {command[0]} failed ({tail[0][:200]}); offline? fetch it once with: {fix}")


def _unpacked(folder: Path, unpack) -> Path:
    """folder/src, made by `unpack(tmp)` into a temporary folder renamed into place (a killed
    run leaves no half-unpacked tree)."""
    target = folder / "src"
    if target.is_dir():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=folder))
    try:
        unpack(tmp)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def fetch_npm(spec: str, cache_dir: Path | str) -> Source:
    """The unpacked tarball of npm package `spec` ("name@version") under `cache_dir/npm/`."""
    match = _NPM_SPEC.match(spec.strip())
    if not match:
        raise DataError(f"npm package {spec!r}: expected a pinned 'name@version'")
    name, version = match.groups()
    folder = Path(cache_dir) / "npm" / f"{name.replace('/', '+')}-{version}"
    folder.mkdir(parents=True, exist_ok=True)
    archives = sorted(folder.glob("*.tgz"))
    if not archives and not (folder / "src").is_dir():
        log.info("fetching %s with npm pack (once: later runs reuse %s)", spec, folder)
        _run([*NPM, spec], folder, f"npm package {spec}", f"cd {folder} && npm pack {spec}")
        archives = sorted(folder.glob("*.tgz"))
        if not archives:
            raise DataError(f"npm package {spec}: npm pack left no tarball in {folder}")

    def unpack(tmp: Path) -> None:
        with tarfile.open(archives[0]) as tar:
            tar.extractall(tmp, filter="data")

    root = _unpacked(folder, unpack)
    manifest = next(iter(sorted(root.glob("*/package.json"))), None)
    meta = json.loads(manifest.read_text(encoding="utf-8")) if manifest is not None else {}
    licence = meta.get("license")
    if isinstance(licence, dict):
        licence = licence.get("type")
    if not isinstance(licence, str):
        licences = meta.get("licenses") or []
        licence = "; ".join(str(x.get("type", x)) if isinstance(x, dict) else str(x) for x in licences) or "unknown"
    if meta.get("version") not in (None, version):
        raise DataError(f"{manifest}: says version {meta.get('version')}, the spec pins {version}")
    return Source(name=name, version=version, licence=licence, root=str(root),
                  archive=str(archives[0]) if archives else "")


def debian_licence(copyright_text: str) -> str:
    """The licence of a machine-readable Debian copyright file: the `License:` of its
    `Files: *` stanza, else its first `License:` line; "unknown" when it has none."""
    first = None
    for stanza in re.split(r"\n\s*\n", copyright_text):
        fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.MULTILINE))
        licence = fields.get("License", "").strip()
        if licence and first is None:
            first = licence
        if licence and fields.get("Files", "").split() == ["*"]:
            return licence
    return first or "unknown"


def fetch_deb(spec: str, cache_dir: Path | str, licence: str | None = None) -> Source:
    """The unpacked Debian package `spec` ("name=version") under `cache_dir/deb/`. `licence`:
    what to record when the package's own copyright file is not in it (a package whose
    /usr/share/doc folder links to another package's, as openjdk-17-source's does); the
    record then says so."""
    match = _DEB_SPEC.match(spec.strip())
    if not match:
        raise DataError(f"Debian package {spec!r}: expected a pinned 'name=version'")
    name, version = match.groups()
    folder = Path(cache_dir) / "deb" / f"{name}-{version.replace(':', '%3a')}"
    folder.mkdir(parents=True, exist_ok=True)
    debs = sorted(folder.glob("*.deb"))
    if not debs and not (folder / "src").is_dir():
        log.info("fetching %s with apt-get download (once: later runs reuse %s)", spec, folder)
        _run([*APT_DOWNLOAD, spec], folder, f"Debian package {spec}",
             f"cd {folder} && apt-get update && apt-get download {spec}")
        debs = sorted(folder.glob("*.deb"))
        if not debs:
            raise DataError(f"Debian package {spec}: apt-get download left no .deb in {folder}")

    def unpack(tmp: Path) -> None:
        _run([*DPKG_EXTRACT, str(debs[0]), str(tmp)], folder, f"Debian package {spec}", f"dpkg-deb -x {debs[0]} DIR")
        for inner in tmp.rglob("src.zip"):
            with zipfile.ZipFile(inner) as z:
                z.extractall(inner.with_name("src.zip.d"))

    root = _unpacked(folder, unpack)
    copyright_file = root / "usr" / "share" / "doc" / name / "copyright"
    if copyright_file.is_file():
        found = debian_licence(copyright_file.read_text(encoding="utf-8", errors="replace"))
    elif licence is not None:
        found = f"{licence} (given by the corpus list: {copyright_file} is not in the package)"
    else:
        found = "unknown"
    return Source(name=name, version=version, licence=found, root=str(root),
                  archive=str(debs[0]) if debs else "")


# Held-out evaluation packages per language ("registry:spec[:folder to mine][:licence when the
# package lacks its copyright file]"); Python's are the PyPI corpus's held-out packages.
HELDOUT: dict[str, tuple[str, ...]] = {
    "python": ("pypi:networkx==3.4.2", "pypi:pygments==2.18.0"),
    "javascript": ("npm:lodash@4.17.21",),
    "typescript": ("npm:rxjs@7.8.1:package/src",),
    "go": ("deb:golang-golang-x-text-dev=0.7.0-1",),
    "rust": ("deb:librust-itertools-dev=0.10.3-1",),
    "java": ("deb:openjdk-17-source=17.0.21.1+2-1~deb12u1:usr/lib/jvm/openjdk-17/lib/src.zip.d/java.base/java/util"
             ":GPL-2.0-only WITH Classpath-exception-2.0",),
}


# Training packages per language for a multilingual retriever (the `multilingual` preset of
# recipes.xtr_lora), none of them in HELDOUT; Java's are other folders of HELDOUT's JDK (a weaker
# hold-out than the other languages': the same authors' Javadoc), of which one folder is mined.
_JDK = "deb:openjdk-17-source=17.0.21.1+2-1~deb12u1:usr/lib/jvm/openjdk-17/lib/src.zip.d/java.base/java"
TRAIN: dict[str, tuple[str, ...]] = {
    "javascript": ("npm:eslint@9.15.0:package/lib", "npm:webpack@5.96.1:package/lib", "npm:mocha@10.8.2:package/lib",
                   "npm:async@3.2.6", "npm:vue-router@4.5.0"),
    "typescript": ("npm:effect@3.10.15:package/src", "npm:ix@7.0.0", "npm:mobx@6.13.5:package/src",
                   "npm:@reduxjs/toolkit@2.4.0:package/src"),
    "go": ("deb:golang-github-stretchr-testify-dev=1.8.1-1", "deb:golang-github-prometheus-client-golang-dev=1.14.0-3",
           "deb:golang-gopkg-yaml.v3-dev=3.0.1-3", "deb:golang-github-spf13-cobra-dev=1.6.1-1",
           "deb:golang-github-google-go-cmp-dev=0.5.9-1", "deb:golang-github-gorilla-mux-dev=1.8.0-1"),
    "rust": ("deb:librust-clap-dev=4.0.32-1", "deb:librust-chrono-dev=0.4.23-2", "deb:librust-hashbrown-dev=0.12.3-1",
             "deb:librust-serde-json-dev=1.0.87-1", "deb:librust-regex-dev=1.7.1-1", "deb:librust-rand-dev=0.8.5-1"),
    "java": (f"{_JDK}/lang:GPL-2.0-only WITH Classpath-exception-2.0",),
}


REGISTRIES = ("npm:", "deb:")  # prefixes of the entries a corpus list may name beside PyPI's "name==version"


def split_entry(entry: str) -> tuple[str, str, str, str]:
    """(registry, spec, folder, licence) of an entry "registry:spec[:folder][:licence]". A
    Debian version's epoch ("deb:name=1:0.7.0-1:folder") belongs to the spec."""
    registry, _, rest = entry.partition(":")
    spec, _, rest = rest.partition(":")
    if registry == "deb" and re.fullmatch(r"[^=]+=\d+", spec) and rest:  # "name=EPOCH" + ":version..."
        version, _, rest = rest.partition(":")
        spec = f"{spec}:{version}"
    folder, _, licence = rest.partition(":")
    return registry, spec, folder, licence


def entry_name(entry: str) -> str:
    """The package name of an entry "npm:name@version..." or "deb:name=version..." (PEP 503
    normalised, as PyPI's names are compared)."""
    from mlxio.data import pypi_sources

    registry, spec, _, _ = split_entry(entry)
    name = spec.rpartition("@")[0] if registry == "npm" else spec.partition("=")[0]
    return pypi_sources.canonical(name or spec)


def fetch_entry(entry: str, cache_dir: Path | str) -> tuple[Source, Path]:
    """(the package, the folder of it to mine) of one HELDOUT-style entry
    "registry:spec[:folder][:licence]" (registry pypi, npm or deb)."""
    from mlxio.data import pypi_sources

    registry, spec, folder, licence = split_entry(entry)
    if registry == "pypi":
        source = pypi_sources.fetch(spec, cache_dir)
    elif registry == "npm":
        source = fetch_npm(spec, cache_dir)
    elif registry == "deb":
        source = fetch_deb(spec, cache_dir, licence or None)
    else:
        raise DataError(f"source {entry!r}: registry {registry!r} is not pypi, npm or deb")
    root = Path(source.root) / folder if folder else Path(source.root)
    if not root.is_dir():
        raise DataError(f"source {entry!r}: no folder {root} in the package")
    return source, root
