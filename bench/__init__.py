"""tickler's benchmark harness: every scenario of issue 4 beside a plain-psycopg baseline."""
