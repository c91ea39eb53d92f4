"""The scenario matrix of issue 13: model families the detector was never tuned on, two
optimizers, five faults and clean runs, each under the default policy through the real
runtime, idle and with one core kept busy. ``python -m bench.matrix --help``.
"""
