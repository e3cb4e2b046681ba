"""Today's database: `schema.sql` (tables, indexes, constraints, types) and the code files
(functions, triggers, views), each function defined once and edited where it is.
`tickler.scheduler.migrate` applies them."""
