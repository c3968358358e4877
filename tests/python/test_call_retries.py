"""Failed calls of a ``map_batches`` function, as a paid endpoint's user needs them handled:
a request the server refuses for its rows (a 400) is never sent again, a server that says
"slow down" (429 with ``Retry-After``) is left alone for as long as it asks and then probed
by one call, not by every call in flight; a transient failure that outlasts the retries
sets aside its batch whole, not in halves; an error names every attempt. Driven by the real
``openai`` client (and aiohttp, requests, urllib for the classification) against a local
OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import collections
import json
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests
from openai_server import ModelServer

import forebay
from forebay._call_errors import Failure, classify, parse_duration, server_wait

ROWS = 2_000
POISON = {7, 611, 1_503}


def texts(n: int, marked: dict[int, str] | None = None) -> list[str]:
    marked = marked or {}
    return [f"document {i} {marked.get(i, '')}".strip() for i in range(n)]


@pytest.fixture
def documents(tmp_path):
    path = tmp_path / "in.parquet"
    rows = texts(ROWS, {i: "POISON" for i in POISON})
    pq.write_table(pa.table({"id": range(ROWS), "text": rows}), path, row_group_size=500)
    return path


class Embed:
    """What a user writes: the real ``openai`` client, its own retries off (forebay's
    decide)."""

    def __init__(self, url: str) -> None:
        self.client = openai.AsyncOpenAI(base_url=url, api_key="test", max_retries=0)

    async def __call__(self, batch: pa.Table) -> dict[str, Any]:
        response = await self.client.embeddings.create(
            model="test-embedding", input=batch["text"].to_pylist()
        )
        return {"id": batch["id"], "dim0": [d.embedding[0] for d in response.data]}

    async def aclose(self) -> None:
        await self.client.close()


def embedded(path, server: ModelServer, **kwargs: Any):
    """The input at ``path`` through :class:`Embed` against ``server``."""
    return forebay.read_parquet(str(path)).map_batches(
        Embed, fn_constructor_args=(server.url,), **kwargs
    )


def errored(ds, stage: str = "map_batches(Embed)") -> dict[str, Any]:
    return next(s for s in ds.stats()["stages"] if s["name"] == stage)


def consume(ds) -> pa.Table:
    return pa.concat_tables(list(ds.iter_batches(batch_size=None)))


# ------------------------------------------------------------ what an exception says


def _raised(call) -> BaseException:
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the exception is the test's subject
        return error
    raise AssertionError("the call did not raise")


def test_the_exceptions_of_real_clients_are_classified_with_the_servers_wait():
    server = ModelServer(poison="POISON", unavailable="BUSY")
    with server:
        client = openai.OpenAI(base_url=server.url, api_key="test", max_retries=0)
        url = server.url + "/embeddings"

        def post(text: str) -> Any:
            return client.embeddings.create(model="m", input=[text])

        bad = _raised(lambda: post("a POISON row"))
        busy = _raised(lambda: post("BUSY"))
        assert isinstance(bad, openai.BadRequestError)
        assert classify(bad) is Failure.ROW
        assert isinstance(busy, openai.InternalServerError)
        assert classify(busy) is Failure.TRANSIENT and server_wait(busy) is None

        def with_requests(text: str) -> None:
            requests.post(url, json={"input": [text]}, timeout=10).raise_for_status()

        assert classify(_raised(lambda: with_requests("POISON"))) is Failure.ROW
        assert classify(_raised(lambda: with_requests("BUSY"))) is Failure.TRANSIENT

        def with_urllib(text: str) -> None:
            body = json.dumps({"input": [text]}).encode()
            request = urllib.request.Request(url, body, {"content-type": "application/json"})
            urllib.request.urlopen(request, timeout=10)

        refused = _raised(lambda: with_urllib("POISON"))
        assert isinstance(refused, urllib.error.HTTPError)
        assert classify(refused) is Failure.ROW

        async def with_aiohttp(text: str) -> None:
            async with (
                aiohttp.ClientSession() as session,
                session.post(url, json={"input": [text]}) as response,
            ):
                response.raise_for_status()

        assert classify(_raised(lambda: asyncio.run(with_aiohttp("BUSY")))) is Failure.TRANSIENT

    server = ModelServer(storm=(0.0, 60.0, 1.5))
    with server:
        client = openai.OpenAI(base_url=server.url, api_key="test", max_retries=0)
        limited = _raised(lambda: client.embeddings.create(model="m", input=["x"]))
        assert isinstance(limited, openai.RateLimitError)
        assert classify(limited) is Failure.TRANSIENT
        assert server_wait(limited) == 1.5
    # The server is gone: a refused connection is the network's, not the row's.
    gone = _raised(lambda: client.embeddings.create(model="m", input=["x"]))
    assert isinstance(gone, openai.APIConnectionError)
    assert classify(gone) is Failure.TRANSIENT
    assert classify(ValueError("a bug")) is Failure.UNKNOWN
    assert classify(forebay.RowError("too long")) is Failure.ROW
    assert classify(forebay.TransientError("busy", retry_after=2)) is Failure.TRANSIENT


class _Answer(Exception):
    def __init__(self, status: int, headers: dict[str, str]) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code, self.headers = status, headers


@pytest.mark.parametrize(
    ("status", "headers", "kind", "wait"),
    [
        (429, {"retry-after-ms": "250", "retry-after": "9"}, Failure.TRANSIENT, 0.25),
        (429, {"retry-after": "Wed, 02 Dec 2026 12:00:30 GMT"}, Failure.TRANSIENT, 30.0),
        (
            429,
            {
                "x-ratelimit-remaining-requests": "12",
                "x-ratelimit-reset-requests": "1s",
                "x-ratelimit-remaining-tokens": "0",
                "x-ratelimit-reset-tokens": "6m0.5s",
            },
            Failure.TRANSIENT,
            360.5,
        ),
        (503, {"x-ratelimit-reset-tokens": "20ms"}, Failure.TRANSIENT, None),
        (400, {"x-should-retry": "true"}, Failure.TRANSIENT, None),
        (500, {"x-should-retry": "false"}, Failure.ROW, None),
        (408, {}, Failure.TRANSIENT, None),
        (422, {}, Failure.ROW, None),
        (304, {}, Failure.UNKNOWN, None),
    ],
)
def test_statuses_and_headers(status, headers, kind, wait):
    error = _Answer(status, headers)
    assert classify(error) is kind
    noon = 1_796_212_800.0  # 2026-12-02 12:00:00 UTC
    assert server_wait(error, now=noon) == wait


def test_durations_as_servers_write_them():
    assert parse_duration("20ms") == pytest.approx(0.02)
    assert parse_duration("1h2m3.5s") == pytest.approx(3723.5)
    assert parse_duration("7") == 7.0
    assert parse_duration("soon") is None
    assert parse_duration("5s later") is None


# ------------------------------------------------------------ a run against the server


def test_a_refused_row_is_never_sent_again_and_a_rate_limit_is_waited_out_by_one_probe(
    documents,
):
    # Every request 429s for a second, a while into the run, asking for 0.25 s.
    server = ModelServer(latency=0.02, poison="POISON", storm=(0.15, 1.0, 0.25))
    in_flight = 16
    with server:
        ds = embedded(
            documents,
            server,
            batch_size=8,
            max_concurrency=in_flight,
            max_retries=50,
            on_error="skip",
        )
        out = consume(ds)
    assert sorted(out["id"].to_pylist()) == sorted(set(range(ROWS)) - POISON)
    stage = errored(ds)
    assert sorted(e["row"] for e in stage["errored"]) == sorted(POISON)
    assert all(e["error_type"] == "BadRequestError" for e in stage["errored"])
    statuses = server.statuses()
    assert statuses.get(429, 0) > 0, "the storm was not met"
    # A 400 is the rows': no request that got one is made again (a retry repeats it).
    refused = collections.Counter(r.inputs for r in server.log if r.status == 400)
    assert refused and max(refused.values()) == 1, refused.most_common(3)
    # The calls in flight when the storm began get their 429; after that one call at a
    # time goes, once per wait asked (1 s / 0.25 s), not every call in flight.
    assert statuses[429] <= in_flight + 1.0 / 0.25 + 6, statuses


def test_a_transient_failure_that_outlasts_the_retries_sets_its_batch_aside_whole(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"id": range(400), "text": texts(400, {55: "BUSY", 301: "BUSY"})}), path
    )
    server = ModelServer(unavailable="BUSY")
    with server:
        ds = embedded(
            path, server, batch_size=10, max_concurrency=4, max_retries=2, on_error="skip"
        )
        out = consume(ds)
    aside = set(range(50, 60)) | set(range(300, 310))
    assert sorted(out["id"].to_pylist()) == sorted(set(range(400)) - aside)
    stage = errored(ds)
    assert stage["rows_errored"] == 20
    assert sorted(e["row"] for e in stage["errored"]) == sorted(aside)
    message = stage["errored"][0]["message"]
    assert "earlier attempts of this call (2)" in message, message
    assert message.count("503") == 3, message
    # Each failing batch was asked for 1 + 2 times, never in halves.
    busy = collections.Counter(r.inputs for r in server.log if r.status == 503)
    assert sorted(len(inputs) for inputs in busy) == [10, 10]
    assert sorted(busy.values()) == [3, 3]


def test_retry_deadline_ends_the_retries_of_a_server_that_keeps_refusing(documents):
    server = ModelServer(storm=(0.0, 3600.0, 0.2))
    with server:
        ds = embedded(
            documents,
            server,
            batch_size=100,
            max_concurrency=8,
            max_retries=1_000,
            retry_deadline=1.0,
        )
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError) as raised:
            consume(ds)
        took = time.monotonic() - started
    assert took < 20, took
    assert any("earlier attempts of this call" in n for n in raised.value.__notes__)
    # 8 in flight at first, then one probe per 0.2 s: not 8 per 0.2 s.
    assert len(server.log) <= 8 + took / 0.2 + 6, (len(server.log), took)


def test_a_row_error_is_not_retried_and_a_transient_error_waits_as_asked(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": range(40)}), path)
    calls: list[tuple[float, tuple[int, ...]]] = []

    async def model(batch):
        ids = tuple(batch["id"].to_pylist())
        calls.append((time.monotonic(), ids))
        if 13 in ids:
            raise forebay.RowError("row 13 is too long")
        if 30 in ids and sum(1 for _, c in calls if c == ids) == 1:
            raise forebay.TransientError("quota resets", retry_after=0.3)
        return batch

    ds = forebay.read_parquet(str(path)).map_batches(
        model, batch_size=10, max_retries=5, on_error="skip"
    )
    out = consume(ds)
    assert sorted(out["id"].to_pylist()) == sorted(set(range(40)) - {13})
    per_call = collections.Counter(ids for _, ids in calls)
    assert per_call[(13,)] == 1, "a row error is set aside at once"
    assert max(n for ids, n in per_call.items() if 13 in ids) == 1
    retried = [at for at, ids in calls if ids == tuple(range(30, 40))]
    assert len(retried) == 2 and retried[1] - retried[0] >= 0.3


def test_a_transient_error_of_a_plain_function_sets_its_batch_aside_unhalved(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": range(40)}), path)
    calls: list[int] = []

    def model(batch):
        calls.append(batch.num_rows)
        if 25 in batch["id"].to_pylist():
            raise forebay.TransientError("rate limited")
        return batch

    ds = forebay.read_parquet(str(path)).map_batches(model, batch_size=10, on_error="skip")
    out = consume(ds)
    assert sorted(out["id"].to_pylist()) == sorted(set(range(40)) - set(range(20, 30)))
    assert sorted(calls) == [10, 10, 10, 10], "no halves of the failing batch"


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0, ValueError, "retry_deadline must be more than 0"),
        ("1", TypeError, "retry_deadline must be a number"),
    ],
)
def test_wrong_retry_deadlines_are_clear_errors(documents, value, error, message):
    async def f(batch):
        return batch

    with pytest.raises(error, match=message):
        forebay.read_parquet(str(documents)).map_batches(f, retry_deadline=value)
    with pytest.raises(ValueError, match="apply to async functions"):
        forebay.read_parquet(str(documents)).map_batches(lambda b: b, retry_deadline=1)


@pytest.mark.parametrize("tell_wait", [False, True])
def test_a_server_admitting_fewer_calls_a_second_gets_few_more_requests_than_calls(
    tmp_path, tell_wait
):
    # 100 calls to a server taking 50 a second (one second's worth of burst), 32 in flight:
    # retrying calls on their own sends it two to three requests a call.
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": range(800), "text": texts(800)}), path)
    server = ModelServer(latency=0.02, requests_per_second=50.0, tell_wait=tell_wait)
    with server:
        ds = embedded(path, server, batch_size=8, max_concurrency=32, max_retries=20)
        assert sorted(consume(ds)["id"].to_pylist()) == list(range(800))
    statuses = server.statuses()
    assert statuses[200] == 100
    assert statuses.get(429, 0) <= 40, statuses


@pytest.mark.parametrize(("throttled", "narrows_below"), [(0.01, None), (0.05, 128), (0.9, 2)])
def test_the_window_of_calls_keeps_its_width_under_random_refusals_and_narrows_under_many(
    throttled, narrows_below
):
    # Both steps are a share of 1/window: below 2 % of answers throttled the window only
    # grows back; above, it narrows the faster the more are.
    import random

    from forebay._admission import Admission

    loop = asyncio.new_event_loop()
    try:
        admission, rng = Admission(loop, 256), random.Random(7)
        narrowest = 256.0
        for answer in range(20_000):
            admission.active = 1  # an attempt, answered now
            if rng.random() < throttled:
                admission.failed(throttled=True)
            else:
                admission.succeeded()
            if answer >= 1_000:
                narrowest = min(narrowest, admission.window)
        if narrows_below is not None:
            assert admission.window < narrows_below, admission.window
        else:
            assert narrowest > 250, narrowest
    finally:
        loop.close()
