"""Handler modules loaded by worker processes in the delivery tests, and how to start those processes."""
