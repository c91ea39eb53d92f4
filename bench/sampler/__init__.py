"""Scenario sampler (issue 24): seeded cells over models, optimizers, schedules, precision, ranks and faults."""
