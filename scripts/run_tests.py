"""Run the test suite (and, with --docs, build the documentation), then print one summary line.

    python scripts/run_tests.py [--docs=SPHINX_BUILD] [PYTEST_ARGS...]

pytest runs with this interpreter and writes a JUnit XML report to a temporary directory; the
summary counts its test cases. With ``--docs``, ``SPHINX_BUILD -n -W --keep-going`` then builds
docs/ into docs/_build/html (nitpicky: a cross-reference to nothing is an error), whatever the
tests gave. The last line printed is, for instance::

    kvlog test summary: 1978 passed, 0 failed, 0 skipped, 3 xfailed; docs built (sphinx -n -W)

The exit status is 0 only when pytest and the docs build both succeed; pytest collecting no
test (its exit status 5) is a failure.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPHINX_OPTIONS = ["-n", "-W", "--keep-going", "-q", "-b", "html", "docs", "docs/_build/html"]

#: What pytest's exit statuses other than 0 (all passed) and 1 (some failed) mean.
PYTEST_STATUS = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "collected no tests"}


def count_outcomes(report: Path) -> Counter[str]:
    """Test cases of a JUnit XML report by outcome: passed, failed, errors, skipped, xfailed."""
    outcomes: Counter[str] = Counter()
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        tags = {child.tag: child for child in case}
        if "error" in tags:
            outcomes["errors"] += 1
        elif "failure" in tags:
            outcomes["failed"] += 1
        elif "skipped" in tags:
            xfail = tags["skipped"].get("type") == "pytest.xfail"
            outcomes["xfailed" if xfail else "skipped"] += 1
        else:
            outcomes["passed"] += 1
    return outcomes


def tests_part(status: int, report: Path) -> str:
    """The summary's account of the pytest run."""
    if not report.exists():
        return f"pytest exited with status {status} ({PYTEST_STATUS.get(status, 'no report written')})"
    n = count_outcomes(report)
    parts = [f"{n['passed']} passed", f"{n['failed']} failed"]
    if n["errors"]:
        parts.append(f"{n['errors']} error{'' if n['errors'] == 1 else 's'}")
    parts.append(f"{n['skipped']} skipped")
    if n["xfailed"]:
        parts.append(f"{n['xfailed']} xfailed")
    if status not in (0, 1):
        parts.append(f"pytest {PYTEST_STATUS.get(status, f'exited with status {status}')}")
    return ", ".join(parts)


def main(argv: list[str]) -> int:
    docs = [a for a in argv if a.startswith("--docs=")]
    argv = [a for a in argv if not a.startswith("--docs=")]
    sphinx = docs[-1].removeprefix("--docs=") if docs else None
    if sphinx == "":
        print("usage: run_tests.py [--docs=SPHINX_BUILD] [PYTEST_ARGS...]", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kvlog-tests-") as tmp:
        report = Path(tmp) / "junit.xml"
        status = subprocess.call([sys.executable, "-m", "pytest", f"--junitxml={report}", *argv],
                                 cwd=ROOT)
        line = f"kvlog test summary: {tests_part(status, report)}"
    failed = status != 0
    if status == 2 and sphinx is not None:
        sphinx = None  # interrupted: the docs build is not started either
        line += "; docs not built"
    if sphinx is not None:
        built = subprocess.call([sphinx, *SPHINX_OPTIONS], cwd=ROOT)
        failed = failed or built != 0
        line += ("; docs built (sphinx -n -W)" if built == 0
                 else f"; docs failed (sphinx -n -W exited with status {built})")
    print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # pytest or sphinx got the same interrupt and said so
        sys.exit(130)
