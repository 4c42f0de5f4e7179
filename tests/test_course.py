"""The course's notebooks keep their own template: every exercise answers through
``viz.exercises.check`` on a prediction the student writes, sections and exercises are numbered
once each and in order, every lab points at its solutions, and the numbers a solution quotes are
numbers the notebook printed (or the committed results it reads)."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from scaledl_lab.course import blank_predictions, student_version

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
LABS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
SECTION = re.compile(r"^##\s+(\d+)\s*[.·]", re.M)
EXERCISE = re.compile(r"^#{2,3}\s+(?:\d+\s*[.·]\s*)?Exercise\s+(\d+)", re.M)
HEADING = re.compile(r"^#{2,3}\s", re.M)
CHECKED = re.compile(r"\bcheck\(\s*(prediction\w*)")
ASSIGNED = re.compile(r"^((?:prediction\w*\s*,\s*)*prediction\w*)\s*=(?!=)", re.M)
NUMBER = re.compile(r"(?<![\d.])-?\d+\.\d+(?![\d.])")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _exercises(path: Path) -> list[tuple[int, str, list[str]]]:
    """(number, heading cell's text, the code cells up to the next heading) of each exercise."""
    cells, out = _cells(path), []
    for i, cell in enumerate(cells):
        text = _source(cell)
        if cell["cell_type"] != "markdown" or not (match := EXERCISE.search(text)):
            continue
        code = []
        for later in cells[i + 1 :]:
            if later["cell_type"] == "markdown" and HEADING.search(_source(later)):
                break
            if later["cell_type"] == "code":
                code.append(_source(later))
        out.append((int(match.group(1)), text, code))
    return out


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.stem)
def test_every_exercise_checks_a_prediction_the_student_writes(path):
    exercises = _exercises(path)
    assert exercises, f"{path.name} has no exercise"
    for number, _, code in exercises:
        joined = "\n".join(code)
        checked = set(CHECKED.findall(joined))
        assert checked, f"{path.name}, exercise {number}: no check(prediction…) call"
        # Names assigned at the start of a line, alone or as a tuple: what the student writes.
        written = {name for line in re.findall(r"^((?:prediction\w*\s*,\s*)*prediction\w*)\s*=",
                                                joined, re.M)
                   for name in re.split(r"\s*,\s*", line)}  # fmt: skip
        assert checked <= written, f"{path.name}, exercise {number}: {checked - written} unwritten"
        assert written <= checked, (
            f"{path.name}, exercise {number}: {sorted(written - checked)} never reach check()"
        )


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.stem)
def test_sections_and_exercises_are_numbered_once_and_in_order(path):
    markdown = "\n".join(_source(c) for c in _cells(path) if c["cell_type"] == "markdown")
    sections = [int(n) for n in SECTION.findall(markdown)]
    assert len(sections) == len(set(sections)), f"{path.name}: sections {sections}"
    assert sections == sorted(sections), f"{path.name}: sections {sections}"
    exercises = [number for number, _, _ in _exercises(path)]
    assert exercises == list(range(1, len(exercises) + 1)), f"{path.name}: exercises {exercises}"


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.stem)
def test_every_lab_names_its_solutions_file_and_the_file_exists(path):
    solution = NOTEBOOKS / "solutions" / f"{path.stem}.md"
    assert solution.is_file(), solution
    markdown = "\n".join(_source(c) for c in _cells(path) if c["cell_type"] == "markdown")
    assert f"solutions/{path.stem}.md" in markdown, f"{path.name} does not point at {solution.name}"


# -- the student versions: predictions blank, outputs and worked explanations gone --------------


def _blank(value: object) -> bool:
    """``...``, or a dict whose every value is ``...`` (its keys are the question)."""
    if isinstance(value, dict):
        return bool(value) and all(v is Ellipsis for v in value.values())
    return value is Ellipsis


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.stem)
def test_the_student_version_of_every_lab_has_no_answered_prediction(path):
    notebook = json.loads(path.read_text())
    student = student_version(notebook)
    for before, after in zip(notebook["cells"], student["cells"], strict=True):
        if after["cell_type"] != "code":
            continue
        assert after["outputs"] == [] and after["execution_count"] is None
        lines = [line for line in _source(after).splitlines() if ASSIGNED.match(line)]
        assert len(lines) == len(ASSIGNED.findall(_source(before)))  # each one kept, blank
        for line in lines:
            values: dict = {}
            exec(line, {}, values)  # the line as the student receives it
            assert values and all(map(_blank, values.values())), f"{path.name}: {line}"
            assert "  # " in line, f"{path.name}: {line} does not say what to predict"
    assert "widgets" not in student["metadata"]  # the run's widget state (its accuracies)
    markdown = "\n".join(_source(c) for c in student["cells"] if c["cell_type"] == "markdown")
    assert not re.search(r"\*\*Explain(?:ation)?\.\*\* (?!\*Your explanation\.\*)", markdown)


