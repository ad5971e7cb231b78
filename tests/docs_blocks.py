"""The code blocks of an reStructuredText page, found by a line parser (helper of tests/test_docs_blocks.py).

A block is one of

* a doctest paragraph: lines starting with ``>>>`` at the paragraph's indent;
* a literal block: the indented text after a paragraph ending in ``::``;
* a directive that shows code: ``code-block``, ``code``, ``sourcecode``,
  ``literalinclude``, ``parsed-literal``, ``highlight``-free; its options
  (``:class: output``) and the comment right before it (``.. run-by: ...``)
  are kept.

Only the page's own text is read: nothing is imported and no role or directive
needs to be known, so a page that Sphinx cannot build yet is still checked.
"""

from __future__ import annotations

import ast
import doctest
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

CODE_DIRECTIVES = ("code-block", "code", "sourcecode", "literalinclude", "parsed-literal")
_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:-]+)::\s*(.*)$")
_OPTION = re.compile(r"^:([\w-]+):\s*(.*)$")
_RUN_BY = re.compile(r"^\s*\.\.\s+run-by:\s*(\S+)\s*$")


@dataclass
class Block:
    """One code block of a page: where it starts, what it is and what it holds."""

    page: Path
    line: int  # 1-based line of the directive, the ``::`` paragraph's last line, or the first ``>>>``
    kind: str  # "doctest", "literal" or the directive's name
    language: str = ""
    options: dict[str, str] = field(default_factory=dict)
    run_by: str = ""  # "tests/file.py::test_name" of a ``.. run-by:`` comment right before the block
    lines: list[str] = field(default_factory=list)  # the content, dedented
    end: int = 0  # 0-based index of the page's first line after the block

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"

    @property
    def is_doctest(self) -> bool:
        first = next((line for line in self.lines if line.strip()), "")
        return first.startswith(">>>")

    @property
    def is_output(self) -> bool:
        return "output" in self.options.get("class", "").split()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _content(lines: list[str], start: int, parent_indent: int) -> tuple[list[str], int]:
    """The lines indented deeper than ``parent_indent`` from ``start`` on, dedented; and the next index."""
    end = start
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > parent_indent):
        end += 1
    body = lines[start:end]
    while body and not body[-1].strip():  # trailing blank lines belong to no block
        body.pop()
    while body and not body[0].strip():
        body.pop(0)
    depth = min((_indent(line) for line in body if line.strip()), default=0)
    return [line[depth:] for line in body], end


