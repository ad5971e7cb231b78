"""Every code block of docs/*.rst is executed by a test or marked as output.

The convention, for every page (benchmarks.rst and the README's pages included):

``>>>`` examples
    A paragraph of ``>>>`` lines, or any block whose first line starts with
    ``>>>``. Run by :func:`doctest.testfile`, one page at a time, in
    tests/test_docs.py (tests/spark/test_docs_spark.py for ``spark*.rst``).
``.. code-block:: python``
    Run here as the script ``snippet.py`` in a new empty directory (the current
    directory): it must exit 0. A ``:class: output`` block right after it (only
    blank lines between) is what it must print, stdout and stderr together
    (``...`` matches anything).
    Not allowed on ``spark*.rst``: write ``>>>`` examples there, which run with
    the Spark tests' session.
``.. code-block:: console``
    Each ``$ `` line is a command (a final ``\\`` continues it on the next line),
    run by bash in a new empty directory per block, with this interpreter's
    ``python`` and ``kvlog`` first on ``PATH``; the lines up to the next command
    are its expected output, stdout and stderr together (``...`` matches
    anything, ``<BLANKLINE>`` is an empty line). Here for the pages, in
    tests/spark/test_docs_spark.py for ``spark*.rst``.
``:class: output`` (on any ``code-block``)
    Shown, not run: a program's output, a file layout, a diagram, a synopsis.
    Use ``.. code-block:: text`` with ``:class: output``. Tables and figures
    (``list-table``, ``image``) are not code blocks and need nothing.
``.. run-by: tests/FILE.py::NAME`` (a comment right before a console block)
    A command too slow to run here (it starts a JVM or a cluster) that the test
    or test helper ``NAME`` in ``FILE`` runs. Checked: ``NAME`` is defined in
    ``FILE``, and every subcommand and option name of the block's commands is a
    string in ``FILE``.

Anything else (a ``::`` literal block, a ``text`` block without
``:class: output``, a ``bash`` block) fails :func:`test_every_block_is_executed_or_output`
with the page and line. tests/test_cli.py also runs the console blocks of
docs/cli.rst against its own checks.
"""

from __future__ import annotations

import configparser
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_blocks import (
    Block,
    blocks,
    classify,
    commands,
    output_after,
    run_console,
    run_python,
)

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.rst"))


def _all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def _executed_here(kind: str) -> list[tuple[Block, Block | None]]:
    found: list[tuple[Block, Block | None]] = []
    for page in PAGES:
        if page.name.startswith("spark"):
            continue
        page_blocks = blocks(page)
        for n, block in enumerate(page_blocks):
            try:
                executed = classify(block, ROOT)
            except AssertionError:  # reported by test_every_block_is_executed_or_output
                continue
            if executed == kind:
                following = page_blocks[n + 1] if n + 1 < len(page_blocks) else None
                found.append((block, output_after(block, following)))
    return found


def test_every_block_is_executed_or_output() -> None:
    found = _all_blocks()
    assert len(found) > 100, "the pages' blocks were not found"
    problems: list[str] = []
    for block in found:
        try:
            kind = classify(block, ROOT)
        except AssertionError as error:
            problems.append(str(error))
            continue
        if block.page.name.startswith("spark") and kind == "python":
            problems.append(f"{block.where}: a python block on a Spark page: write it as >>> examples")
    assert problems == [], "\n".join(problems)


def test_the_checker_finds_every_kind_of_block(tmp_path: Path) -> None:
    page = tmp_path / "page.rst"
    page.write_text(
        "Title\n=====\n\nA literal block::\n\n   kvlog get s k\n\n"
        ">>> 1 + 1\n2\n\n"
        ".. code-block:: text\n   :class: output\n\n   shown\n\n"
        ".. code-block:: bash\n\n   ls\n\n"
        ".. code-block:: console\n\n   $ echo a \\\n       b\n   a b\n\n"
        ".. run-by: tests/test_docs.py::test_pages_found\n\n"
        ".. code-block:: console\n\n   $ kvlog spark --nowhere\n", encoding="utf-8")
    found = blocks(page)
    assert [(block.line, block.kind) for block in found] == [
        (4, "literal"), (8, "doctest"), (11, "code-block"), (16, "code-block"), (20, "code-block"),
        (28, "code-block")]
    assert classify(found[1], ROOT) == "doctest" and classify(found[2], ROOT) == "output"
    assert classify(found[4], ROOT) == "console"
    for unrun in (found[0], found[3]):
        with pytest.raises(AssertionError, match=r"page\.rst:(4|16): a "):
            classify(unrun, ROOT)
    with pytest.raises(AssertionError, match=r"never uses \[.*'--nowhere'\]"):
        classify(found[5], ROOT)
    run_console(found[4], tmp_path)


