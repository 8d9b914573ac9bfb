"""``fastfs completion bash|zsh|fish``: shell completion scripts generated from the argument parser.

The scripts are derived from :func:`fastfs.daemon.cli.parser.build_parser` when asked for, so they
always match the commands and options of this version. :func:`model` reads the parser once into a
shell-neutral description (commands with their help, options with what their value is, positional
arguments), and one renderer per shell writes it out:

* what completes: subcommands (with their help in zsh and fish), their options, the choices of
  options that have them (``--profile``, ``--log-level``), file names after ``--config`` and
  similar, setting names after ``-o`` (aliases and dotted keys, each completed with ``=``), and
  directories (or files, for ``bench``; or their choices) as positional arguments;
* install: bash ``fastfs completion bash > /etc/bash_completion.d/fastfs`` (or
  ``source <(fastfs completion bash)``); zsh ``fastfs completion zsh > "${fpath[1]}/_fastfs"``;
  fish ``fastfs completion fish > ~/.config/fish/completions/fastfs.fish``.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

# Option metavars whose value is a file name.
FILE_METAVARS = ("FILE", "F")
# Option destinations whose value is a file or directory name.
FILE_DESTS = ("config", "log_file", "prefix")
# Subcommands whose positional arguments may be files, not only directories.
FILE_POSITIONALS = ("bench",)
SHELLS = ("bash", "zsh", "fish")


@dataclass(frozen=True)
class Option:
    """One option of a command: its strings, help, and what its value is."""

    strings: tuple[str, ...]
    help: str
    value: str  # "" (a flag) | "file" | "setting" | "choices" | "other"
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Command:
    """One subcommand: its options and what its positional arguments are."""

    name: str
    help: str
    options: tuple[Option, ...]
    positional: str  # "dir" | "file" | "choices"
    choices: tuple[str, ...] = ()


def _subparsers(parser: argparse.ArgumentParser) -> tuple[dict[str, argparse.ArgumentParser], dict[str, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return dict(action.choices), helps
    return {}, {}


def _option(action: argparse.Action) -> Option:
    text = (action.help or "").replace("%(default)s", str(action.default))
    if action.nargs == 0:
        return Option(tuple(action.option_strings), text, "")
    if action.choices:
        return Option(tuple(action.option_strings), text, "choices", tuple(str(c) for c in action.choices))
    if action.metavar in FILE_METAVARS or action.dest in FILE_DESTS:
        return Option(tuple(action.option_strings), text, "file")
    if action.dest == "options":
        return Option(tuple(action.option_strings), text, "setting")
    return Option(tuple(action.option_strings), text, "other")


def model(parser: argparse.ArgumentParser) -> tuple[list[Command], list[Option]]:
    """(subcommands, top-level options) of *parser*."""
    commands, helps = _subparsers(parser)
    out = []
    for name, sub in commands.items():
        options = tuple(_option(a) for a in sub._actions if a.option_strings)
        choices = tuple(str(c) for a in sub._actions if not a.option_strings and a.choices for c in a.choices)
        positional = "choices" if choices else ("file" if name in FILE_POSITIONALS else "dir")
        out.append(Command(name, helps.get(name, ""), options, positional, choices))
    top = [_option(a) for a in parser._actions if a.option_strings]
    return out, top


def script(shell: str, parser: argparse.ArgumentParser, setting_names: list[str]) -> str:
    """The completion script of *shell* for *parser*; *setting_names* complete ``-o``."""
    render = {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}[shell]
    return render(parser, setting_names)


# -- bash -------------------------------------------------------------------------------------------
def _words(items: list[str] | tuple[str, ...]) -> str:
    return shlex.quote(" ".join(items))


def bash_script(parser: argparse.ArgumentParser, setting_names: list[str]) -> str:
    """The bash completion script for *parser* (``fastfs``)."""
    prog = parser.prog
    commands, top_options = model(parser)
    top = [c.name for c in commands] + [s for o in top_options for s in o.strings]
    cases = []
    for command in commands:
        flags = [s for o in command.options for s in o.strings]
        value_cases = []
        for option in command.options:
            if not option.value:
                continue
            pattern = "|".join(option.strings)
            if option.value == "choices":
                reply = f'COMPREPLY=($(compgen -W {_words(option.choices)} -- "$cur"))'
            elif option.value == "file":
                reply = 'COMPREPLY=($(compgen -f -- "$cur"))'
            elif option.value == "setting":
                reply = f'compopt -o nospace; COMPREPLY=($(compgen -S = -W {_words(setting_names)} -- "$cur"))'
            else:
                reply = "COMPREPLY=()"
            value_cases.append(f"                {pattern}) {reply}; return ;;")
        positional = {"dir": "-d", "file": "-f", "choices": f"-W {_words(command.choices)}"}[command.positional]
        cases += [
            f"        {command.name})",
            '            case "$prev" in',
            *value_cases,
            "            esac",
            f'            if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W {_words(flags)} -- "$cur"))',
            f'            else COMPREPLY=($(compgen {positional} -- "$cur")); fi ;;',
        ]
    function = f"_{prog.replace('-', '_').replace('.', '_')}"
    return "\n".join(
        [
            f"# bash completion for {prog} (generated by `{prog} completion bash`)",
            f"{function}() {{",
            '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cmd="" i',
            "    for ((i = 1; i < COMP_CWORD; i++)); do",
            '        case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break ;; esac',
            "    done",
            '    if [[ -z "$cmd" ]]; then',
            f'        COMPREPLY=($(compgen -W {_words(top)} -- "$cur")); return',
            "    fi",
            '    case "$cmd" in',
            *cases,
            "    esac",
            "}",
            f"complete -o filenames -F {function} {prog}",
            "",
        ]
    )


# -- zsh --------------------------------------------------------------------------------------------
def _zq(text: str) -> str:
    """*text* in single quotes for zsh."""
    return "'" + text.replace("'", "'\\''") + "'"


def _zdesc(text: str) -> str:
    """A help text fit for an _arguments ``[description]`` (no brackets, one line)."""
    return " ".join(text.split()).replace("[", "(").replace("]", ")").replace(":", "-")


def _zsh_spec(option: Option, settings_fn: str) -> list[str]:
    desc = _zdesc(option.help)
    action = {
        "": "",
        "file": ":file:_files",
        "setting": f":setting:{settings_fn}",
        "choices": ":value:(" + " ".join(option.choices) + ")",
        "other": ":value: ",
    }[option.value]
    repeat = "*" if option.value == "setting" else ""  # -o may be given many times
    if len(option.strings) == 1:
        return [_zq(f"{repeat}{option.strings[0]}[{desc}]{action}")]
    exclusive = "" if repeat else "(" + " ".join(option.strings) + ")"
    group = "{" + ",".join(option.strings) + "}"
    return [_zq(f"{repeat}{exclusive}") + group + _zq(f"[{desc}]{action}")]


def zsh_script(parser: argparse.ArgumentParser, setting_names: list[str]) -> str:
    """The zsh completion function for *parser* (an ``#compdef`` file)."""
    prog = parser.prog
    commands, top_options = model(parser)
    function = f"_{prog.replace('-', '_').replace('.', '_')}"
    settings_fn = f"{function}_settings"
    lines = [
        f"#compdef {prog}",
        f"# zsh completion for {prog} (generated by `{prog} completion zsh`)",
        f"{settings_fn}() {{",
        "    local -a settings",
        "    settings=(" + " ".join(_zq(s) for s in setting_names) + ")",
        "    compadd -S = -q -a settings",
        "}",
        "",
        f"{function}() {{",
        '    local curcontext="$curcontext" state line',
        "    typeset -A opt_args",
        "    local -a commands",
        "    commands=(",
        *(f"        {_zq(c.name + ':' + _zdesc(c.help))}" for c in commands),
        "    )",
        "    _arguments -C \\",
        *(f"        {spec} \\" for option in top_options for spec in _zsh_spec(option, settings_fn)),
        "        '1: :->command' \\",
        "        '*:: :->args'",
        "    case $state in",
        f"        command) _describe -t commands {_zq(prog + ' command')} commands ;;",
        "        args)",
        "            case $line[1] in",
    ]
    for command in commands:
        positional = {
            "dir": "'*:directory:_files -/'",
            "file": "'*:path:_files'",
            "choices": _zq("1:value:(" + " ".join(command.choices) + ")"),
        }[command.positional]
        specs = [spec for option in command.options for spec in _zsh_spec(option, settings_fn)]
        lines.append(f"                {command.name})")
        lines.append("                    _arguments \\")
        lines += [f"                        {spec} \\" for spec in specs]
        lines.append(f"                        {positional} ;;")
    lines += [
        "            esac ;;",
        "    esac",
        "}",
        "",
        f'{function} "$@"',
        "",
    ]
    return "\n".join(lines)


# -- fish -------------------------------------------------------------------------------------------
def _fq(text: str) -> str:
    """*text* in single quotes for fish (backslash and quote escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_flags(option: Option) -> str:
    parts = []
    for s in option.strings:
        if s.startswith("--"):
            parts.append(f"-l {s[2:]}")
        elif len(s) == 2:
            parts.append(f"-s {s[1]}")
        else:
            parts.append(f"-o {s[1:]}")
    return " ".join(parts)


def fish_script(parser: argparse.ArgumentParser, setting_names: list[str]) -> str:
    """The fish completions for *parser* (a file for ``~/.config/fish/completions``)."""
    prog = parser.prog
    commands, top_options = model(parser)
    names = " ".join(c.name for c in commands)
    lines = [
        f"# fish completion for {prog} (generated by `{prog} completion fish`)",
        f"complete -c {prog} -f",
    ]
    for option in top_options:
        lines.append(f"complete -c {prog} -n __fish_use_subcommand {_fish_flags(option)} -d {_fq(option.help)}")
    for command in commands:
        lines.append(
            f"complete -c {prog} -n 'not __fish_seen_subcommand_from {names}' -a {command.name}"
            f" -d {_fq(' '.join(command.help.split()))}"
        )
    settings = " ".join(f"{s}=" for s in setting_names)
    for command in commands:
        when = f"-n '__fish_seen_subcommand_from {command.name}'"
        for option in command.options:
            value = {
                "": "",
                "file": " -r -F",
                "setting": f" -x -a {_fq(settings)}",
                "choices": f" -x -a {_fq(' '.join(option.choices))}",
                "other": " -x",
            }[option.value]
            lines.append(
                f"complete -c {prog} {when} {_fish_flags(option)}{value} -d {_fq(' '.join(option.help.split()))}"
            )
        positional = {
            "dir": "-a '(__fish_complete_directories (commandline -ct))'",
            "file": "-F",
            "choices": f"-a {_fq(' '.join(command.choices))}",
        }[command.positional]
        lines.append(f"complete -c {prog} {when} {positional}")
    return "\n".join(lines) + "\n"
