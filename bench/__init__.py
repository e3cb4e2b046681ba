"""tickler's benchmark harness: each scenario beside a plain-psycopg baseline in the same run (`python -m bench`)."""
