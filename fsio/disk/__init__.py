"""The local disk cache tier: source-file ranges kept on a local disk, across restarts.

One concept per module; the engine sees only :mod:`.tier`, the daemon only :mod:`.store`'s stats
names and :mod:`.directory`'s placement check::

    tier.py       DiskTier: what the engine calls (disk keys, fills from disk, writes of fetched
                  bytes, opens by passthrough) over one DiskStore
    store.py      DiskStore: the store's facade (put, holds, read_into, complete_fd, advise, flush,
                  stats, maintain, close); opens the directory and wires the parts below
    writer.py     Writers: the write queue and the writer threads (puts, verifications, drops)
    reads.py      Reader: reads checked against the recorded CRCs, whole-file verification,
                  complete_fd's trusted descriptors
    space.py      Space: the budget, the free-space floor and LRU eviction
    journal.py    Journal: the journal file (appends, fsync, compaction) and entry ids
    catalog.py    Catalog: the RAM index (entries in LRU order, bytes held), the counters, the lock
    files.py      DataFiles: the data files and their fan-out directories, the start-up sweep
    index.py      Entry and the journal's record format (pure: no I/O)
    directory.py  the cache directory: ownership checks, the marker, clearing what is ours, placement

Locks (the whole order; nothing else is taken while one is held):

* ``Journal.lock`` serialises journal appends, compaction and fsync (it is held across that I/O);
  only writer threads, :meth:`DiskStore.maintain` and :meth:`DiskStore.close` take it, never a
  reader. It is taken *before* ``Catalog.lock`` when both are needed.
* ``Catalog.lock`` (one lock shared by every part) guards all RAM state: the index and every
  :class:`~.index.Entry` field, the space accounting, the journal's length and ids, the write
  queues, the fan-out descriptor slots and the counters. It is never held across I/O.

Each module's docstring names the fields it owns and what guards them.
"""