def test_a_blank_exercise_of_a_student_version_says_not_answered_yet(capsys):
    """Notebook 14's first exercise run from its student version: its code cells up to the first
    check (arithmetic on paper, no cluster: about a second)."""
    path = NOTEBOOKS / "14_planning.ipynb"
    namespace: dict = {}
    for cell in student_version(json.loads(path.read_text()))["cells"]:
        code = re.sub(r"^%.*$", "", _source(cell), flags=re.M)  # IPython's magics
        if cell["cell_type"] == "code":
            exec(compile(code, path.name, "exec"), namespace)
            if CHECKED.search(code):
                break
    out = capsys.readouterr().out
    assert "not answered yet: replace each ... with your prediction" in out
    assert "you predicted" not in out and " measured " not in out  # nothing of the answer


def test_blanking_keeps_a_dicts_keys_a_tuples_names_and_what_to_predict():
    source = (
        "%matplotlib inline\n"
        'prediction_rounds = {"ring (16)": 133, "torus 4×4 (16)": 14}  # ← by topology\n'
        "prediction_grow, prediction_decay = 1610, 4290  # ← updates of each run\n"
        "prediction_ratio = (4 /\n    3)\n"
        "predicted = 5\n"
        "check(prediction_ratio, 4 / 3)\n"
    )
    assert blank_predictions(source) == (
        "%matplotlib inline\n"
        'prediction_rounds = {"ring (16)": ..., "torus 4×4 (16)": ...}  # ← by topology\n'
        "prediction_grow, prediction_decay = ..., ...  # ← updates of each run\n"
        "prediction_ratio = ...  # ← your prediction\n"
        "predicted = 5\n"
        "check(prediction_ratio, 4 / 3)\n"
    )


def test_student_notebooks_writes_each_lab_and_never_replaces_one_silently(tmp_path, capsys):
    from scaledl_lab.cli import main

    labs, out = tmp_path / "labs", tmp_path / "out"
    labs.mkdir()
    shutil.copy(NOTEBOOKS / "14_planning.ipynb", labs)
    command = ["student-notebooks", str(out), "--notebooks", str(labs)]
    assert main(command) == 0
    written = out / "14_planning.ipynb"
    assert [p.name for p in out.iterdir()] == [written.name]
    assert json.loads(written.read_text()) == student_version(
        json.loads((labs / written.name).read_text())
    )
    written.write_text("a student's answers")
    assert main(command) == 1
    assert f"{out} already holds 14_planning.ipynb" in capsys.readouterr().err
    assert written.read_text() == "a student's answers"
    assert main([*command, "--overwrite"]) == 0 and "cells" in json.loads(written.read_text())
    assert main(["student-notebooks", str(out), "--notebooks", str(tmp_path)]) == 1
    assert f"no lab notebooks ([0-9][0-9]_*.ipynb) in {tmp_path}" in capsys.readouterr().err


# -- the syllabus: every lab and assignment in a session, its readings and timings the labs' own --

MEMORY_TABLE = ROOT / "results" / "memory" / "memory.csv"
LAB_NAME = re.compile(r"`(\d\d_\w+\.ipynb)`")
PAPER_2019 = ("03_", "04_", "05_")  # parameter servers and asynchronous SGD, NNT, the reproduction


def _syllabus() -> tuple[str, list[dict[str, str]]]:
    """The Syllabus section of notebooks/README.md, and its table's rows (column → cell)."""
    text = (NOTEBOOKS / "README.md").read_text()
    section = text[text.index("\n## Syllabus\n") :]
    section = section[: section.index("\n## ", 1)]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    head, *body = ([c.strip() for c in line.strip().strip("|").split("|")] for line in lines)
    return section, [dict(zip(head, row, strict=True)) for row in body]


