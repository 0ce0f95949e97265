"""A code-review summary of a `pulumi preview --json`: per node and role what is created,
replaced, updated or deleted, the flags and env vars that change in each container, and the
order in which the engine replaces them (scripts/review, .github/workflows/preview.yml)."""
