"""Download source archives (sdists) from pip's own index, checked against its sha256.

``pip download`` of vllm-ascend's sdists fails at metadata generation (it builds them), so
``tools/fetch_wheels.sh`` calls this for the releases that ship no wheel: the index URLs
are the ones pip itself reports at run time ("Looking in indexes:" of a verbose
``pip download``), the file is the ``<name>-<version>.tar.gz`` link on the project's
simple page there (PEP 503), and it is kept only when its sha256 is the page's
``#sha256=`` fragment. Standard library only.

Usage: python tools/fetch_sdists.py CACHE_DIR PROJECT VERSION [VERSION ...]
Exit 0 when every archive is in CACHE_DIR afterwards, 1 otherwise.
"""

from __future__ import annotations

import hashlib
import html
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path


def sdist_name(project: str, version: str) -> str:
    """The sdist's file name as setuptools writes it (``vllm_ascend-0.30.0rc2.tar.gz``)."""
    return f"{re.sub(r'[-_.]+', '_', project).lower()}-{version}.tar.gz"


def pip_indexes(project: str, version: str) -> list[str]:
    """The index URLs pip uses here, read from its verbose output (config, env, defaults)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "-d", tmp, "-v", f"{project}=={version}"],
            capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    for line in (out.stdout + out.stderr).splitlines():
        if line.strip().startswith("Looking in indexes:"):
            return [u.strip() for u in line.split(":", 1)[1].split(",") if u.strip()]
    return []


def _context():
    import ssl

    cafile = os.environ.get("PIP_CERT") or None  # pip's certificate bundle, when configured
    return ssl.create_default_context(cafile=cafile) if cafile else None


def project_links(index: str, project: str) -> dict[str, str]:
    """File name -> absolute URL (with its ``#sha256=`` fragment) on `index`'s simple page."""
    page = f"{index.rstrip('/')}/{re.sub(r'[-_.]+', '-', project).lower()}/"
    try:
        with urllib.request.urlopen(page, timeout=120, context=_context()) as r:
            text = r.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return {}
    links = {}
    for href, name in re.findall(r'<a\s[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', text):
        links[html.unescape(name).strip()] = urllib.parse.urljoin(page, html.unescape(href))
    return links


def download(url: str, dest: Path) -> int:
    """Fetch `url` into `dest` when its sha256 matches the URL's fragment; the byte count."""
    expected = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).fragment)).get("sha256")
    if not expected:
        raise ValueError(f"no #sha256= fragment on {url}")
    digest, size = hashlib.sha256(), 0
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(
            url.split("#", 1)[0], timeout=600, context=_context()
        ) as r:
            while chunk := r.read(1 << 20):
                digest.update(chunk)
                f.write(chunk)
                size += len(chunk)
        if digest.hexdigest() != expected:
            raise ValueError(f"sha256 mismatch for {dest.name}: {digest.hexdigest()} != {expected}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return size


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    cache, project, versions = Path(argv[0]), argv[1], argv[2:]
    cache.mkdir(parents=True, exist_ok=True)
    missing = [v for v in versions if not (cache / sdist_name(project, v)).exists()]
    if not missing:
        return 0
    start, total = time.monotonic(), 0
    indexes = pip_indexes(project, missing[0])
    links: dict[str, str] = {}
    for index in reversed(indexes):  # the first index pip lists wins
        links.update(project_links(index, project))
    status = 0
    for version in missing:
        name = sdist_name(project, version)
        if name not in links:
            print(f"fetch_sdists: {name} not on {indexes or 'any index pip reports'}",
                  file=sys.stderr)  # fmt: skip
            status = 1
            continue
        try:
            total += download(links[name], cache / name)
        except (OSError, ValueError) as e:
            print(f"fetch_sdists: could not download {name}: {e}", file=sys.stderr)
            status = 1
    print(f"fetch_sdists: {len(missing)} archive(s), {total / 1e6:.1f} MB in "
          f"{time.monotonic() - start:.1f} s", file=sys.stderr)  # fmt: skip
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
