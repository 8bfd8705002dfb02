"""One contract, every backend: the local directory, memory, and real S3 servers (SeaweedFS, moto)."""

from __future__ import annotations

import multiprocessing
import random
import threading
import uuid

import pytest

from orchestrator.core.store import InvalidKey, NotFound, PreconditionFailed, StoreError, open_store
from orchestrator.core.store.memory import MemoryStore
from tests.support.s3servers import make_store_uri

#: The S3 servers are slow (a server, requests over HTTP): out of the fast tier.
BACKENDS = [
    "local",
    "memory",
    pytest.param("seaweedfs", marks=pytest.mark.slow),
    pytest.param("moto", marks=pytest.mark.slow),
]


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    if request.param == "memory":
        return MemoryStore()
    return open_store(make_store_uri(request.param, request, tmp_path))


def test_store_put_then_get_returns_bytes_and_etag(store):
    etag = store.put("a/b.json", b"hello")
    blob = store.get("a/b.json")
    assert blob.data == b"hello"
    assert blob.etag == etag
    assert store.put("a/b.json", b"world") != etag
    assert store.get("a/b.json").data == b"world"


def test_store_missing_key_is_not_found_everywhere(store):
    with pytest.raises(NotFound):
        store.get("nope/x")
    with pytest.raises(NotFound), store.open("nope/x"):
        pass
    assert store.head("nope/x") is None
    store.delete("nope/x")  # deleting an absent key is fine


def test_store_head_gives_size(store):
    store.put("h/one", b"12345")
    info = store.head("h/one")
    assert info is not None and info.key == "h/one" and info.size == 5 and info.modified > 0


def test_store_put_if_absent_creates_once(store):
    etag = store.put_if_absent("lease/c1", b"first")
    assert store.get("lease/c1").etag == etag
    with pytest.raises(PreconditionFailed):
        store.put_if_absent("lease/c1", b"second")
    assert store.get("lease/c1").data == b"first"


def test_store_compare_and_swap_needs_the_current_etag(store):
    etag = store.put("cas/k", b"v1")
    etag2 = store.compare_and_swap("cas/k", b"v2", etag)
    assert store.get("cas/k").data == b"v2"
    with pytest.raises(PreconditionFailed):
        store.compare_and_swap("cas/k", b"v3", etag)  # stale
    assert store.get("cas/k").data == b"v2"
    store.compare_and_swap("cas/k", b"v3", etag2)
    assert store.get("cas/k").data == b"v3"


def test_store_compare_and_swap_on_missing_key_fails(store):
    with pytest.raises(PreconditionFailed):
        store.compare_and_swap("cas/missing", b"v", "some-etag")


def _keys(store, prefix):
    # The order of a listing is not part of the contract: SeaweedFS lists directory by directory
    # ("p/a/1" before "p/a-1"), where AWS gives byte order. Callers sort what they need sorted.
    keys = [o.key for o in store.list(prefix)]
    assert len(keys) == len(set(keys)), "a key listed twice"
    return sorted(keys)


def test_store_list_gives_every_key_under_the_prefix_once(store):
    for key in ["p/b", "p/a-1", "p/a/2", "p/a/1", "q/a", "pz"]:
        store.put(key, key.encode())
    assert _keys(store, "p/") == ["p/a-1", "p/a/1", "p/a/2", "p/b"]
    assert _keys(store, "p/a") == ["p/a-1", "p/a/1", "p/a/2"]
    assert _keys(store, "p/a/") == ["p/a/1", "p/a/2"]
    assert _keys(store, "nothing/") == []
    assert {o.key: o.size for o in store.list("q/")} == {"q/a": 3}


def test_store_list_starts_after_a_key_on_a_flat_prefix(store):
    for i in [5, 1, 3, 2, 4]:
        store.put(f"flat/{i:04d}-x", b"")
    assert _keys(store, "flat/") == [f"flat/{i:04d}-x" for i in range(1, 6)]
    assert _keys_after(store, "flat/", "flat/0002-x") == ["flat/0003-x", "flat/0004-x", "flat/0005-x"]
    assert _keys_after(store, "flat/", "flat/0003") == ["flat/0003-x", "flat/0004-x", "flat/0005-x"]
    assert _keys_after(store, "flat/", "flat/0009") == []


def _keys_after(store, prefix, start_after):
    return sorted(o.key for o in store.list(prefix, start_after=start_after))


def test_store_list_pages_through_more_than_one_thousand_keys(store):
    for i in range(1005):
        store.put(f"many/{i:05d}", b"x")
    store.requests.reset()
    assert _keys(store, "many/") == [f"many/{i:05d}" for i in range(1005)]
    assert store.requests.by_op["list"] == 2


def test_store_delete_removes_key(store):
    store.put("d/k", b"x")
    store.delete("d/k")
    assert store.head("d/k") is None
    assert list(store.list("d/")) == []


