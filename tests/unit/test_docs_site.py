"""The docs site builds in MkDocs' strict mode: a broken link, a missing anchor, a page
left out of the navigation or an API reference that does not resolve fails the build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")},
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    api = (site / "http-api" / "index.html").read_text()
    assert "/v1/rooms/{room}/tasks" in api  # made from the OpenAPI document
    assert (site / "openapi.json").is_file()
    assert "claim_next" in (site / "reference" / "rooms" / "index.html").read_text()
    assert "BENCHMARKS" not in (site / "index.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    for name in ("mkdocs.yml", "BENCHMARKS.md"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "src", copy / "src")
    page = copy / "docs" / "install.md"
    page.write_text(page.read_text() + "\nSee [the missing page](missing.md).\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "missing.md" in done.stdout + done.stderr
