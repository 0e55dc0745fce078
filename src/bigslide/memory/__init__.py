"""Device memory below the methods: the optimizer stepper every method steps through, peak meters,
the planner's fitted memory models and its request and answer types (`targets`).

Nothing here imports a method, the engine or the planner, so each of them can build on it.
"""
