"""proxy/errors.py's drawn exception tree is its classes: every one drawn, under its base."""

from __future__ import annotations

import inspect
import re

from proxy import errors

_BRANCH = re.compile(r"^(?P<indent>[ │]*)(?:├── |└── )?(?P<name>[A-Z]\w*)")


def drawn_tree(docstring: str) -> dict[str, str | None]:
    """Each class the module docstring's tree draws, with the class it is drawn under (None: the
    root)."""
    tree: dict[str, str | None] = {}
    path: list[str] = []
    lines = docstring.split("\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    for line in lines:
        match = _BRANCH.match(line.removeprefix("    "))
        assert match is not None, f"not a line of the tree: {line!r}"
        depth = len(match["indent"]) // 4 + (1 if "── " in line else 0)
        del path[depth:]
        tree[match["name"]] = path[-1] if path else None
        path.append(match["name"])
    return tree


def defined_tree() -> dict[str, str | None]:
    """Each exception class proxy/errors.py defines, with its base (None: OpgateError's)."""
    return {
        name: None if cls is errors.OpgateError else cls.__bases__[0].__name__
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.OpgateError) and cls.__module__ == errors.__name__
    }


def test_the_drawn_tree_is_the_classes() -> None:
    """Every exception of proxy/errors.py is drawn in its docstring, under its base, and the
    drawing holds nothing else."""
    assert errors.__doc__ is not None
    assert drawn_tree(errors.__doc__) == defined_tree()


def test_the_tree_reader_sees_nesting() -> None:
    """The reader itself: a class drawn one level deeper is read as the child of the one above."""
    doc = "intro\n\n    A\n    ├── B  b\n    │   └── C  c\n    └── D  d\n\nafter"
    assert drawn_tree(doc) == {"A": None, "B": "A", "C": "B", "D": "A"}
