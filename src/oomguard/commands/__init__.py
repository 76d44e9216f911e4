"""One module per command, each with ``configure(parser)`` (its options, usage, description and
epilog) and ``execute(args) -> int`` (an exit code from ``oomguard.errors``); ``flags`` holds the
option groups several commands share and the one "flags -> probe()" step; ``render`` prints a
report. ``oomguard.cli`` imports a command's module only when that command runs, so a module here
keeps its heavy imports inside ``execute``."""
