"""`hydra-ens <command> --help` shows every default, each once (issue 40)."""

from __future__ import annotations

import argparse

import pytest

from hydra_ensembles.cli import build_parser

COMMANDS = build_parser()._subparsers._group_actions[0].choices


def _action_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help of one option as `--help` prints it, on one line."""
    formatter = parser._get_formatter()
    formatter.add_argument(action)
    return " ".join(formatter.format_help().split())


def _typed(value: object) -> list[str]:
    """What must appear of a default: each item as typed (floats short)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return [f"{item:g}" if isinstance(item, float) else str(item) for item in items]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_every_default_once(name):
    parser = COMMANDS[name]
    for action in parser._actions:
        shown = _action_help(parser, action)
        assert shown.count("(default") <= 1, (name, shown)  # no hand-written default beside the formatter's
        if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
            continue  # flags, and options whose help says what leaving them out means
        assert "(default: " in shown, (name, shown)
        default_part = shown[shown.index("(default: ") :]
        assert all(item in default_part for item in _typed(action.default)), (name, shown)


def test_flags_and_none_defaults_get_no_default_text():
    parser = COMMANDS["members"]
    options = {option: action for action in parser._actions for option in action.option_strings}
    assert "(default" not in _action_help(parser, options["--allow-identical"])  # store_true
    assert "(default: None" not in _action_help(parser, options["--budget"])  # its help says what None means
    assert "(default: 3)" in _action_help(parser, options["--num-members"])
