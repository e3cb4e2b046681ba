"""tickler: delayed events with natural keys, on PostgreSQL.

The one import package of the distribution, so that a program embedding the worker keeps its own
`config`, `api` or `cli`. In the repository, `tickler/scheduler`, `tickler/api`, ... are links to
the top-level folders (the layout the project is read and worked in); the wheel holds the files.
"""
