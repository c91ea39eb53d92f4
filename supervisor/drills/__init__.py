"""Fire drills: real faults injected into real training, and checks of how the supervisor responded.

``specs`` (fault parameters, no torch) → ``faults`` (the torch-side injectors the training
loop calls) → ``scenario`` (a job + its faults + expectations) → ``check`` / ``runner``.
"""
