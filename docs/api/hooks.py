"""mkdocs hooks: the repository's README files and research results as pages of the site, and relative links
rewritten to match.

The guide pages link to ``../README.md``, ``../examples/README.md``, ``../research/README.md`` and the research
results (``../research/results.md``, the study's outputs under ``research/study/``), files outside ``docs/`` that
mkdocs would not find (``mkdocs build --strict`` fails on such a link). The site shows the README as ``index.md``
(the home page) and every other such file under ``repo/`` at its repository path; every relative Markdown link of
every page is resolved as a path of the repository and rewritten to that path's page, so the files keep the links
that work on GitHub and in a checkout. Offline: reads only files of this repository.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

_MIRRORED = {
    "README.md": "index.md",
    "examples/README.md": "repo/examples/README.md",
    "research/README.md": "repo/research/README.md",
    "research/results.md": "repo/research/results.md",
}
"""Repository files outside docs/ shown as pages: repository path -> the page's path in the site."""

_MIRRORED_FOLDERS = ("research/study",)
"""Repository folders whose Markdown pages and images the site shows under ``repo/`` at the same path."""

_MIRRORED_SUFFIXES = (".md", ".png")

_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")
"""An inline Markdown link's target: ``](path#anchor)``."""


def _repository_root(config) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def on_files(files, config):
    """Adds the mirrored files as generated pages (and the mirrored folders' images)."""
    root = _repository_root(config)
    for folder in _MIRRORED_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in _MIRRORED_SUFFIXES:
                _MIRRORED[path.relative_to(root).as_posix()] = f"repo/{path.relative_to(root).as_posix()}"
    for repository_path, site_path in _MIRRORED.items():
        files.append(File.generated(config, site_path, content=(root / repository_path).read_bytes()))
    return files


def _repository_path(site_path: str) -> str:
    """The repository path of the page at ``site_path`` (a docs/ page or a mirrored file)."""
    for repository_path, mirrored in _MIRRORED.items():
        if mirrored == site_path:
            return repository_path
    return f"docs/{site_path}"


def _site_path(repository_path: str) -> str | None:
    """The site path of the repository file at ``repository_path``; None if the site does not show it."""
    if repository_path in _MIRRORED:
        return _MIRRORED[repository_path]
    if repository_path.startswith("docs/"):
        return repository_path.removeprefix("docs/")
    return None


def on_page_markdown(markdown, page, config, files):
    """Rewrites each relative link of ``page`` from a repository path to the site's page of that path."""
    page_directory = posixpath.dirname(page.file.src_uri)
    source_directory = posixpath.dirname(_repository_path(page.file.src_uri))

    def rewrite(match: re.Match) -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        site_path = _site_path(posixpath.normpath(posixpath.join(source_directory, target)))
        if site_path is None:  # Left as it is: mkdocs --strict reports it.
            return match.group(0)
        relative = posixpath.relpath(site_path, page_directory or ".")
        return f"{match.group(1)}{relative}{match.group(3) or ''}{match.group(4)}"

    return _LINK.sub(rewrite, markdown)
