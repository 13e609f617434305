"""Write the course's notebooks, one per lesson of lessons.py and lesson_replicas.py, into examples/course/.

    python examples/course/make_course.py [--out DIR]

tests/test_course.py checks that the committed notebooks are this script's output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "two_notebooks"))

from lesson_replicas import REPLICAS  # noqa: E402
from lessons import LESSONS, TAIL, Lesson, head  # noqa: E402
from make_notebooks import notebook_of, write_all  # noqa: E402


def build(lesson: Lesson) -> nbformat.NotebookNode:
    """The notebook of one lesson; cell ids are fixed so that the output is reproducible."""
    cells = [new_markdown_cell(f"# {lesson.title}\n\n{lesson.intro}", id="intro")]
    for cell in [*head(lesson.name), *lesson.cells, *TAIL]:
        if cell.kind == "markdown":
            cells.append(new_markdown_cell(cell.source, id=cell.id))
        else:
            metadata = {"tags": cell.tags} if cell.tags else {}
            cells.append(new_code_cell(cell.source, id=cell.id, metadata=metadata))
    return notebook_of(cells)


def main(argv: list[str] | None = None) -> int:
    return write_all(__doc__.split("\n", 1)[0], HERE,
                     lambda: {f"{lesson.name}.ipynb": build(lesson) for lesson in [*LESSONS, REPLICAS]}, argv)


if __name__ == "__main__":
    sys.exit(main())
