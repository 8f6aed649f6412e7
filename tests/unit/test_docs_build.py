"""The documentation builds strictly, and every link a reader may follow resolves (issue #30).

``mkdocs build --strict`` with the repository's ``mkdocs.yml`` (nav by reader, link and anchor
validation, and the hook ``docs/hooks/repo_links.py`` that checks links to files beside ``docs/``)
must pass, built into the test's own folder (never ``site/`` in the repository). The same build must
fail on a broken link, a link to a missing heading, a link to a missing file beside ``docs/`` and a
page left out of the nav: each is tried on a copy of ``docs/``. The READMEs outside the site (the
repository's, the examples', the benchmarks') are checked here: every relative link names a file
or folder that exists, and an anchor into a Markdown file names one of its headings.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "mkdocs.yml"
READMES = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "examples").glob("*/README.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``site``; stdout and stderr together."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        check=False,
    )


def test_docs_build_strictly_into_the_tests_folder(tmp_path: Path) -> None:
    site = tmp_path / "site"
    repo_site_before = (ROOT / "site").exists()

    done = mkdocs_build(CONFIG, site)

    assert done.returncode == 0, done.stdout
    assert "WARNING" not in done.stdout, done.stdout
    assert (site / "index.html").is_file()
    for page in ("getting-started", "pipelines", "operations", "deploy", "guarantees", "benchmarks"):
        assert (site / page / "index.html").is_file(), page
    assert (site / "_repo" / "model" / "README.md").is_file()  # a link beside docs/, copied into the site
    assert not (site / "hooks").exists()  # the hook is not published
    assert (ROOT / "site").exists() == repo_site_before  # nothing built into the repository


def _broken_copy(tmp_path: Path, page: str, text: str) -> Path:
    """A copy of docs/ where ``page`` ends with ``text``, and a config that builds that copy."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    target = docs / page
    target.write_text((target.read_text() if target.exists() else "# An orphan page\n") + "\n" + text + "\n")
    config = yaml.safe_load(CONFIG.read_text())
    config["docs_dir"] = str(docs)
    config["hooks"] = [str(ROOT / hook) for hook in config["hooks"]]
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    ("page", "text", "named"),
    [
        pytest.param(
            "pipelines.md", "See [a page](no-such-page.md).", "no-such-page.md", id="link to a missing page"
        ),
        pytest.param(
            "pipelines.md",
            "See [a heading](operations.md#no-such-heading).",
            "no-such-heading",
            id="missing anchor",
        ),
        pytest.param(
            "guarantees.md",
            "See [a file](../no/such/file.json).",
            "no/such/file.json",
            id="missing file beside docs",
        ),
        pytest.param("orphan.md", "Nobody links here.", "orphan.md", id="page missing from the nav"),
    ],
)
def test_docs_build_fails_on_a_broken_link_or_a_page_missing_from_nav(
    tmp_path: Path, page: str, text: str, named: str
) -> None:
    config = _broken_copy(tmp_path, page, text)

    done = mkdocs_build(config, tmp_path / "site")

    assert done.returncode != 0, done.stdout
    assert named in done.stdout, done.stdout


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and Python-Markdown's toc both make it for plain headings."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(markdown: Path) -> set[str]:
    found, fenced = set(), False
    for line in markdown.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            found.add(_slug(m.group(1)))
    return found


def relative_links(markdown: Path) -> list[str]:
    """The relative link targets of a Markdown file, outside fenced code blocks."""
    links, fenced = [], False
    for line in markdown.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            links += [t for t in LINK.findall(line) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]
    return links


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_the_readmes_resolves(readme: Path) -> None:
    broken = []
    for link in relative_links(readme):
        target, _, anchor = link.partition("#")
        path = (readme.parent / target).resolve() if target else readme
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.relative_to(ROOT)}")

    assert not broken, f"{readme.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_links_into_every_page_of_the_docs() -> None:
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in relative_links(ROOT / "README.md")}

    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p.name != "index.md"}

    assert pages <= linked, sorted(str(p.relative_to(ROOT)) for p in pages - linked)
