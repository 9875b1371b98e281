"""The code blocks of ``README.md`` and ``docs/*.md`` run as written; their links resolve.

* A ``python`` block runs in-process; the Python blocks of one page run in order in one
  namespace, so a later block may use an earlier one's names.
* In a ``sh`` (or ``bash``) block, a line starting with ``specsample `` or ``python `` runs in
  a subprocess with this environment's binaries first on ``PATH``, from a scratch directory
  that links the repository's top-level entries (relative paths work, written files stay out
  of the checkout); ``make X`` is checked with ``make -n X`` in the repository;
  ``source .venv/bin/activate`` stands for this environment, whose binaries are already
  first on ``PATH``. Comment lines are skipped.
* Any other block, or a shell block with any other line, must follow a marker line
  ``<!-- not run: REASON -->``, which this test honours; an unmarked block it cannot run
  fails :func:`test_every_block_runs_or_is_marked`.

Every command runs with ``HF_HUB_OFFLINE=1``: nothing is downloaded.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 200
PYTHON = ("python", "py")
SHELL = ("sh", "bash")
MARKER = re.compile(r"^<!-- not run: (?P<reason>\S.*?) -->$")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
RUN_PREFIXES = ("specsample ", "python ")
ACTIVATE = "source .venv/bin/activate"
COMMAND_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    lang: str
    code: str
    not_run: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page``, with the reason of a preceding not-run marker."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, start = len(opening["indent"]), index
        index += 1
        body = []
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index][indent:])
            index += 1
        previous = next((ln.strip() for ln in reversed(lines[:start]) if ln.strip()), "")
        marker = MARKER.match(previous)
        code = "\n".join(body) + "\n"
        reason = marker["reason"] if marker else None
        blocks.append(Block(page, start + 1, opening["lang"], code, reason))
        index += 1
    return blocks


def _commands(code: str) -> list[str]:
    """The shell lines of ``code``: continuations joined, blank and comment lines left out."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = (line.strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _runnable(command: str) -> bool:
    return command.startswith(RUN_PREFIXES) or command.startswith("make ") or command == ACTIVATE


BLOCKS = [block for page in PAGES for block in _blocks(page)]
RUN_PAGES = [p for p in PAGES if any(b.lang in PYTHON and not b.not_run for b in _blocks(p))]
SHELL_BLOCKS = [b for b in BLOCKS if b.lang in SHELL and not b.not_run]


def _environment() -> dict[str, str]:
    """This environment's binaries first on PATH, offline, no display for plots."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", MPLBACKEND="Agg")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A directory linking the repository's top-level entries (the checkout stays clean)."""
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def test_every_block_runs_or_is_marked() -> None:
    unrunnable = []
    for block in BLOCKS:
        if block.not_run or block.lang in PYTHON:
            continue
        if block.lang not in SHELL:
            unrunnable.append(f"{block.name}: a {block.lang or 'plain'} block")
            continue
        bad = [c for c in _commands(block.code) if not _runnable(c)]
        if bad:
            unrunnable.append(f"{block.name}: {bad[0]!r}")
    assert not unrunnable, "unmarked blocks this test cannot run:\n" + "\n".join(unrunnable)


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_blocks(page: Path, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(scratch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in _blocks(page):
        if block.lang in PYTHON and not block.not_run:
            exec(compile(block.code, block.name, "exec"), namespace)


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.name)
def test_shell_block(block: Block, scratch: Path) -> None:
    env = _environment()
    for command in _commands(block.code):
        if command == ACTIVATE:
            continue
        if command.startswith("make "):
            command, cwd = "make -n " + command.removeprefix("make "), ROOT
        else:
            cwd = scratch
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        assert result.returncode == 0, f"{block.name}: {command}\n{result.stderr[-3000:]}"


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of the headings of ``page``."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    headings = re.findall(r"^#+ +(.+?) *$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    dead = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and anchor not in _anchors(linked)):
            dead.append(target)
    assert not dead, f"dead links in {page.name}: {dead}"


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES
