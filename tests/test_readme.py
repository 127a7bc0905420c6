"""The README's Python snippets (and docs/scaleplan.md's, the data-plane contract it links to) run,
and each `expression  # value` line evaluates to its value."""

from __future__ import annotations

import ast
import re

import pytest

from tests.conftest import REPO

BLOCKS = [
    block
    for page in ("README.md", "docs/scaleplan.md")
    for block in re.findall(r"```python\n(.*?)```", (REPO / page).read_text(), re.S)
]


def test_readme_has_python_snippets() -> None:
    assert BLOCKS


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.splitlines()[0][:40])
def test_readme_snippet_runs_and_its_comments_hold(block: str) -> None:
    namespace: dict[str, object] = {}
    exec(block, namespace)
    for line in block.splitlines():
        code, _, comment = line.partition("  # ")
        try:
            expected = ast.literal_eval(comment.strip())
            tree = ast.parse(code.strip(), mode="eval")
        except (ValueError, SyntaxError):
            continue  # prose comment, or a statement rather than an expression
        assert eval(compile(tree, "README", "eval"), namespace) == expected, line