def test_the_syllabus_names_every_lab_and_every_assignment_in_its_sessions():
    section, rows = _syllabus()
    assert [int(row["session"]) for row in rows] == list(range(1, len(rows) + 1))
    assert 12 <= len(rows) <= 14
    labs = [name for row in rows for name in LAB_NAME.findall(row["labs"])]
    assert sorted(labs) == [p.name for p in LABS]  # each lab in one session, none that is not
    for path in sorted((NOTEBOOKS / "assignment").glob("*.ipynb")):
        assert f"`assignment/{path.name}`" in section, f"{path.name} is in no session"
    old = [row["session"] for row in rows if any(n in row["labs"] for n in PAPER_2019)]
    assert len(old) <= 2, f"the 2019 material takes sessions {old}"
    due = [int(row["session"]) for row in rows if " due" in row["graded work"]]
    gaps = [b - a for a, b in zip([0, *due[:-1]], due, strict=True)]
    assert due and max(gaps) <= 3, f"graded work falls due in sessions {due}"


def _references(path: Path) -> list[str]:
    """The entries of a lab's References section."""
    markdown = "\n".join(_source(c) for c in _cells(path) if c["cell_type"] == "markdown")
    section = markdown[re.search(r"^#+\s*References", markdown, re.M).end() :]
    return re.split(r"\n\* ", section)


def test_each_reading_of_the_syllabus_is_among_its_labs_references():
    for row in _syllabus()[1]:
        labs = [NOTEBOOKS / name for name in LAB_NAME.findall(row["labs"])]
        entries = [entry for lab in labs for entry in _references(lab)]
        for reading in row["readings"].split(";"):
            author, year = reading.split()
            assert any(re.search(rf"\b{author}\b", e) and year in e for e in entries), (
                f"session {row['session']}: {reading} is not among {row['labs']}'s references"
            )


def test_the_syllabus_timings_are_the_committed_measurements():
    with MEMORY_TABLE.open(newline="") as fh:
        measured = {(r["target"], r["mode"]): float(r["wall_s"]) for r in csv.DictReader(fh)
                    if r["exit_code"] == "0"}  # fmt: skip

    def minutes(lab: str, mode: str) -> str:
        seconds = measured.get((lab.removesuffix(".ipynb"), mode), math.nan)
        return f"{seconds / 60:.1f}" if math.isfinite(seconds) else "—"

    for row in _syllabus()[1]:
        labs = LAB_NAME.findall(row["labs"])
        for mode in ("quick", "full"):
            expected = " + ".join(minutes(lab, mode) for lab in labs)
            assert row[f"{mode} min"] == expected, (row["session"], mode)


def _printed(path: Path) -> str:
    """What the notebook printed (streams, text and markdown outputs)."""
    parts = []
    for cell in _cells(path):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append("".join(out["text"]))
            for kind in ("text/plain", "text/markdown"):
                if kind in out.get("data", {}):
                    parts.append("".join(out["data"][kind]))
    return "\n".join(parts)


def _committed(path: Path) -> list[float]:
    """The numbers of the committed results folders the notebook reads (their summaries and
    small tables)."""
    text = "\n".join(_source(c) for c in _cells(path))
    folders = [d for d in (ROOT / "results").iterdir() if d.is_dir() and f'"{d.name}"' in text]
    files = [p for d in folders for p in d.rglob("*") if p.suffix in {".md", ".csv", ".json"}]
    found = "\n".join(p.read_text(errors="ignore") for p in files if p.stat().st_size < 200_000)
    return [float(x) for x in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", found)]


def _known(value: str, candidates: list[float]) -> bool:
    """``value`` (as a solution writes it) is one of ``candidates`` at the solution's precision,
    as a number or as a percentage of a fraction."""
    places = len(value.split(".")[1])
    target = float(value)
    tol = 0.5 * 10**-places + 1e-9
    return any(abs(x - target) <= tol or abs(100 * x - target) <= tol for x in candidates)


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.stem)
def test_the_numbers_a_solution_quotes_are_the_notebooks_outputs(path):
    """A number with a decimal point in the solution file appears in what the notebook printed,
    in the committed results, or in the notebook's code (a parameter it sets): never typed by
    hand beside them."""
    solution = (NOTEBOOKS / "solutions" / f"{path.stem}.md").read_text()
    cells = _cells(path)
    code = "\n".join(_source(c) for c in cells if c["cell_type"] == "code")
    local = [float(x) for x in NUMBER.findall(_printed(path) + "\n" + code)]
    candidates = local + _committed(path)
    unknown = [v for v in NUMBER.findall(solution) if not _known(v, candidates)]
    assert not unknown, f"{path.name}'s solution quotes numbers no output shows: {unknown}"


