"""The Markdown docs: every relative link names a file that exists, and every #fragment a heading in it; every
section of the benchmarks' pages that the code, params and docs cite by title is on the page they name."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from urllib.parse import unquote

from tests.conftest import REPO, repo_files

LINK = re.compile(r"\]\(([^)\s]+)\)")
LINKED_WORDS = re.compile(r"\[([^\]]*)\]\([^)]*\)")  # a link, its words in group 1
FENCE = "```"
# `benchmarks/<page>.md, "<title>"` or `[the runs](../benchmarks/<page>.md#<anchor>), "<title>"`, as code, params and
# docs cite the benchmarks.
WRITTEN_BY_HAND = {".py", ".md", ".yaml", ".sh", ".toml", ""}  # "": the Makefile
CITATION = re.compile(r'benchmarks/(\w+\.md)(?:#[\w-]+\))?(?:\x27s)?,? "([^"]+)"')


def docs() -> list[Path]:
    """The Markdown we write; the results' tables and reports are written by scripts."""
    written = (REPO / "benchmarks" / "results", REPO / "reports")
    return [path for path in repo_files("*.md") if not any(path.is_relative_to(folder) for folder in written)]


def outside_code(path: Path) -> list[tuple[int, str]]:
    """The file's numbered lines, less those in fenced code blocks."""
    lines, in_code = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith(FENCE):
            in_code = not in_code
        elif not in_code:
            lines.append((number, line))
    return lines


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """The fragments GitHub gives the file's headings: lower case, punctuation dropped, spaces as hyphens, a repeated
    heading's with -1, -2, ..."""
    seen: dict[str, int] = {}
    fragments = set()
    for _, line in outside_code(path):
        heading = re.match(r"#{1,6} (.*)", line)
        if heading:
            text = LINKED_WORDS.sub(r"\1", heading.group(1)).lower()
            slug = re.sub(r"[^\w\- ]", "", text).strip().replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            fragments.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
    return frozenset(fragments)


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    broken = []
    for doc in docs():
        for number, line in outside_code(doc):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                path, _, fragment = target.partition("#")
                destination = (doc.parent / unquote(path)).resolve() if path else doc
                where = f"{doc.relative_to(REPO)}:{number}: {target}"
                if not destination.exists():
                    broken.append(f"{where} (no such file)")
                elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
                    broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


def plain(markdown: str) -> str:
    """Text as it reads: links as their words, no emphasis or code marks, runs of space as one."""
    return re.sub(r"\s+", " ", re.sub(r"[*`]", "", LINKED_WORDS.sub(r"\1", markdown)))


@functools.cache
def page_text(page: Path) -> str | None:
    """A benchmarks page as it reads, read once however many places cite it; None where there is no such page."""
    return plain(page.read_text()) if page.exists() else None


def test_every_cited_benchmark_section_is_on_the_page_named():
    pages = REPO / "benchmarks"
    missing = []
    for path in repo_files("*"):
        if path.suffix not in WRITTEN_BY_HAND:
            continue
        # A citation may break over lines of a comment or docstring.
        text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", path.read_text(errors="replace"))
        for page, title in CITATION.findall(text):
            text_of_page = page_text(pages / page)
            if text_of_page is None or plain(title) not in text_of_page:
                missing.append(f'{path.relative_to(REPO)}: benchmarks/{page}, "{title}"')
    assert not missing, "\n".join(missing)
