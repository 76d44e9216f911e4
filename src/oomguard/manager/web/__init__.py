"""The manager's HTTP side: the API (``api``, with ``deps``), the dashboard (``pages``, ``views``,
``forget``; ``templates/``, ``static/``, ``chart``, ``formatting``), /metrics (``metrics``), the
middleware, the dashboard's sessions and the failed-token limits (``sessions``), per-node agent
tokens and the new-node cap (``credentials``), trusted proxies and who the client is
(``proxies``), and uvicorn with its per-client connection limit (``server``, ``connections``). It
reads and writes only through the store (``oomguard.manager.store``)."""
