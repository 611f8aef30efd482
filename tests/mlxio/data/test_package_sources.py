"""npm and Debian package sources (mlxio.data.package_sources), their clients replaced by
scripts that log their calls."""

from __future__ import annotations

import stat

import pytest

from mlxio.data import package_sources as ps
from mlxio.errors import DataError

COPYRIGHT = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: itertools

Files: debian/*
License: GPL-2+

Files: *
Copyright: 2015 bluss
License: MIT or Apache-2.0

License: MIT
 Permission is hereby granted...
"""


def _script(path, body: str):
    path.write_text("#!/bin/bash\nset -e\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_npm_fetch_unpacks_once_and_records_the_licence(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    fake = _script(tmp_path / "npm", f'''echo "$*" >> {log}
mkdir -p package && echo '{{"name": "left-pad", "version": "1.3.0", "license": "WTFPL"}}' > package/package.json
echo 'function leftPad(s) {{ return s; }}' > package/index.js
tar czf left-pad-1.3.0.tgz package && rm -r package
''')
    monkeypatch.setattr(ps, "NPM", [fake])
    first = ps.fetch_npm("left-pad@1.3.0", tmp_path / "cache")
    again = ps.fetch_npm("left-pad@1.3.0", tmp_path / "cache")
    assert first == again and log.read_text().splitlines() == ["left-pad@1.3.0"]
    assert (first.name, first.version, first.licence) == ("left-pad", "1.3.0", "WTFPL")
    assert (tmp_path / "cache" / "npm" / "left-pad-1.3.0" / "src" / "package" / "index.js").is_file()


def test_deb_fetch_reads_the_copyright_stanza_for_all_files(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    monkeypatch.setattr(ps, "APT_DOWNLOAD", [_script(tmp_path / "apt", f'echo "$*" >> {log}; touch x.deb\n')])
    (tmp_path / "copyright").write_text(COPYRIGHT)
    monkeypatch.setattr(ps, "DPKG_EXTRACT", [_script(tmp_path / "dpkg", f'''doc="$2/usr/share/doc/librust-itertools-dev"
mkdir -p "$doc" "$2/usr/share/cargo/registry/itertools-0.10.3/src"
cp {tmp_path / "copyright"} "$doc/copyright"
''')])
    got = ps.fetch_deb("librust-itertools-dev=0.10.3-1", tmp_path / "cache")
    assert got.licence == "MIT or Apache-2.0" and got.version == "0.10.3-1"
    assert ps.fetch_deb("librust-itertools-dev=0.10.3-1", tmp_path / "cache") == got
    assert log.read_text().splitlines() == ["librust-itertools-dev=0.10.3-1"]
    assert ps.debian_licence("no stanzas here") == "unknown"
    assert ps.debian_licence("Files: debian/*\nLicence: x\nLicense: GPL-3\n") == "GPL-3"


def test_unpinned_or_unfetchable_packages_are_one_clear_line(tmp_path, monkeypatch):
    for bad in ("lodash", "lodash@latest", "lodash@^4"):
        with pytest.raises(DataError, match="pinned 'name@version'"):
            ps.fetch_npm(bad, tmp_path)
    with pytest.raises(DataError, match="pinned 'name=version'"):
        ps.fetch_deb("librust-itertools-dev", tmp_path)
    monkeypatch.setattr(ps, "APT_DOWNLOAD", [_script(tmp_path / "apt", 'echo "E: no network" >&2; exit 100\n')])
    with pytest.raises(DataError) as err:
        ps.fetch_deb("golang-x-dev=1.0-1", tmp_path)
    text = str(err.value)
    assert "golang-x-dev=1.0-1" in text and "E: no network" in text and "apt-get download" in text
    assert "\n" not in text


@pytest.mark.parametrize("entry, parts", [
    ("npm:lodash@4.17.21", ("npm", "lodash@4.17.21", "", "")),
    ("npm:rxjs@7.8.1:package/src", ("npm", "rxjs@7.8.1", "package/src", "")),
    ("deb:librust-regex-dev=1.7.1-1", ("deb", "librust-regex-dev=1.7.1-1", "", "")),
    ("deb:golang-golang-x-net-dev=1:0.7.0+dfsg-1", ("deb", "golang-golang-x-net-dev=1:0.7.0+dfsg-1", "", "")),
    ("deb:golang-golang-x-net-dev=1:0.7.0+dfsg-1:usr/share/gocode:MIT",
     ("deb", "golang-golang-x-net-dev=1:0.7.0+dfsg-1", "usr/share/gocode", "MIT")),
    ("deb:openjdk-17-source=17.0.21.1+2-1~deb12u1:usr/lib/jvm:GPL-2.0-only WITH Classpath-exception-2.0",
     ("deb", "openjdk-17-source=17.0.21.1+2-1~deb12u1", "usr/lib/jvm", "GPL-2.0-only WITH Classpath-exception-2.0")),
    ("pypi:networkx==3.4.2", ("pypi", "networkx==3.4.2", "", "")),
])
def test_entries_split_with_debian_epochs(entry, parts):
    from mlxio.data import pypi_sources

    assert ps.split_entry(entry) == parts
    assert ps.entry_name(entry) == pypi_sources.canonical(
        parts[1].rpartition("@")[0] if parts[0] == "npm" else parts[1].partition("=")[0])
