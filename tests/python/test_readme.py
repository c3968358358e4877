"""The README's Python snippets run as written, each as a script of its own, in a venv that
holds only the wheel's declared dependencies (``make wheel-check`` builds it; the Ray
snippet needs the ``forebay[ray]`` extra and runs in the dev venv). ``s3://bucket/...`` is a
moto server started here, reached through the ``AWS_*`` environment a user's own credentials
would come from; ``data/`` is a local directory in the script's working directory."""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import moto_s3

pytest.importorskip("moto")

ROOT = Path(__file__).resolve().parents[2]
SMOKE_PYTHON = ROOT / "target" / "smoke-venv" / "bin" / "python"


def snippets() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def documents(n: int, first: int = 0) -> pa.Table:
    ids = np.arange(first, first + n)
    return pa.table({"id": ids, "text": [f"document {i} " * (i % 5 + 1) for i in ids]})


def lineitem(n: int) -> pa.Table:
    days = np.arange(n) % 2_500
    return pa.table(
        {
            "l_orderkey": np.arange(n),
            "l_extendedprice": np.arange(n) * 1.5,
            "l_shipdate": pa.array([dt.date(1992, 1, 1) + dt.timedelta(int(d)) for d in days]),
        }
    )


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """The bucket the snippets name, with their inputs; yields the environment to run in."""
    with moto_s3(tmp_path_factory.mktemp("moto-readme") / "moto.log") as (client, endpoint):
        client.create_bucket(Bucket="bucket")

        def put(key: str, table: pa.Table) -> None:
            buf = io.BytesIO()
            pq.write_table(table, buf, row_group_size=5_000)
            client.put_object(Bucket="bucket", Key=key, Body=buf.getvalue())

        for k in range(3):
            put(f"documents/part-{k}.parquet", documents(10_000, k * 10_000))
            put(f"docs/part-{k}.parquet", documents(5_000, k * 5_000))
            put(f"inputs/part-{k}.parquet", documents(5_000, k * 5_000))
        put("lineitem/part-0.parquet", lineitem(20_000))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION="us-east-1",
            AWS_ALLOW_HTTP="true",
        )
        yield client, env


SNIPPETS = snippets()


def test_the_readme_has_its_snippets() -> None:
    assert len(SNIPPETS) >= 7
    assert "forebay.Checkpoint" in SNIPPETS[0]


@pytest.mark.parametrize("index", range(len(SNIPPETS)), ids=lambda i: f"snippet-{i + 1}")
def test_a_readme_snippet_runs_as_a_script(bucket, tmp_path: Path, index: int) -> None:
    client, env = bucket
    code = SNIPPETS[index]
    (tmp_path / "data").mkdir()
    pq.write_table(documents(20_000), tmp_path / "data" / "part-0.parquet")
    script = tmp_path / "snippet.py"
    script.write_text(code)
    needs_ray = "forebay.ray" in code
    if needs_ray:
        python = sys.executable  # the [ray] extra: the dev venv has it
    else:
        python = str(SMOKE_PYTHON) if SMOKE_PYTHON.exists() else sys.executable
    run = subprocess.run(
        [python, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"snippet {index + 1}:\n{code}\n{run.stderr[-3000:]}"
    if index == 0:
        # The headline job wrote every document once.
        keys = client.list_objects_v2(Bucket="bucket", Prefix="embeddings/")["Contents"]
        ids = []
        for key in (k["Key"] for k in keys):
            if key.endswith(".parquet") and "/_" not in key:
                body = client.get_object(Bucket="bucket", Key=key)["Body"].read()
                ids.extend(pq.read_table(pa.BufferReader(body), columns=["id"])["id"].to_pylist())
        assert sorted(ids) == list(range(30_000))
