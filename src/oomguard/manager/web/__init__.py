"""The manager's HTTP side: the API (``api``, with ``deps``), the dashboard (``pages``, ``views``,
``forget``; ``templates/``, ``static/``, ``chart``, ``formatting``), /metrics (``metrics``), the
middleware, the dashboard's sessions and the failed-token limit (``sessions``), and uvicorn
(``server``). It reads and writes only through the store (``oomguard.manager.store``)."""
