"""Every relative link in the README and the docs points at a file that exists and, for
`file.md#anchor`, at a heading of that file (GitHub's slug), so a section moved from one file to
another cannot leave a dead link behind. Paths written as code (`docs/air-gapped.md`) are the
repository's other way of pointing at a document; they are read from the repository root."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "sim" / "README.md"])

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) or [text](target "title"); images too. The text may hold code spans.
INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
DOC_PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)+\.md(?:#[\w-]+)?$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, file:, ...


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lowercased, punctuation but `-` and `_`
    dropped, each space a hyphen."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link renders as its text
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)   # emphasis markers, not snake_case
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file, duplicates numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str, Path]]:
    """(line, link as written, the directory it is relative to) of every relative link."""
    found = []
    for number, line in prose_lines(path):
        code = [m.group(2).strip() for m in CODE_SPAN.finditer(line)]
        prose = CODE_SPAN.sub(lambda m: "\0" * len(m.group(0)), line)
        targets = [m.group(1) for m in INLINE_LINK.finditer(prose)]
        reference = REFERENCE.match(prose)
        if reference:
            targets.append(reference.group(1))
        found += [(number, t, path.parent) for t in targets if not EXTERNAL.match(t)]
        found += [(number, c, REPO) for c in code if DOC_PATH.match(c)]
    return found


def dead_links(path: Path) -> list[str]:
    """What is wrong with each link of one file, in words a reader of that file can act on."""
    problems = []
    for number, link, base in links(path):
        target, _, anchor = link.partition("#")
        where = f"{path.relative_to(REPO)}:{number}: {link}"
        file = (base / target).resolve() if target else path
        if not file.exists():
            shown = file.relative_to(REPO) if file.is_relative_to(REPO) else file
            problems.append(f"{where}: no file {shown}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{where}: no heading with anchor #{anchor} in {file.relative_to(REPO)}"
                            f" (it has: {', '.join(sorted(anchors(file)))})")
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    problems = dead_links(path)
    assert not problems, "dead links:\n" + "\n".join(problems)


def test_the_readme_links_every_doc() -> None:
    linked = {(base / link.partition("#")[0]).resolve()
              for _, link, base in links(REPO / "README.md")}
    missing = [str(p.relative_to(REPO)) for p in DOCUMENTS
               if p != REPO / "README.md" and p.resolve() not in linked]
    assert not missing, f"README.md links none of: {', '.join(missing)}"


def test_slugs_follow_github() -> None:
    assert slug("Stack outputs (the contract for downstream tooling)") == \
        "stack-outputs-the-contract-for-downstream-tooling"
    assert slug("From `deploy_pd.sh`") == "from-deploy_pdsh"
    assert slug("Healing without a human: `scripts/kimipd reconcile`") == \
        "healing-without-a-human-scriptskimipd-reconcile"
    assert slug("B6: serving through changes (2026-12-01 00:31, one run)") == \
        "b6-serving-through-changes-2026-12-01-0031-one-run"
    assert slug("**Bold** and _emphasis_") == "bold-and-emphasis"


def test_a_dead_link_and_a_missing_anchor_are_reported(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Same\n\n## Same\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "See [a](docs/a.md#same-1), [b](docs/b.md), [gone](docs/a.md#other), `docs/c.md`,\n"
        "[web](https://example.com/x.md) and [here](#top).\n\n# Top\n\n"
        "```\n[in a fence](nowhere.md)\n```\n`[in code](nowhere.md)`\n")
    problems = dead_links(readme)
    assert problems == [
        "README.md:1: docs/b.md: no file docs/b.md",
        "README.md:1: docs/a.md#other: no heading with anchor #other in docs/a.md"
        " (it has: a, same, same-1)",
        "README.md:1: docs/c.md: no file docs/c.md",
    ], problems
