"""tickler's engine: the store (the only code that speaks SQL), the event rules and the dispatcher."""
