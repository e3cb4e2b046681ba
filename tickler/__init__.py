"""tickler: delayed events with natural keys, on PostgreSQL.

The one import package of the distribution, so that a program embedding the worker keeps its own
`config`, `api` or `cli`. In the repository its subpackages are the top-level folders
(`tickler.scheduler` is scheduler/, `tickler.api` is api/, ...), mapped by pyproject.toml's
`[tool.setuptools] package-dir` in a wheel and in an editable install alike; this folder holds
only what sits at the package's top: the command line (cli.py) and the WSGI entry (wsgi.py).
"""