def test_store_streams_large_objects_line_by_line(store, tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        for i in range(60_000):
            f.write(f'{{"i": {i}, "pad": "{"x" * 80}"}}\n')
    store.put_file("big/chunk.jsonl", str(path))
    with store.open("big/chunk.jsonl") as f:
        count = sum(1 for _ in f)
    assert count == 60_000
    assert store.head("big/chunk.jsonl").size == path.stat().st_size


@pytest.mark.parametrize("key", ["/abs", "a/../b", "a//b", "", "a/", "./a"])
def test_store_rejects_keys_that_escape_or_are_ambiguous(store, key):
    with pytest.raises(InvalidKey):
        store.put(key, b"x")


def test_store_key_limit_counts_utf8_bytes_not_characters():
    # 300 characters of 4 bytes each (1,200 bytes) are too long; 256 of them (1,024 bytes) are not.
    store = MemoryStore()  # a file system limits each path segment further
    with pytest.raises(InvalidKey):
        store.put("\U0001f600" * 300, b"x")
    store.put("\U0001f600" * 256, b"x")
    store.put("a" * 1024, b"x")
    with pytest.raises(InvalidKey):
        store.put("a" * 1025, b"x")


def test_store_put_if_absent_race_has_exactly_one_winner(store):
    winners, barrier = [], threading.Barrier(8)

    def racer(i: int) -> None:
        barrier.wait()
        try:
            store.put_if_absent("race/one", f"worker-{i}".encode())
            winners.append(i)
        except PreconditionFailed:
            pass

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert store.get("race/one").data == f"worker-{winners[0]}".encode()


def test_store_compare_and_swap_loses_no_update_under_contention(store):
    store.put("race/counter", b"0")
    per_thread, threads_n = 10, 6

    def incrementer(i: int) -> None:
        done = 0
        while done < per_thread:
            blob = store.get("race/counter")
            value = int(blob.data.split(b":")[0])
            # Unique bytes per write, as the contract asks of conditional writers.
            try:
                store.compare_and_swap("race/counter", f"{value + 1}:{i}:{uuid.uuid4().hex}".encode(), blob.etag)
                done += 1
            except PreconditionFailed:
                continue

    threads = [threading.Thread(target=incrementer, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert int(store.get("race/counter").data.split(b":")[0]) == per_thread * threads_n


def _process_racer(root: str, i: int, barrier, results) -> None:
    store = open_store(root)
    barrier.wait()
    try:
        store.put_if_absent("race/proc", f"p{i}".encode())
        results.put(i)
    except PreconditionFailed:
        pass


def test_local_store_put_if_absent_race_across_processes(tmp_path):
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_process_racer, args=(str(tmp_path), i, barrier, results)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    winners = []
    while not results.empty():
        winners.append(results.get())
    assert len(winners) == 1
    assert open_store(str(tmp_path)).get("race/proc").data == f"p{winners[0]}".encode()


def test_local_store_hides_its_own_bookkeeping(tmp_path):
    store = open_store(str(tmp_path))
    store.put("a", b"1")
    store.put_if_absent("b", b"2")
    assert [o.key for o in store.list("")] == ["a", "b"]
    with pytest.raises(InvalidKey):
        store.put(".orch-locks/x", b"x")


def test_open_store_picks_backend_from_uri(tmp_path, monkeypatch):
    monkeypatch.delenv("R2_ACCOUNT_ID", raising=False)
    monkeypatch.delenv("R2_ENDPOINT_URL", raising=False)
    assert type(open_store(str(tmp_path))).__name__ == "LocalStore"
    assert type(open_store(f"file://{tmp_path}")).__name__ == "LocalStore"
    assert type(open_store("s3://bucket/prefix?endpoint=http://127.0.0.1:9")).__name__ == "S3Store"
    with pytest.raises(StoreError, match="no R2 endpoint") as err:
        open_store("r2://bucket/prefix")
    assert "R2_ACCOUNT_ID" in err.value.hint
    with pytest.raises(Exception, match="unsupported store URI"):
        open_store("ftp://x/y")


def test_r2_store_endpoint_comes_from_account_id(monkeypatch):
    monkeypatch.delenv("R2_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("R2_ACCOUNT_ID", "abc123")
    store = open_store("r2://bucket/runs")
    assert store.endpoint_url == "https://abc123.r2.cloudflarestorage.com"
    assert store.uri == "r2://bucket/runs"


def test_memory_store_entry_blocks_stay_sorted_under_writes_rewrites_and_deletes(monkeypatch):
    from orchestrator.core.store.base import ObjectInfo
    from orchestrator.core.store.memory import _SortedEntries

    monkeypatch.setattr(_SortedEntries, "BLOCK", 4)  # many small blocks: splits and empty blocks happen
    rng, entries, ref = random.Random(1), _SortedEntries(), {}
    for step in range(20000):
        key = f"k{rng.randint(0, 3000):05d}" + ("\U0010ffff" if rng.random() < 0.05 else "")
        if key in ref and rng.random() < 0.5:
            entries.remove(key)
            del ref[key]
        else:  # a new key, or a rewrite: the listing shows the newest entry
            entries.put(ObjectInfo(key, step, float(step)))
            ref[key] = step
        if step % 997 == 0:
            start = f"k{rng.randint(0, 3000):05d}"
            for prefix in (start[:4], start[:3], "k", start):
                inside = sorted((k, n) for k, n in ref.items() if k.startswith(prefix))
                listed = [(e.key, e.size) for e in entries.with_prefix(prefix, start, inclusive=True)]
                assert listed == [(k, n) for k, n in inside if k >= start]
                listed = [(e.key, e.size) for e in entries.with_prefix(prefix, start, inclusive=False)]
                assert listed == [(k, n) for k, n in inside if k > start]
