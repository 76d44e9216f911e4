"""The worker side of the fleet manager: ``oomguard agent`` and ``oomguard run --manager``.

- ``node``: the default node name (the rule itself is ``oomguard.nodes``, shared with the manager);
- ``spool``: the durable on-disk queue every report and event passes through;
- ``rejected``: where refused items go, and when a 5xx item is given up;
- ``client``: one POST and what its answer means (network failures are values);
- ``sender``: delivery oldest first, each item's fate, failure episodes logged once;
- ``loop``: ``run_agent``, a report every interval or once (the exit code from the report's
  fate); internal errors are logged with their tracebacks and end the agent after
  ``MAX_INTERNAL_ERRORS`` in a row;
- ``forwarder``: ``EventForwarder``, the supervisor's event sink for ``run --manager``;
- ``labels``: the node's labels (``node_labels``: the environment's, ``OOMGUARD_LABELS``,
  ``--label``), in every envelope;
- ``gate``: the worker entrypoint's gate event (``gate_event``, ``agent --gate``).

Standard library only. Imported by those two commands alone, so importing everything here
costs nothing elsewhere.
"""

from oomguard.agent.forwarder import EventForwarder
from oomguard.agent.gate import gate_event
from oomguard.agent.labels import node_labels
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
    "gate_event",
    "node_labels",
    "run_agent",
    "sanitize_node_name",
]
