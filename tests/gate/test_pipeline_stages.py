"""The pipeline's stage numbers are one list: the numbered comments of proxy/gate/pipeline.py.
The README's and docs/concepts/pipeline.md's stage lists, and every "stage N" a module, page or
test names, agree with it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.paths import README, REPO

PIPELINE = REPO / "proxy" / "gate" / "pipeline.py"
CONCEPT = REPO / "docs" / "concepts" / "pipeline.md"
_STAGE_COMMENT = re.compile(r"^\s*# (\d+)([a-z]?)\. (\w+)", re.MULTILINE)
_README_STAGE = re.compile(r"^(?:agent ──>)?\s+(\d+) (\w+) ", re.MULTILINE)
_CONCEPT_STAGE = re.compile(r"^(\d+)\. \*\*(\w+)\*\*", re.MULTILINE)
_MENTION = re.compile(r"\b[Ss]tages? (\d+[a-z]?)(?:(?:-| and | to )(\d+[a-z]?))?\b")


def pipeline_stages() -> dict[str, list[str]]:
    """Each main stage number of pipeline.py with the names its comments give it and its
    lettered parts (``4``: prepare, ``4b``: preconditions, ``4c``: claim)."""
    stages: dict[str, list[str]] = {}
    for number, letter, name in _STAGE_COMMENT.findall(PIPELINE.read_text("utf-8")):
        stages.setdefault(number, []).append(name)
        assert letter or len(stages[number]) == 1, f"pipeline.py numbers stage {number} twice"
    return dict(sorted(stages.items(), key=lambda item: int(item[0])))


def pipeline_labels() -> set[str]:
    """Every label a stage comment of pipeline.py carries: ``4``, ``4b``, ``5b``..."""
    return {n + letter for n, letter, _ in _STAGE_COMMENT.findall(PIPELINE.read_text("utf-8"))}


def _readme_block() -> str:
    text = README.read_text("utf-8")
    section = text.split("## The request pipeline, in one screen", 1)[1]
    return section.split("```", 2)[1]


def test_pipeline_numbers_its_stages_one_to_n() -> None:
    """pipeline.py's stage comments are numbered 1..n, without a gap (a gap is how forward
    came to be 6 there and 5 in the README)."""
    numbers = [int(n) for n in pipeline_stages()]
    assert numbers == list(range(1, len(numbers) + 1)), numbers


def test_the_readme_lists_the_pipelines_stages() -> None:
    """The README's one-screen stage list has pipeline.py's numbers, each under one of the
    names pipeline.py gives that stage."""
    stages = pipeline_stages()
    listed = _README_STAGE.findall(_readme_block())
    assert [n for n, _ in listed] == list(stages), listed
    for number, name in listed:
        assert name in stages[number], f"README stage {number} {name}: pipeline.py says {stages}"


def test_the_concept_page_lists_the_pipelines_stages() -> None:
    """docs/concepts/pipeline.md's numbered stages are pipeline.py's, by number and name."""
    stages = pipeline_stages()
    listed = _CONCEPT_STAGE.findall(CONCEPT.read_text("utf-8"))
    assert [n for n, _ in listed] == list(stages), listed
    for number, name in listed:
        assert name in stages[number], f"docs stage {number} {name}: pipeline.py says {stages}"


def _mentions() -> list[tuple[Path, str]]:
    files = [README, *REPO.glob("docs/**/*.md"), *REPO.glob("proxy/**/*.py")]
    files += REPO.glob("tests/**/*.py")
    found = []
    for path in files:
        for match in _MENTION.finditer(path.read_text("utf-8")):
            found += [(path, label) for label in match.groups() if label is not None]
    return found


def test_every_stage_a_module_or_page_names_is_a_stage_of_the_pipeline() -> None:
    """A "stage N" (or "stages N-M") anywhere in the code, docs or tests names a stage that
    pipeline.py numbers so."""
    labels = pipeline_labels()
    mentions = _mentions()
    assert mentions, "no stage is named anywhere: the pattern no longer matches"
    wrong = sorted(
        f"{path.relative_to(REPO)}: stage {label}"
        for path, label in mentions
        if label not in labels
    )
    assert not wrong, f"stages pipeline.py does not number ({sorted(labels)}): {wrong}"
