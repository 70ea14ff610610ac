"""The README and docs/*.md stay true to the code: no heading twice in a file, every ``vitkit <command>``
or ``python tools/<tool>.py`` they show names a command and options its parser has, and every
relative link or image, and every ``#anchor``, leads somewhere."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from vitkit.cli import parsers
from vitkit.cli.main import MODULES

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGE_IDS = [str(page.relative_to(ROOT)) for page in PAGES]

FENCE = re.compile(r"^```.*?^```[ \t]*$", flags=re.S | re.M)
SHELL_FENCE = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", flags=re.S | re.M)
INLINE_CODE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")  # a span may wrap onto the next line
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)|<img[^>]*\bsrc=\"([^\"]+)\"")
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (their ``#`` lines are comments, not headings)."""
    return FENCE.sub("", text)


def headings(text: str) -> list[str]:
    return [match.group(1).strip() for match in re.finditer(r"^#{1,6}\s+(.+)$", prose(text), flags=re.M)]


def anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")


def shell_commands(text: str) -> list[str]:
    """Every command line of the page's shell blocks (``\\`` continuations joined, comments cut) and every
    inline code span, each cut to the part that starts with ``vitkit `` or ``python tools/``."""
    lines = []
    for block in SHELL_FENCE.findall(text):
        lines += [line.split(" #", 1)[0] for line in block.replace("\\\n", " ").splitlines()]
    lines += [span.replace("\n", " ") for span in INLINE_CODE.findall(prose(text))]
    commands = []
    for line in lines:
        for part in re.split(r"&&|\|\||;|\|", line):
            words = part.split()
            while words and ENV_ASSIGNMENT.match(words[0]):
                words.pop(0)
            text = " ".join(words)
            if re.match(r"vitkit \S|(?:\S*/)?python3? tools/", text):
                commands.append(text)
    return commands


def tool_command(script: Path) -> str:
    """The ``vitkit`` command a ``tools/*.py`` shim runs (``exit_with("<command>")``)."""
    match = re.search(r'exit_with\("([^"]+)"\)', script.read_text(encoding="utf-8"))
    assert match, f"{script} is not a shim of a vitkit command"
    return match.group(1)


def command_problems(command: str) -> list[str]:
    """What is wrong with one documented command line: an unknown command or tool, an unknown option."""
    words = shlex.split(command.replace("[", " ").replace("]", " "))
    if len(words) < 2 or "<" in words[1] or "..." in words[1]:
        return []  # a placeholder (``vitkit <command>``, ``python tools/<tool>.py``), not a command
    if words[0] == "vitkit":
        name, arguments = words[1], words[2:]
        if name in ("--help", "-h", "--version"):
            return []
    else:
        script = ROOT / words[1]
        if not script.is_file():
            return [f"{command!r}: no file {words[1]}"]
        name, arguments = tool_command(script), words[2:]
    if name not in MODULES:
        return [f"{command!r}: no command {name!r} (commands: {', '.join(MODULES)})"]
    parser = parsers.build(name, MODULES[name])
    known = set(parser._option_string_actions)
    options = [word.split("=", 1)[0] for word in arguments if word.startswith("-") and not word[1:2].isdigit()]
    return [f"{command!r}: vitkit {name} has no option {option}" for option in options if option not in known]


def link_problems(page: Path) -> list[str]:
    """Relative links and images of ``page`` that lead to a missing file or a missing heading."""
    problems = []
    for match in LINK.finditer(prose(page.read_text(encoding="utf-8"))):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            problems.append(f"{page.name}: {target} -> no file {linked}")
        elif fragment and linked.suffix == ".md":
            ids = {anchor(heading) for heading in headings(linked.read_text(encoding="utf-8"))}
            if fragment not in ids:
                problems.append(f"{page.name}: {target} -> no heading #{fragment} in {linked.name}")
    return problems


