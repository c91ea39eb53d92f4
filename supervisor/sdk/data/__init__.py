"""The supervised data pipeline, in small pieces.

* ``order``      — a seeded bijective permutation of ``[0, n)`` computed per index (constant memory);
* ``exclusions`` — the persistent exclusion set (sample IDs, sources, global batch ranges);
* ``schedule``   — the global batch schedule of a map-style dataset and its resumable cursor;
* ``ids``        — sample IDs attached to / found in batches of any shape;
* ``mapstyle``   — map-style datasets through ``torch.utils.data.DataLoader`` worker processes;
* ``stream``     — iterable / streaming sources (HF ``datasets`` streaming, webdataset, any
  ``IterableDataset``) with stable IDs, sharded across ranks and workers, resumed through
  torchdata's ``StatefulDataLoader``.

``supervisor.sdk.SupervisedLoader`` (``supervisor/sdk/loader.py``) puts them together.
"""
