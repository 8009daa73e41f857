"""The README and docs/ link where they say: every relative link and
`#anchor` resolves, and so does every place outside them that points into
them (docstrings, the examples)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# `docs/page.md` or `docs/page.md#anchor`, as code and examples cite them.
CITED = re.compile(r"docs/[\w/]+\.md(?:#[\w-]+)?")


def anchors(path):
    """GitHub's anchors of the headings of the Markdown file `path`."""
    found, in_code = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            text = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return found


def unresolved(source, target):
    """Why `target` (a link or citation, relative to `source`'s folder)
    does not resolve, or None."""
    if re.match(r"[a-z]+:", target):
        return None  # https:, mailto:
    path, _, anchor = target.partition("#")
    file = (source.parent / path).resolve() if path else source
    if not file.exists():
        return f"{target}: no {file}"
    if anchor and (file.suffix != ".md" or anchor not in anchors(file)):
        return f"{target}: no heading #{anchor} in {file.name}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_of_the_page_resolves(page):
    broken = [
        problem
        for target in LINK.findall(page.read_text())
        if (problem := unresolved(page, target))
    ]
    assert not broken


def test_every_place_that_cites_a_docs_page_finds_it():
    sources = [
        *(ROOT / "keras_clones").rglob("*.py"),
        *(ROOT / "examples").glob("*.py"),
        *(ROOT / "bench").glob("*.py"),
    ]
    cited = {
        (source, target)
        for source in sources
        for target in CITED.findall(source.read_text())
    }
    assert cited  # The docstrings cite their pages.
    broken = [
        f"{source.relative_to(ROOT)}: {problem}"
        for source, target in cited
        if (problem := unresolved(ROOT / "README.md", target))
    ]
    assert not broken


def test_nothing_points_to_a_readme_section_that_moved():
    # The README is the front door; its old sections live in docs/.
    sources = [
        *(ROOT / "keras_clones").rglob("*.py"),
        *(ROOT / "examples").glob("*.py"),
    ]
    stale = [
        f"{source.relative_to(ROOT)}: {line.strip()}"
        for source in sources
        for line in source.read_text().splitlines()
        if re.search(r"README(?:'s|\.md \()", line)
    ]
    assert not stale


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    agn = next(i for i, line in enumerate(lines) if "AGNOptimizer(" in line)
    assert agn < 100
