"""The columns revision 0004 adds, declared on ``oomguard.manager.db``'s tables.

- ``reports.agent_ms``: the time the agent put on the report (its ``time``), as reported; the
  row's ``received_ms`` is the manager's own clock when the report arrived;
- ``nodes.clock_skew_ms``: the agent's time minus the receive time, of the node's latest report.

``extend_existing`` adds them to the tables of ``db.metadata`` (and replaces them harmlessly
when ``db.py`` declares them too), so every query of the store sees the head revision's schema.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Table

from oomguard.manager.db import metadata

Table("reports", metadata, Column("agent_ms", BigInteger), extend_existing=True)
Table("nodes", metadata, Column("clock_skew_ms", BigInteger), extend_existing=True)