def blocks(page: Path) -> list[Block]:
    """Every code block of ``page``, in page order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    run_by = ""
    previous_blank = True
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        directive = _DIRECTIVE.match(line)
        if directive and directive.group(2) in CODE_DIRECTIVES:
            indent = len(directive.group(1))
            block = Block(page, i + 1, directive.group(2), language=directive.group(3).strip(), run_by=run_by)
            i += 1
            while i < len(lines) and (option := _OPTION.match(lines[i].strip())) and _indent(lines[i]) > indent:
                block.options[option.group(1)] = option.group(2).strip()
                i += 1
            if block.kind == "literalinclude":
                block.lines = (page.parent / block.language).read_text(encoding="utf-8").splitlines()
                block.language = block.options.get("language", "")
                _, i = _content(lines, i, indent)
            else:
                block.lines, i = _content(lines, i, indent)
            block.end = i
            found.append(block)
            run_by, previous_blank = "", True
            continue
        if (match := _RUN_BY.match(line)) is not None:
            run_by = match.group(1)
            i += 1
            continue
        if stripped.startswith(">>>") and previous_blank:
            block = Block(page, i + 1, "doctest")
            start = i
            while i < len(lines) and lines[i].strip():
                i += 1
            depth = _indent(lines[start])
            block.lines = [text[depth:] for text in lines[start:i]]
            block.end = i
            found.append(block)
            run_by, previous_blank = "", False
            continue
        if stripped.endswith("::") and not directive and not stripped.startswith(".."):
            # A paragraph ending in "::": the indented text after the blank line is a literal block.
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            paragraph_indent = _indent(line)
            if j < len(lines) and _indent(lines[j]) > paragraph_indent and j > i + 1:
                block = Block(page, i + 1, "literal", run_by=run_by)
                block.lines, i = _content(lines, j, paragraph_indent)
                block.end = i
                found.append(block)
                run_by, previous_blank = "", True
                continue
        previous_blank = not stripped
        if stripped and not stripped.startswith(".."):
            run_by = ""
        i += 1
    return found


def classify(block: Block, root: Path) -> str:
    """How ``block`` is executed: "doctest", "python", "console", "output" or "run-by"; else an error.

    Raises ``AssertionError`` naming the page and line of a block that is neither executed
    nor marked as output (the convention is in tests/test_docs_blocks.py).
    """
    if block.is_output:
        return "output"
    if block.is_doctest:
        return "doctest"
    if block.run_by:
        check_run_by(block, root)
        return "run-by"
    if block.kind in ("code-block", "code", "sourcecode", "literalinclude"):
        if block.language == "python":
            return "python"
        if block.language == "console":
            return "console"
    raise AssertionError(
        f"{block.where}: a {block.kind} block {block.language!r} that no test runs: make it a >>> example, "
        "a 'code-block:: python' or 'code-block:: console' block, give it ':class: output', or name the "
        "test that runs its commands with a '.. run-by: tests/FILE.py::NAME' comment right before it")


def commands(block: Block) -> list[tuple[str, str]]:
    """The ``$ `` commands of a console block with the output each expects.

    A command line ending in a backslash continues on the next line; the lines up to the
    next command are the expected output (``<BLANKLINE>`` is an empty line).
    """
    found: list[tuple[str, list[str]]] = []
    continued = False
    for line in block.lines:
        if continued:
            command, output = found[-1]
            found[-1] = (command + "\n" + line, output)
        elif line.startswith("$ "):
            found.append((line[2:], []))
        elif line.strip():
            assert found, f"{block.where}: a console block starts with output, not a '$ ' command"
            found[-1][1].append("" if line == "<BLANKLINE>" else line)
        continued = bool(found) and not found[-1][1] and line.endswith("\\")
    return [(command, "".join(f"{out}\n" for out in output)) for command, output in found]


def _words(command: str) -> list[str]:
    """The words of a command another test must run: its subcommands and option names."""
    words: list[str] = []
    tokens = shlex.split(command.replace("\\\n", " "), comments=True)
    if tokens[:1] == ["export"]:
        return words  # settings for the commands after it, not a command
    for token in tokens[1:]:
        if token.startswith("-"):
            words.append(token.split("=", 1)[0])
        elif re.fullmatch(r"[a-z][a-z-]*", token):
            words.append(token)
    return words


def check_run_by(block: Block, root: Path) -> None:
    """A ``.. run-by: FILE::NAME`` block: NAME is defined in FILE, and FILE's strings hold every
    subcommand and option name of the block's commands, so the test runs the command shown
    (or NAME reads this page's blocks and takes their ``commands(block)`` itself)."""
    file, _, name = block.run_by.partition("::")
    path = root / file
    assert path.is_file() and name, f"{block.where}: run-by {block.run_by!r}: no such file or no ::NAME"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {node.name for node in ast.walk(tree)
             if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    assert name in names, f"{block.where}: run-by {block.run_by!r}: {file} defines no {name}"
    source = next(ast.get_source_segment(path.read_text(encoding="utf-8"), node) or "" for node in ast.walk(tree)
                  if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name)
    if f'"{block.page.name}"' in source and "commands(block)" in source:
        return  # the test takes the commands from this very block
    strings: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
            strings.update(word.split("=", 1)[0] for word in node.value.split())
    for command, _output in commands(block):
        missing = [word for word in _words(command) if word not in strings]
        assert not missing, f"{block.where}: run-by {file} never uses {missing} of: $ {command}"


def run_console(block: Block, cwd: Path, timeout_s: float = 120.0) -> None:
    """Run each ``$ `` command of ``block`` with bash in ``cwd``; its output must match (``...`` = anything).

    ``python`` and ``kvlog`` are this interpreter's and its ``kvlog`` command.
    """
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    checker = doctest.OutputChecker()
    for command, expected in commands(block):
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout_s, check=False)
        shown = done.stdout if done.stdout.endswith("\n") or not done.stdout else done.stdout + "\n"
        assert checker.check_output(expected, shown, doctest.ELLIPSIS), (
            f"{block.where}: $ {command}\nexpected:\n{expected}got:\n{shown}")


def run_python(block: Block, output: Block | None, cwd: Path, timeout_s: float = 120.0) -> None:
    """Run a python block as the script ``snippet.py`` in ``cwd``: it must exit 0, and print
    (stdout and stderr together) what the ``:class: output`` block right after it shows, if any."""
    script = cwd / "snippet.py"
    script.write_text("\n".join(block.lines) + "\n", encoding="utf-8")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # stdout and stderr interleaved as they are written
    done = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, f"{block.where}: exit code {done.returncode}\n{done.stdout[-3000:]}"
    if output is not None:
        expected = "".join(f"{line}\n" for line in output.lines)
        assert doctest.OutputChecker().check_output(expected, done.stdout, doctest.ELLIPSIS), (
            f"{block.where}: expected (as {output.where} shows):\n{expected}got:\n{done.stdout}")


def output_after(block: Block, following: Block | None) -> Block | None:
    """The ``:class: output`` block right after ``block`` (only blank lines between), if any."""
    if following is None or not following.is_output:
        return None
    between = block.page.read_text(encoding="utf-8").splitlines()[block.end:following.line - 1]
    return following if not any(line.strip() for line in between) else None