#: Names that are gone from vitkit (issue 36: one name per concept), with today's: no page may
#: still teach them. Extend the list when a name is retired.
RETIRED_NAMES = {
    "locality_attention": "locality",
    "kernel_policy": "attn_impl",
    "head_mask": "head_gates",
    "HeadMask": "HeadGates",
    "forward_with_attention": "need_weights=True",
    "load_for_inference": "vitkit.load_model",
    "rope_positions": "token_positions",
    "key_padding_mask": "attn_bias=padding_mask(...)",
}


# --- the checks on the shipped pages ------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_no_page_teaches_a_retired_name(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert not [f"{old} (now {new})" for old, new in RETIRED_NAMES.items() if re.search(rf"\b{old}\b", text)]


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_no_heading_appears_twice(page: Path) -> None:
    seen = headings(page.read_text(encoding="utf-8"))
    assert not {heading for heading in seen if seen.count(heading) > 1}


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_command_names_a_real_command_and_its_options(page: Path) -> None:
    commands = shell_commands(page.read_text(encoding="utf-8"))
    assert not [problem for command in commands for problem in command_problems(command)]


def test_the_readme_shows_commands() -> None:
    commands = shell_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert {command.split()[1] for command in commands if command.startswith("vitkit ")} >= {
        "train", "predict", "maps", "prune", "evaluate", "ablate", "explore", "localize"
    }


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_relative_link_and_image_leads_somewhere(page: Path) -> None:
    assert not link_problems(page)


def test_the_readme_links_the_results_and_the_benchmarks() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/results.md" in text and "(docs/benchmarks.md" in text


def test_the_readme_links_every_page_of_docs() -> None:
    text = prose((ROOT / "README.md").read_text(encoding="utf-8"))
    linked = {match.group(1).partition("#")[0] for match in LINK.finditer(text) if match.group(1)}
    assert {f"docs/{page.name}" for page in PAGES[1:]} - linked == set()


def test_the_readme_stays_a_front_door() -> None:
    """How-tos and tables live in docs/; the README stays a short guide to them."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 350


# --- the checks bite --------------------------------------------------------------------------


def test_a_duplicated_heading_is_found_and_code_comments_are_not_headings() -> None:
    text = "# a\n\n## The `x` tool\n\n```bash\n# a comment\n# a comment\n```\n\n## The `x` tool\n"
    seen = headings(text)
    assert seen == ["a", "The `x` tool", "The `x` tool"]
    assert anchor("The `vitkit` command") == "the-vitkit-command"
    assert anchor("Rotary position embeddings (2-D RoPE)") == "rotary-position-embeddings-2-d-rope"


def test_a_wrong_command_tool_or_option_is_found() -> None:
    page = """
```bash
vitkit train recipes/quickstart.yaml --resume x.ckpt trainer.seed=1   # fine
vitkit trian recipes/quickstart.yaml
python tools/prune_heads.py --checkpoint m.safetensors --out p/ --max-dorp 2
.venv/bin/python tools/no_such_tool.py --help
VITKIT_ATTN_IMPL=sdpa vitkit maps --checkpoint m.safetensors \\
    --out maps/ --layers 3
```
and inline: `vitkit predict m.safetensors img/ [--top-k K] [--csv FILE]`, `vitkit predict m img --topk 3`.
"""
    commands = shell_commands(page)
    assert len(commands) == 7
    problems = [problem for command in commands for problem in command_problems(command)]
    assert len(problems) == 5
    for expected in ("no command 'trian'", "has no option --max-dorp", "no file tools/no_such_tool.py",
                     "vitkit maps has no option --layers", "has no option --topk"):
        assert any(expected in problem for problem in problems), expected


def test_a_missing_file_or_heading_is_found(tmp_path: Path) -> None:
    (tmp_path / "there.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n## A section\n\n![ok](there.png) ![gone](missing.png) [ok](#a-section) [gone](#no-section)\n"
        "[web](https://example.org/x) <img src=\"also_missing.png\">\n\n```bash\n[not a link](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    problems = link_problems(page)
    assert len(problems) == 3
    assert any("missing.png" in p for p in problems) and any("#no-section" in p for p in problems)
    assert any("also_missing.png" in p for p in problems)