@pytest.mark.parametrize(("block", "output"), _executed_here("python"),
                         ids=lambda item: item.where if isinstance(item, Block) else "")
def test_python_block_runs(block: Block, output: Block | None, tmp_path: Path) -> None:
    run_python(block, output, tmp_path)


@pytest.mark.parametrize(("block", "output"), _executed_here("console"),
                         ids=lambda item: item.where if isinstance(item, Block) else "")
def test_console_block_runs(block: Block, output: Block | None, tmp_path: Path) -> None:
    run_console(block, tmp_path)


def _check_pip_install(tokens: list[str], extras: set[str], where: str) -> None:
    """``tokens`` are a ``pip install`` of the package ``kvlog`` (or the checkout ``.``, with
    ``-e``) and of extras in ``extras``."""
    assert tokens[:2] == ["pip", "install"], where
    for spec in tokens[2:]:
        if spec == "-e":
            continue
        name, _, rest = spec.partition("[")
        assert name in ("kvlog", "."), where
        assert set(filter(None, rest.rstrip("]").split(","))) <= extras, where


def test_install_commands_name_real_targets_and_extras() -> None:
    """The install page's ``make`` and ``pip install`` commands name what the checkout has.

    Installing is too slow and needs the network, so this runs ``make -n`` (the recipes,
    printed, not run) for each target the page names, and checks that every
    ``pip install`` names the package ``kvlog`` (or the checkout ``.``, with ``-e``) and
    extras that setup.cfg declares.
    """
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg", encoding="utf-8")
    assert parser.get("metadata", "name") == "kvlog"
    extras = set(parser["options.extras_require"])
    linked = [block for block in blocks(ROOT / "docs" / "install.rst")
              if block.run_by.endswith("::test_install_commands_name_real_targets_and_extras")]
    assert len(linked) == 2
    targets: list[str] = []
    for block in linked:
        for command, _output in commands(block):
            tokens = shlex.split(command, comments=True)
            if tokens[0] == "make":
                targets += tokens[1:]
                continue
            _check_pip_install(tokens, extras, f"{block.where}: $ {command}")
    assert targets
    done = subprocess.run(["make", "-n", *targets], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def _readme_blocks() -> list[tuple[str, str]]:
    """``(language, text)`` of every fenced block of README.md."""
    found: list[tuple[str, str]] = []
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            language, body = lines[i][3:].strip(), []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            found.append((language, "\n".join(body) + "\n"))
        i += 1
    return found


def test_the_readme_runs_as_shown(tmp_path: Path) -> None:
    """README.md's python blocks run as they are, each in an empty directory; its shell blocks
    are the quick start's two make targets (``make -n``: they exist) and pip installs of kvlog
    with extras that setup.cfg declares."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg", encoding="utf-8")
    extras = set(parser["options.extras_require"])
    found = _readme_blocks()
    assert {language for language, _text in found} <= {"python", "console", "text"}, found
    python = [text for language, text in found if language == "python"]
    assert python, "the README has no usage example left"
    for n, text in enumerate(python):
        where = tmp_path / f"block-{n}"
        where.mkdir()
        done = subprocess.run([sys.executable, "-c", text], cwd=where, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300, check=False)
        assert done.returncode == 0, f"README python block {n}:\n{done.stderr}"
    targets: list[str] = []
    for language, text in found:
        if language != "console":
            continue
        for line in text.splitlines():
            tokens = shlex.split(line.removeprefix("$ "), comments=True)
            if tokens[0] == "make":
                targets += tokens[1:]
            else:
                _check_pip_install(tokens, extras, f"README.md: {line}")
    assert targets == ["demo", "test"]
    done = subprocess.run(["make", "-n", *targets], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
