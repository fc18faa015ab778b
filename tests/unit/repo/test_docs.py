"""The documentation keeps up with the code: every task, profile, profile key and named error has
its place in the docs (docs/, built by MkDocs) and the README, the generated parts render from
the code (docs/hooks/generate.py, called here without MkDocs), and every `invoke` or `./tb`
command in them parses with invoke's own parser against the real tasks and options.
tests/integration/test_docs_site.py builds the site and reads it in a browser."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO
from invoke import Program
from invoke.exceptions import ParseError
from invoke.parser import Parser

from torchbuild import __version__
from torchbuild.core.errors import ERRORS
from torchbuild.profile.config import available_profiles, describe_keys, schema
from torchbuild.tasks import ns

DOCS = REPO / "docs"


def _hook():
    spec = importlib.util.spec_from_file_location("torchbuild_docs_hook", DOCS / "hooks" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hook = _hook()


def task_page(task: str) -> Path:
    return DOCS / "tasks" / (task.replace(".", "-") + ".md")


def nav_pages() -> set[str]:
    def walk(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, dict):
            return [p for v in node.values() for p in walk(v)]
        if isinstance(node, list):
            return [p for v in node for p in walk(v)]
        return []

    return set(walk(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]))


def test_every_task_has_a_page_in_the_nav_with_its_generated_options() -> None:
    nav = nav_pages()
    for task in ns.task_names:
        page = task_page(task)
        assert page.is_file(), f"no docs page for invoke {task}: write {page.relative_to(REPO)}"
        text = page.read_text()
        assert text.startswith(f"# invoke {task}\n"), page
        assert f"<!-- generated: help {task} -->" in text, f"{page.name} does not show the task's options"
        assert str(page.relative_to(DOCS)) in nav, f"{page.name} is not in mkdocs.yml's nav"
        assert f"invoke {task}" in hook.render(text)
    index = (DOCS / "tasks" / "index.md").read_text()
    for task in ns.task_names:
        assert f"[`invoke {task}`]({task_page(task).name})" in index, f"tasks/index.md lacks invoke {task}"


def test_every_shipped_profile_has_a_site_page_and_a_row() -> None:
    sites = {p.name: p.read_text() for p in (DOCS / "sites").glob("*.md")}
    index = sites.pop("index.md")
    profiles_page = (DOCS / "profiles.md").read_text()
    for profile in available_profiles():
        assert any(f"`{profile}`" in text or f"# {profile}" in text for text in sites.values()), profile
        assert re.search(rf"^\| \[`{re.escape(profile)}`\]\(", index, re.M), f"sites/index.md lacks {profile}"
        assert f"| `{profile}` |" in profiles_page, f"profiles.md lacks {profile}"


def test_the_key_reference_is_generated_with_every_key() -> None:
    page = hook.render((DOCS / "reference" / "profile-keys.md").read_text())
    assert describe_keys() in page
    for key in schema():
        assert f"| `{key}` |" in page, f"the key reference lacks {key}"


ROW = re.compile(r"^\| `(?P<name>[A-Za-z]+)` \| (?P<code>\d+) \| (?P<meaning>[^|]+(?:\\\|[^|]*)*) \| .+ \|$")


def test_the_error_table_is_generated_with_every_error_its_code_and_meaning() -> None:
    page = hook.render((DOCS / "reference" / "errors.md").read_text())
    rows = [ROW.match(line) for line in page.splitlines() if line.startswith("| `")]
    assert all(rows), [line for line in page.splitlines() if line.startswith("| `")]
    found = {m["name"]: int(m["code"]) for m in rows if m}
    assert len(found) == len(rows), "an error is listed twice"
    assert found == {c.__name__: c.exit_code for c in ERRORS}
    assert all(len(m["meaning"].strip()) > 20 for m in rows if m), "an error class has no docstring to show"


def test_the_spread_tables_are_the_models() -> None:
    spec = importlib.util.spec_from_file_location("spread_nodes_for_docs", REPO / "benchmarks" / "spread_nodes.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    page = hook.render((DOCS / "guide" / "multi-node.md").read_text())
    twice = bench.paper_table(bench.PYTORCH_26, overhead_s=bench.MEASURED_OVERHEAD_S)
    once = bench.paper_table(
        dataclasses.replace(bench.PYTORCH_26, preprocess_passes=1), overhead_s=bench.MEASURED_OVERHEAD_S
    )
    assert bench.format_table(twice) in page and bench.format_table(once) in page


def test_the_official_wheels_table_is_generated_from_the_one_doctor_compares_with() -> None:
    text = hook.render("<!-- generated: official-wheels -->")
    assert "| 2.15 | 3.11 to 3.14 | 2.28 | 13.0, 13.2 | 13.0, 13.2 |" in text
    assert "| aarch64 | 12.6 | 9.0 | 2.6 |" in text and "| aarch64 | 12.6 | 8.0;9.0 | 2.9 |" in text
    assert "<!-- generated: official-wheels -->" in (DOCS / "tasks" / "doctor.md").read_text()


def test_an_unknown_generated_part_fails_the_build() -> None:
    with pytest.raises(ValueError, match="unknown generated part 'nope'"):
        hook.render("<!-- generated: nope -->")
    with pytest.raises(ValueError, match="no such task"):
        hook.render("<!-- generated: help no-such-task -->")


def test_every_generated_part_of_every_page_renders() -> None:
    for page in DOCS.rglob("*.md"):
        rendered = hook.render(page.read_text())
        assert "<!-- generated:" not in rendered, page


# --- commands in the docs and the README --------------------------------------------------------

PARSER = Parser(initial=Program(namespace=ns).initial_context, contexts=ns.to_contexts())


def code_lines(text: str) -> list[str]:
    """The command lines of the fenced code blocks: every line of a bash block (continuation lines
    joined), the `$ ` lines of a text block (a session shown with its output)."""
    lines: list[str] = []
    for lang, block in re.findall(r"^\s*```([a-z]*)\n(.*?)^\s*```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if lang in ("bash", "sh", "console"):
                lines.append(line.removeprefix("$ "))
            elif lang == "text" and line.startswith("$ "):
                lines.append(line[2:])
    return lines


def commands(line: str) -> list[list[str]]:
    """The argv after each `invoke` or `./tb` of one shell line (`&&`, `|` and `;` split it)."""
    if not re.search(r"(^|[\s;&|])(invoke|\./tb) ", line):
        return []  # a line of prose, YAML or a layout, in a code block
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    found, current = [], None
    for tok in lexer:
        if tok in ("&&", "||", "|", ";"):
            current = None
        elif tok in ("invoke", "./tb") and current is None:
            current = []
            found.append(current)
        elif current is not None and tok != "...":
            current.append(tok)
    return [argv for argv in found if argv and argv[0] != "nox"]


def documented_commands() -> list[tuple[str, list[str]]]:
    texts = {str(p.relative_to(REPO)): p.read_text() for p in DOCS.rglob("*.md")}
    texts["README.md"] = (REPO / "README.md").read_text()
    return [(name, argv) for name, text in texts.items() for line in code_lines(text) for argv in commands(line)]


def test_every_command_in_the_docs_parses_against_the_real_tasks() -> None:
    found = documented_commands()
    assert len(found) > 100, len(found)
    bad = []
    for where, argv in found:
        try:
            PARSER.parse_argv(argv)
        except ParseError as exc:
            bad.append(f"{where}: invoke {shlex.join(argv)}: {exc}")
    assert not bad, "\n".join(bad)


def test_the_command_parser_catches_a_wrong_option() -> None:
    (argv,) = commands("./tb build --in-container --no-such-option")
    with pytest.raises(ParseError):
        PARSER.parse_argv(argv)
    assert commands("invoke host-check --strict && taskset -c 4-7 invoke bench ...") == [
        ["host-check", "--strict"],
        ["bench"],
    ]


# --- the README ---------------------------------------------------------------------------------

README = (REPO / "README.md").read_text()
TWO_COMMANDS = (
    "./tb image build --in-container   # the main job",
    "sudo bash .ci/run                 # the whole test suite",
)


def test_the_readme_fits_on_a_few_screens_with_the_two_commands() -> None:
    assert len(README.splitlines()) <= 300
    quickstart = (DOCS / "quickstart.md").read_text()
    for command in TWO_COMMANDS:
        assert command in README and command in quickstart, command


def test_the_readme_has_every_task_and_profile_in_its_tables() -> None:
    for task in ns.task_names:
        assert f"| `invoke {task}` |" in README, f"README's task table lacks invoke {task}"
    for profile in available_profiles():
        assert f"| `{profile}` |" in README, f"README's site table lacks {profile}"


def test_the_readme_links_into_the_docs_resolve() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README)
    assert len(links) > 10
    for link in links:
        assert (REPO / link).is_file(), link


def test_the_changelog_has_an_unreleased_section_and_the_package_version() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    assert "\n## [Unreleased]\n" in text
    assert f"\n## [{__version__}]" in text


def _behaviour_map_places() -> list[tuple[str, str, tuple[str, ...]]]:
    """(row, module path, names in its parentheses) for every `pkg/module.py` the architecture
    page's "Where each behaviour lives" names."""
    text = (DOCS / "architecture.md").read_text()
    table = text[text.index("## Where each behaviour lives") :].split("\n## ", 1)[0]
    places = []
    for line in table.splitlines()[4:]:
        row, _, cell = line.rpartition(" | ")
        for m in re.finditer(r"`([a-z_]+/[a-z_/]*\.py)`(?: \(([^)]*)\))?", cell):
            places.append((row[:60], m.group(1), tuple(re.findall(r"`([A-Za-z_][\w.]*)`", m.group(2) or ""))))
    return places


