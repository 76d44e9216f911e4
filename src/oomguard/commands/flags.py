"""A small command-line parser for oomguard's flat commands.

Not argparse: ``oomguard check`` has a start-up goal of 1.15x a bare interpreter,
and ``import argparse`` (with ``re`` and ``gettext``) alone costs ~70% of that
interpreter's start-up (measured in docs/architecture.md). Supports ``--name VALUE``,
``--name=VALUE``, boolean flags, ``-h``/``--help``, ``--`` and positionals.
"""

from __future__ import annotations

from oomguard.errors import UsageError


class Option:
    __slots__ = ("dest", "help", "metavar", "name", "short")

    def __init__(self, name: str, help: str, metavar: str | None = None, short: str | None = None) -> None:
        self.name = name
        self.dest = name.lstrip("-").replace("-", "_")
        self.metavar = metavar  # None: a boolean flag
        self.help = help
        self.short = short


class Command:
    __slots__ = ("brief", "epilog", "max_positionals", "name", "options", "stop_at_positional", "summary", "usage")

    def __init__(
        self,
        name: str,
        summary: str,
        usage: str,
        options: list[Option],
        *,
        epilog: str = "",
        max_positionals: int = 0,
        stop_at_positional: bool = False,
        brief: str = "",
    ) -> None:
        self.name = name
        self.brief = brief or summary  # one line for 'oomguard --help'
        self.summary = summary
        self.usage = usage
        self.options = options
        self.epilog = epilog
        self.max_positionals = max_positionals
        self.stop_at_positional = stop_at_positional  # the rest is a command line (oomguard run)

    def help(self) -> str:
        lines = [f"usage: oomguard {self.name} {self.usage}".rstrip(), "", self.summary, "", "options:"]
        for o in self.options:
            flag = o.name + (f" {o.metavar}" if o.metavar else "")
            if o.short:
                flag = f"{o.short}, {flag}"
            lines.append(f"  {flag:<26} {o.help}")
        lines.append(f"  {'-h, --help':<26} show this help and exit")
        if self.epilog:
            lines += ["", self.epilog]
        return "\n".join(lines) + "\n"

    def parse(self, argv: list[str]) -> tuple[dict[str, str | bool | None], list[str]]:
        """Values by dest (None when not given), and positionals. ``-h`` gives {"help": True}."""
        by_name = {o.name: o for o in self.options}
        by_name.update({o.short: o for o in self.options if o.short})
        values: dict[str, str | bool | None] = {o.dest: None for o in self.options}
        positionals: list[str] = []
        i = 0
        while i < len(argv):
            arg = argv[i]
            i += 1
            if arg in ("-h", "--help"):
                return {"help": True}, []
            if arg == "--":
                positionals.extend(argv[i:])
                break
            if not arg.startswith("-") or arg == "-":
                if self.stop_at_positional:
                    positionals.extend(argv[i - 1 :])
                    break
                positionals.append(arg)
                continue
            name, eq, inline = arg.partition("=")
            opt = by_name.get(name)
            if opt is None:
                raise UsageError(f"{self.name}: unknown option {name} (see 'oomguard {self.name} --help')")
            if opt.metavar is None:
                if eq:
                    raise UsageError(f"{self.name}: {name} takes no value")
                values[opt.dest] = True
                continue
            if eq:
                values[opt.dest] = inline
            elif i < len(argv) and not (argv[i].startswith("-") and len(argv[i]) > 1):
                values[opt.dest] = argv[i]
                i += 1
            else:
                raise UsageError(f"{self.name}: {name} needs a value ({opt.metavar})")
        if len(positionals) > self.max_positionals:
            extra = positionals[self.max_positionals]
            raise UsageError(f"{self.name}: unexpected argument {extra!r} (see 'oomguard {self.name} --help')")
        return values, positionals


def text(values: dict[str, str | bool | None], key: str) -> str | None:
    """The value given to an option, or None when it was not given (or is a boolean flag)."""
    v = values.get(key)
    return v if isinstance(v, str) else None
