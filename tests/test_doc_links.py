"""Every relative link in the README, the changelog and docs/ leads somewhere: the file exists,
and an anchor names a heading of it, slugged as GitHub slugs them. A renamed heading otherwise
leaves links that open the page at its top, and no one notices."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text()).splitlines():
        if heading := re.match(r"#{1,6}\s+(.*)", line):
            base = slug(heading[1])
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(FENCE.sub("", page.read_text()))
        if not re.match(r"[a-z]+:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_and_a_heading_that_exist(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no such heading")
    assert not broken, "\n".join(broken)


def test_a_slug_is_githubs():
    assert slug("The HTTP API") == "the-http-api"
    assert slug("`numaserve tune --config FILE`") == "numaserve-tune---config-file"
    assert slug("Which HTTP server library (for the HTTP front)") == (
        "which-http-server-library-for-the-http-front"
    )


def test_the_readme_stays_a_product_page_of_at_most_1200_words():
    """What it does, how fast, how to start and call it, links to the rest: the details live in
    docs/, the history in CHANGELOG.md."""
    words = len((ROOT / "README.md").read_text().split())
    assert words <= 1200, f"README.md has {words} words; move detail to docs/"
