"""kimipd's benchmark (`scripts/bench`): time to serve, steady state, preparation, program cost,
change scope. See docs/bench.md."""
