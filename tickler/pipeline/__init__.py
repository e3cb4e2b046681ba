"""Spark jobs over tickler's history: report, archive, import."""
