"""The worker side of the fleet manager: ``oomguard agent`` and ``oomguard run --manager``.

- ``node``: node names (sanitized, defaults from the environment);
- ``spool``: the durable on-disk queue every report and event passes through;
- ``sender``: HTTP delivery to the manager, oldest first (network failures are values);
- ``loop``: ``run_agent``, a report every interval or once; internal errors are logged with
  their tracebacks and end the agent after ``MAX_INTERNAL_ERRORS`` in a row;
- ``forwarder``: ``EventForwarder``, the supervisor's event sink for ``run --manager``.

Standard library only. Imported by those two commands alone, so importing everything here
costs nothing elsewhere.
"""

from oomguard.agent.forwarder import EventForwarder
from oomguard.agent.loop import run_agent
from oomguard.agent.node import NODE_NAME_CHARS, default_node_name, sanitize_node_name
from oomguard.agent.sender import Sender
from oomguard.agent.spool import Spool, default_spool_dir

__all__ = [
    "NODE_NAME_CHARS",
    "EventForwarder",
    "Sender",
    "Spool",
    "default_node_name",
    "default_spool_dir",
    "run_agent",
    "sanitize_node_name",
]
