"""The `bigslide` command: train, cv, predict, suggest, heatmap, demo, plan, methods and bench (`main`),
each subcommand in a module of its own that prints the engine's events and results."""
