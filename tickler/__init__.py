"""tickler: delayed events with natural keys, on PostgreSQL.

The one import package of the distribution, so that a program embedding the worker keeps its own
`config`, `api` or `cli`: the engine is `tickler.scheduler` (tickler/scheduler/), the HTTP API
`tickler.api`, the Spark pipeline `tickler.pipeline`; the command line is cli.py and the WSGI
entry wsgi.py. The repository's top-level `scheduler`, `api`, ... are links to these folders.
"""
