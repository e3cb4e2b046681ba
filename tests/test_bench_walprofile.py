"""bench.walprofile reads pg_waldump's totals: the records and their full-page images apart."""

from __future__ import annotations

from bench.walprofile import _per_type, record_bytes

# A real `pg_waldump --stats=record` (PostgreSQL 15), its runs of spaces shortened.
DUMP = """WAL statistics between 0/2D80CF0 and 0/3A4F5C0:
Type  N  (%)  Record size  (%)  FPI size  (%)  Combined size  (%)
----  -  ---  -----------  ---  --------  ---  -------------  ---
Heap/INSERT  29332 ( 26.09)  5768861 ( 44.95)  7920 (  2.09)  5776781 ( 43.72)
Heap/LOCK  10398 (  9.25)  561887 (  4.38)  264728 ( 41.12)  826615 (  6.13)
  --------  --------  --------  --------
Total  112396  12836524 [95.22%]  643724 [4.78%]  13480248 [100%]
"""


def test_the_total_splits_records_from_their_images() -> None:
    assert record_bytes(DUMP) == (12836524, 643724)
    assert record_bytes("pg_waldump: error: could not find file") == (0, 0)


def test_each_record_type_counts_its_images() -> None:
    assert _per_type(DUMP) == {"Heap/INSERT": (29332, 5776781), "Heap/LOCK": (10398, 826615)}
