"""MkDocs hook: links from a page to repository files outside ``docs/``.

The pages link to files beside the documentation (the README, the examples, the protocol's model,
recorded benchmark results) with paths such as ``../model/README.md``, which work wherever the
repository is read. MkDocs knows only the files under ``docs/`` and would report each of them as not
found. This hook checks every such link instead: a target missing from the repository is a warning,
which the strict build turns into a failure, like any other broken link. In the built site the link
points at a copy of the file under ``_repo/``.
"""

from __future__ import annotations

import html
import logging
import re
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.repo_links")

REPO = Path(__file__).resolve().parents[2]  # docs/hooks/repo_links.py -> the repository
DOCS = REPO / "docs"
COPIES = "_repo"  # the copies' folder in the built site
# [text](../path) or [text](../path#anchor), not an image, not inside inline code
LINK = re.compile(r"(?<![!`])\[(?P<text>[^\]]+)\]\((?P<target>\.\./[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")
CODE = re.compile(r"`([^`]+)`")
FENCE = re.compile(r"^(```|~~~)")

_linked: set[str] = set()


def outside_target(page_src: str, target: str) -> tuple[Path, str | None]:
    """The file a link of page ``page_src`` (relative to docs/) names, and why it is broken (None: fine)."""
    path = ((DOCS / page_src).parent / target).resolve()
    try:
        path.relative_to(REPO)
    except ValueError:
        return path, "it leaves the repository"
    if not path.exists():
        return path, "no such file or folder in the repository"
    return path, None


def _html_link(text: str, href: str) -> str:
    label = CODE.sub(lambda m: f"<code>{html.escape(m.group(1))}</code>", html.escape(text, quote=False))
    return f'<a href="{html.escape(href)}">{label}</a>'


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src = page.file.src_uri
    up = "../" * page.file.url.count("/")  # from the page's place in the site to its root

    def rewrite(match: re.Match[str]) -> str:
        path, broken = outside_target(src, match["target"])
        if broken:
            log.warning("Doc file '%s' links to '%s': %s", src, match["target"], broken)
            return match.group(0)
        rel = path.relative_to(REPO).as_posix()
        _linked.add(rel)
        return _html_link(match["text"], f"{up}{COPIES}/{rel}{match['anchor'] or ''}")

    out, fenced = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        out.append(line if fenced else LINK.sub(rewrite, line))
    return "\n".join(out)


def on_post_build(config: Any) -> None:
    site = Path(config["site_dir"])
    for rel in sorted(_linked):
        source, dest = REPO / rel, site / COPIES / rel
        if source.is_dir():
            shutil.copytree(source, dest, dirs_exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)
    _linked.clear()