def test_the_number_matcher_reads_precision_and_percentages():
    assert _known("7.5", [7.4712]) and _known("86.53", [0.8653]) and _known("0.158", [0.1577])
    assert not _known("11.4", [7.47, 0.114 + 0.01]) and not math.isnan(float("7.5"))


# -- the library's figures: every legend inside its figure, none on an axes' title -------------


def _legends_inside(fig) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    assert legends, "no legend drawn"
    box = fig.bbox
    for legend in legends:
        extent = legend.get_window_extent(renderer)
        assert box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1, (extent, box)
        assert box.y0 - 1 <= extent.y0 and extent.y1 <= box.y1 + 1, (extent, box)
        for ax in fig.axes:
            if ax.get_title():
                assert not extent.overlaps(ax.title.get_window_extent(renderer)), ax.get_title()


def _drawn_points(ax):
    """Every point the axes draw, in display coordinates: the vertices of its lines and 20
    points on each of their segments, and the markers of its scatter plots, within its box."""
    import numpy as np

    points = []
    for line in ax.get_lines():
        xy = ax.transData.transform(np.asarray(line.get_xydata(), dtype=float))
        xy = xy[np.isfinite(xy).all(axis=1)]
        for a, b in zip(xy[:-1], xy[1:], strict=True):
            points.append(a + np.linspace(0, 1, 20)[:, None] * (b - a))
        points.append(xy)
    for collection in ax.collections:
        offsets = np.asarray(collection.get_offsets(), dtype=float)
        if len(offsets):
            points.append(collection.get_offset_transform().transform(offsets))
    if not points:
        return np.empty((0, 2))
    points = np.concatenate(points)
    box = ax.bbox  # what falls outside the axes is clipped: not drawn
    inside = (points[:, 0] >= box.x0) & (points[:, 0] <= box.x1)
    return points[inside & (points[:, 1] >= box.y0) & (points[:, 1] <= box.y1)]