def test_the_behaviour_map_names_modules_and_names_that_exist():
    """A reader who opens the module a row names finds the functions it names there: a moved or
    renamed function shows here, not as a wrong map."""
    places = _behaviour_map_places()
    assert len({row for row, _, _ in places}) >= 40
    src = REPO / "src" / "torchbuild"
    wrong = []
    for row, module, names in places:
        path = src / module
        if not path.is_file():
            wrong.append(f"{row}: {module} does not exist")
            continue
        body = path.read_text()
        wrong += [
            f"{row}: {module} has no {name}"
            for name in names
            if not re.search(rf"\b{re.escape(name.rsplit('.', 1)[-1])}\b", body)
        ]
    assert not wrong, "\n".join(wrong)


def test_each_behaviour_lives_in_one_feature():
    """A behaviour-map row names one feature's modules at most, beside the shared layers
    (docs/architecture.md "The layers"): a behaviour spread over two features shows here."""
    shared = {"runtime", "profile", "core", "tasks"}
    features: dict[str, set[str]] = {}
    for row, module, _ in _behaviour_map_places():
        features.setdefault(row, set())
        if module.split("/")[0] not in shared:
            features[row].add(module.split("/")[0])
    spread = {row: sorted(f) for row, f in features.items() if len(f) > 1}
    assert not spread, spread
