"""The analytics engine a user would reach for instead of fleetops's log query: ClickHouse
in-process (chdb), over the same lines `benches/logs.rs` loads into its query session, asked
the same questions (first page of 100 in time order, and the total), timed in-process.

Run by `cargo bench --bench logs` when chdb is installed (`pip install chdb`); by hand:
`python3 benches/support/chdb_logs.py LINES [REPEATS]`. Prints one line per question:
`chdb <name>: total T, p50 X ms, p99 Y ms` and the load time.
"""

import statistics
import sys
import tempfile
import time

from chdb import session

LINES = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
REPEATS = int(sys.argv[2]) if len(sys.argv) > 2 else 30

# The bench's lines, k = 0..LINES: the level and message by k % 10, the module by k % 4,
# the timestamp 10:00:00.000 + (k mod one hour) in milliseconds, metadata {"seq":k}.
LOAD = f"""
INSERT INTO b.logs
SELECT
    toDateTime64('2026-05-01 10:00:00', 3, 'UTC') + toIntervalMillisecond(number % 3600000),
    number,
    multiIf(number % 10 IN (0, 1), 'warn', number % 10 = 2, 'error',
            number % 10 IN (3, 4), 'debug', 'info'),
    ['drive', 'nav', 'arm', 'vision'][number % 4 + 1],
    multiIf(number % 10 = 0, concat('motor ', toString(number), ' temperature high'),
            number % 10 = 1, concat('battery ', toString(number), ' low'),
            number % 10 = 2, concat('motor ', toString(number), ' stalled'),
            number % 10 IN (3, 4), concat('tick ', toString(number)),
            concat('step ', toString(number), ' completed in 12 ms')),
    concat('{{"seq":', toString(number), '}}')
FROM numbers({LINES})
"""

# The search is a case-insensitive substring, so the n-gram index is on the lower-cased
# message and the query compares lower-cased text, which lets ClickHouse use the index.
TABLE = """
CREATE TABLE b.logs (
    ts DateTime64(3, 'UTC'),
    seq UInt64,
    level LowCardinality(String),
    module LowCardinality(String),
    message String,
    metadata String,
    INDEX text lower(message) TYPE ngrambf_v1(3, 65536, 3, 0) GRANULARITY 1
) ENGINE = MergeTree ORDER BY (ts, seq)
"""

rare_k = LINES // 2 + 7 - (LINES // 2 + 7) % 10 + 7
QUESTIONS = [
    ("level=warn&search=motor", "level = 'warn' AND lower(message) LIKE '%motor%'"),
    ("level=error (10 %)", "level = 'error'"),
    ("module=arm (25 %)", "module = 'arm'"),
    ("search=stalled (10 %)", "lower(message) LIKE '%stalled%'"),
    ("search, one line", f"lower(message) LIKE '%step {rare_k} %'"),
]


def main():
    with tempfile.TemporaryDirectory() as d:
        s = session.Session(d)
        s.query("CREATE DATABASE b")
        s.query(TABLE)
        t = time.perf_counter()
        s.query(LOAD)
        s.query("OPTIMIZE TABLE b.logs FINAL")
        print(f"chdb load: {LINES} lines in {time.perf_counter() - t:.1f} s", flush=True)
        for name, cond in QUESTIONS:
            page = (
                "SELECT ts, level, module, message, metadata FROM b.logs "
                f"WHERE {cond} ORDER BY ts, seq LIMIT 100"
            )
            count = f"SELECT count() FROM b.logs WHERE {cond}"
            times = []
            total = None
            for i in range(REPEATS):
                t = time.perf_counter()
                s.query(page, "JSONCompact")
                total = int(str(s.query(count, "CSV")).strip())
                if i > 0:
                    times.append((time.perf_counter() - t) * 1000)
            times.sort()
            p99 = times[min(len(times) - 1, round((len(times) - 1) * 0.99))]
            print(
                f"chdb {name}: total {total}, p50 {statistics.median(times):.1f} ms, "
                f"p99 {p99:.1f} ms",
                flush=True,
            )
        s.close()


main()
