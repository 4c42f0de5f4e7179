"""The student versions of the labs: each notebook with its predictions left blank, its outputs
cleared and its worked explanations taken out, for the course to hand out while the committed
notebooks keep the worked answers (``scaledl-lab student-notebooks OUT_DIR``).

A blank prediction is ``...``: ``viz.exercises.check`` answers it with "not answered yet". A
prediction held in a dict keeps its keys (they are the question) and loses its values. A worked
explanation is a markdown paragraph that opens with ``**Explain.**`` or ``**Explanation.**``;
``**Explain**:`` opens a question to the student and stays."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
LABS = "[0-9][0-9]_*.ipynb"
BLANK = "..."
YOUR_PREDICTION = "# ← your prediction"
WORKED = re.compile(r"^\*\*Explain(?:ation)?\.\*\*.*?(?=\n\s*\n|\Z)", re.M | re.S)
YOUR_EXPLANATION = "**Explain.** *Your explanation.*"


def write_student_notebooks(
    out: str | Path, source: str | Path = NOTEBOOKS, *, overwrite: bool = False
) -> list[Path]:
    """Write the student version of every lab ``source/NN_*.ipynb`` into ``out`` (created if
    need be) under the same name; return the paths written. A notebook already there (a
    student's answers, perhaps) is replaced only with ``overwrite``."""
    labs = sorted(Path(source).glob(LABS))
    if not labs:
        raise FileNotFoundError(f"no lab notebooks ({LABS}) in {source}")
    out = Path(out)
    there = [lab.name for lab in labs if (out / lab.name).exists()]
    if there and not overwrite:
        raise FileExistsError(
            f"{out} already holds {', '.join(there)}: choose an empty folder, or pass "
            "overwrite=True (--overwrite) to replace them"
        )
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for lab in labs:
        notebook = student_version(json.loads(lab.read_text(encoding="utf-8")))
        target = out / lab.name
        target.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", "utf-8")
        written.append(target)
    return written


def student_version(notebook: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``notebook`` (nbformat 4, as JSON) with its predictions blank, its outputs
    and widget state gone and its worked explanations replaced by a place to write one."""
    cells = []
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        cell = dict(cell)
        if cell["cell_type"] == "code":
            source = blank_predictions(source)
            cell.update(outputs=[], execution_count=None)
        elif cell["cell_type"] == "markdown":
            source = WORKED.sub(YOUR_EXPLANATION, source)
        cell["source"] = source.splitlines(keepends=True)
        cells.append(cell)
    metadata = {k: v for k, v in notebook.get("metadata", {}).items() if k != "widgets"}
    return {**notebook, "cells": cells, "metadata": metadata}


def blank_predictions(source: str) -> str:
    """``source`` (a code cell) with the value of every top-level assignment to ``prediction…``
    names replaced by ``...`` (one per name of a tuple; a dict's values only), the comment that
    says what to predict kept (``# ← your prediction`` where there is none)."""
    lines = source.splitlines(keepends=True)
    tree = _parse(source)
    if tree is None:
        return source
    for node in reversed(tree.body):  # from the bottom: earlier positions stay valid
        if isinstance(node, ast.Assign) and _predicts(node):
            _replace(lines, node, _blank_value(node, source))
    return "".join(lines)


def _parse(source: str) -> ast.Module | None:
    """The cell's syntax tree, IPython's ``%magic`` and ``!shell`` lines read as comments; None
    where the cell is not Python."""
    masked = re.sub(r"^(\s*)[%!]", r"\1#", source, flags=re.M)
    try:
        return ast.parse(masked)
    except SyntaxError:
        return None


def _predicts(node: ast.Assign) -> bool:
    names = [t for target in node.targets for t in getattr(target, "elts", [target])]
    return bool(names) and all(
        isinstance(n, ast.Name) and n.id.startswith("prediction") for n in names
    )


def _blank_value(node: ast.Assign, source: str) -> str:
    target = node.targets[-1]
    if isinstance(target, ast.Tuple):
        return ", ".join([BLANK] * len(target.elts))
    value = node.value
    if isinstance(value, ast.Dict) and all(k is not None for k in value.keys):
        keys = [ast.get_source_segment(source, k) or ast.unparse(k) for k in value.keys]
        return "{" + ", ".join(f"{k}: {BLANK}" for k in keys) + "}"
    return BLANK


def _replace(lines: list[str], node: ast.Assign, blank: str) -> None:
    """Put ``blank`` after the ``=`` of ``node``, in place of all it assigns (parentheses
    included; AST columns are UTF-8 byte offsets)."""
    target = node.targets[-1]
    first, last = (target.end_lineno or target.lineno) - 1, (node.end_lineno or node.lineno) - 1
    line = lines[first].encode()
    equals = line.index(b"=", target.end_col_offset or 0) + 1
    head = line[:equals].decode() + " "
    tail = lines[last].encode()[node.end_col_offset :].decode()
    if not tail.strip():  # no comment: say what the blank is for
        tail = f"  {YOUR_PREDICTION}{tail.lstrip(' ')}"
    lines[first : last + 1] = [head + blank + tail]
