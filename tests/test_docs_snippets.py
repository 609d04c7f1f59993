"""The Python examples of README.md and docs/*.md against the code they show.

Every example is read (not run) for how it calls the library: each name it imports from hydra_ensembles must exist,
and each call of a library function or class it names must fit that callable's signature (its keywords, its number
of positional arguments). Examples that need nothing from outside themselves (no user model or loader) are also
run, and what they print must be what the docs show: the numbers of a comment that starts with a number, on the
print's line or the line after it, or of the output block the docs give after the example ("prints ...").
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```(?:\n+(prints[^\n]*(?:\n[^\n`]+)*)\n+```\n(.*?)```)?", re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening ```python
    code: str
    output: str | None  # the block the docs show after it, where they say what it prints

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def snippets() -> list[Snippet]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append(Snippet(path, line, match.group(1), match.group(3)))
    return found


SNIPPETS = snippets()


def imported_names(tree: ast.Module) -> dict[str, str]:
    """{local name: dotted path} of what the example imports from hydra_ensembles."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hydra_ensembles":
                    names[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hydra_ensembles":
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def resolve(dotted: str):
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            target = getattr(target, part)  # AttributeError: the example names what does not exist
        return target
    raise ImportError(dotted)


def call_path(func: ast.expr, names: dict[str, str]) -> str | None:
    """The dotted path of a called `name` or `name.attr...` rooted in a library import; None for anything else
    (a method of a value the example made)."""
    attrs = []
    while isinstance(func, ast.Attribute):
        attrs.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name) or func.id not in names:
        return None
    return ".".join([names[func.id], *reversed(attrs)])


def library_calls(tree: ast.Module, names: dict[str, str]) -> list[tuple[ast.Call, str]]:
    """Each call in the example of something it imported from the library, with that callable's dotted path."""
    calls = (node for node in ast.walk(tree) if isinstance(node, ast.Call))
    return [(node, dotted) for node in calls if (dotted := call_path(node.func, names)) is not None]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=str)
def test_every_example_calls_the_library_as_it_is(snippet):
    tree = ast.parse(snippet.code)
    names = imported_names(tree)
    for dotted in names.values():
        resolve(dotted)  # an import the library no longer has fails here, by name
    for node, dotted in library_calls(tree, names):
        target = resolve(dotted)
        if not callable(target) or any(isinstance(arg, ast.Starred) for arg in node.args):
            continue
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):  # a builtin without one
            continue
        keywords = {k.arg: None for k in node.keywords if k.arg is not None}
        try:
            signature.bind_partial(*[None] * len(node.args), **keywords)
        except TypeError as error:
            pytest.fail(f"{snippet}, line {node.lineno}: {dotted}(...) does not fit {signature}: {error}")
    assert names, f"{snippet} imports nothing from hydra_ensembles: is it an example of this library?"


def free_names(tree: ast.Module) -> set[str]:
    """Names the example reads but neither defines nor imports (nor are builtins): what it needs from outside."""
    bound, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return loaded - bound - set(dir(builtins))


def prints(tree: ast.Module) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print" for n in ast.walk(tree)
    )


# What marks an example that defines everything it uses yet reads what only a user has, and where it runs instead
USER_FILES = {
    '"my-classifier"': "a user's checkpoint: tests/test_readme.py runs README's example on the packaged MiniLM"
}


def reads_user_files(snippet: Snippet) -> bool:
    return any(marker in snippet.code for marker in USER_FILES)


SELF_CONTAINED = [
    s for s in SNIPPETS if not free_names(tree := ast.parse(s.code)) and prints(tree) and not reads_user_files(s)
]


def expected_after(lines: list[str], line: int) -> str | None:
    """The output a print on `line` (1-based) is documented to give: its comment, or a comment-only line after it,
    when the comment starts with a number."""
    candidates = [lines[line - 1].partition("  # ")[2]]
    if line < len(lines) and lines[line].lstrip().startswith("#"):
        candidates.append(lines[line].lstrip()[1:].strip())
    return next((c for c in candidates if NUMBER.match(c.strip())), None)


def numbers(text: str) -> list[float]:
    return [float(n) for n in NUMBER.findall(text)]


def close(value: float, shown: str) -> bool:
    """`value` printed as the docs show `shown`: within one unit of its last digit (another CPU may round the other
    way), or 0.01 % of it."""
    decimals = len(shown.partition(".")[2]) if "." in shown else 0
    return abs(value - float(shown)) <= max(1.001 * 10**-decimals, 1e-4 * abs(float(shown)))


def is_subsequence(found: list[float], shown: list[str]) -> bool:
    it = iter(shown)
    return all(any(close(value, s) for s in it) for value in found)


@pytest.mark.parametrize("snippet", SELF_CONTAINED, ids=str)
def test_self_contained_examples_print_what_the_docs_show(snippet, monkeypatch):
    printed: list[tuple[int, str]] = []  # (line in the example, text)
    filename = f"<{snippet}>"

    def record(*args, sep=" ", end="\n", file=None, flush=False):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != filename:
            frame = frame.f_back
        printed.append((frame.f_lineno if frame else 0, sep.join(map(str, args))))

    monkeypatch.setattr(builtins, "print", record)
    exec(compile(snippet.code, filename, "exec"), {"__name__": "__docs__"})
    monkeypatch.undo()
    assert printed, f"{snippet} prints nothing: what does it show?"
    lines = snippet.code.splitlines()
    if snippet.output is not None:  # the docs' output block: every number, in order
        found, shown = numbers("\n".join(text for _, text in printed)), NUMBER.findall(snippet.output)
        assert len(found) == len(shown) and all(close(v, s) for v, s in zip(found, shown)), (
            f"{snippet} prints\n{chr(10).join(t for _, t in printed)}\nwhere the docs show\n{snippet.output}"
        )
        return
    checked = 0
    for line, text in printed:
        expected = expected_after(lines, line)
        if expected is None:
            continue
        assert is_subsequence(numbers(text), NUMBER.findall(expected)), (
            f"{snippet}, line {line} prints {text!r} where the docs show {expected!r}"
        )
        checked += 1
    assert checked, f"{snippet} prints, and the docs do not show what (a comment or a 'prints' block after it)"


def test_the_examples_are_found():
    """The parser sees the examples the docs hold (it cannot pass by finding none), and runs those that need
    nothing from outside, the ones with documented output among them."""
    assert len(SNIPPETS) >= 15
    trees = [ast.parse(s.code) for s in SNIPPETS]
    assert sum(len(library_calls(tree, imported_names(tree))) for tree in trees) >= 40
    run = {str(s).split(":")[0] for s in SELF_CONTAINED}
    assert {"docs/conformal.md", "docs/selective.md", "docs/calibration.md", "docs/ood_scores.md"} <= run
    assert all(any(marker in s.code for s in SNIPPETS) for marker in USER_FILES), "no example holds a USER_FILES mark"