def _legends_clear_of_data(fig) -> None:
    """No legend lies over anything the figure plots (``_legends_inside`` has drawn it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            points = _drawn_points(ax)
            inside = [p for p in points if box.contains(*p)]
            where = ax.get_title()
            assert not inside, f"the legend covers {len(inside)} plotted points of {where!r}"


def test_the_legend_check_finds_a_legend_over_data():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], label="a line through the middle")
    ax.legend(loc="center")
    with pytest.raises(AssertionError, match="covers"):
        _legends_clear_of_data(fig)


def test_the_large_batch_schedules_keep_their_legend_off_the_curves():
    from scaledl_lab.studies.large_batch.report import figure_schedules, schedule_frame
    from scaledl_lab.studies.large_batch.study import load_study

    study = load_study(ROOT / "results" / "large-batch")  # notebook 07's figure
    # Fashion-MNIST's 60,000 training images less the validation split, as the study trains.
    shard = {r: (60_000 - c.val_size) // c.replicas for r, c in study.configs.items()}
    fig = figure_schedules({study.roles[r]: schedule_frame(study.configs[r], shard[r])
                            for r in ("warmup", "lars", "decay", "grow")})  # fmt: skip
    _legends_inside(fig)
    _legends_clear_of_data(fig)


def test_the_drift_cloud_keeps_its_legend_off_the_dots():
    import pandas as pd

    from scaledl_lab.viz.drift import drift_cloud

    runs = pd.read_csv(ROOT / "results" / "kernel-drift" / "runs.csv")
    runs = runs[runs.case == "03 §3"]  # notebook 03's appendix
    order = sorted(runs.run.unique())
    fig = drift_cloud(runs, runs.groupby("run").test_acc.first(), order)
    _legends_inside(fig)
    _legends_clear_of_data(fig)


@pytest.mark.parametrize("name", ["gap", "warmup", "smith", "sharpness"])
def test_the_large_batch_figures_keep_their_legends_inside(name):
    from scaledl_lab.studies.large_batch.study import load_study

    _legends_inside(load_study(ROOT / "results" / "large-batch").figure(name))


@pytest.mark.parametrize("x", ["epoch", "time"])
def test_the_long_comparisons_seed_bands_keep_their_legend_inside(x):
    import pandas as pd

    from scaledl_lab.studies.long_run import seed_bands

    frame = pd.read_csv(ROOT / "results" / "reproduce-long" / "curves.csv")
    _legends_inside(seed_bands(frame, x=x))


def test_the_committed_comparisons_standard_figures_keep_their_legends_inside():
    import pandas as pd

    from scaledl_lab.viz.plots import standard_figures

    frame = pd.read_parquet(ROOT / "results" / "reproduce-quick" / "metrics.parquet")
    for name, fig in standard_figures(frame):
        if name != "throughput.png":  # a bar chart: no legend
            _legends_inside(fig)


# -- the committed notebooks' images: widgets show a result, figures a projectable resolution ----

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
CONTROLS_ONLY_PX = 120  # a static strip of widget controls is about 60 px high


def _pngs(cell: dict) -> list[tuple[bool, object]]:
    """(whether it is a widget's static figure, the image) of each PNG a cell's outputs hold."""
    import base64
    import io

    from PIL import Image

    found = []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if "image/png" in data:
            image = Image.open(io.BytesIO(base64.b64decode(data["image/png"])))
            found.append((WIDGET_VIEW in data, image))
    return found


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.stem)
def test_every_widget_leaves_a_result_a_static_viewer_can_see(path):
    """A cell that shows a widget also shows what it computed (a figure, in the widget's own
    static PNG or beside it), not only its controls, which a viewer without a kernel cannot
    use."""
    for i, cell in enumerate(_cells(path)):
        images = _pngs(cell)
        if any(is_widget for is_widget, _ in images):
            tallest = max(image.size[1] for _, image in images)
            assert tallest > CONTROLS_ONLY_PX, f"{path.name} cell {i}: only the widget's controls"


ASSIGNMENTS = sorted((NOTEBOOKS / "assignment").glob("*.ipynb"))


@pytest.mark.parametrize("path", LABS + ASSIGNMENTS, ids=lambda p: p.stem)
def test_every_committed_figure_was_drawn_at_the_labs_resolution(path):
    """Every figure a committed notebook shows was rendered at ``viz.style.FIGURE_DPI`` or more,
    read from its PNG's pHYs chunk: matplotlib writes there the dpi it rendered at, whatever
    the figure's size, ``bbox_inches="tight"`` cropping or the code that made it, where the
    pixel width alone cannot tell a small figure at 150 dpi from a large one at 100. A widget's
    static PNG is exempt: ``viz.static`` lays its controls out at its own ``DPI`` and pastes
    the widget's figures in at their own pixels."""
    from scaledl_lab.viz import static
    from scaledl_lab.viz.style import FIGURE_DPI

    low = []
    for i, cell in enumerate(_cells(path)):
        for is_widget, image in _pngs(cell):
            dpi = image.info.get("dpi", (None,))[0]  # PIL reads pHYs as pixels per inch
            if dpi is None:
                low.append(f"cell {i}: a PNG without a pHYs chunk (resolution unknown)")
            elif is_widget:
                assert round(dpi) == static.DPI, f"{path.name} cell {i}: not viz.static's PNG"
            elif round(dpi) < FIGURE_DPI:
                low.append(f"cell {i}: {image.size[0]} px wide at {dpi:.0f} dpi")
    assert not low, f"{path.name}: figures below {FIGURE_DPI} dpi (re-execute it): {low}"


def test_the_paper_comparisons_panels_hold_a_few_runs_each_with_legends_off_the_curves():
    import pandas as pd

    from scaledl_lab.viz.small_multiples import small_multiples

    frame = pd.read_parquet(ROOT / "results" / "reproduce-quick" / "metrics.parquet")
    runs = list(dict.fromkeys(frame["run"]))
    real = [r for r in runs if " · dask · " in r]  # notebook 05's first panel, of three
    fig = small_multiples(frame, {"real": real, "simulated": [r for r in runs if r not in real]})
    _legends_inside(fig)
    _legends_clear_of_data(fig)
    tests = frame[frame["kind"] == "test"]
    start = tests.loc[tests["epoch"] == 0, "accuracy"].max()  # every run's untrained score
    for ax in fig.axes:
        assert ax.get_ylim()[0] > start, ax.get_title()  # zoomed to where the curves part
